package hostio

import (
	"slices"
	"strings"
	"testing"
)

// The parameters of a verity target as the kernel reports its table
// (dmsetup table prints them after "<start> <length> verity"); the example
// of Documentation/admin-guide/device-mapper/verity.rst, with the devices as
// the kernel prints them (major:minor).
const verityLine = "1 8:17 8:33 4096 4096 262144 1 sha256 4392712ba01368efdf14b05c76f9e4df0d53664630b5d48632ed17a137f39076 1234000000000000000000000000000000000000000000000000000000000000"

func TestParseVerityTable(t *testing.T) {
	got, err := ParseVerityTable(verityLine)
	if err != nil {
		t.Fatal(err)
	}
	want := VerityTable{Version: 1, DataDev: "8:17", HashDev: "8:33", DataBlockSize: 4096, HashBlockSize: 4096,
		NumDataBlocks: 262144, HashStart: 1, Algorithm: "sha256",
		RootHash: "4392712ba01368efdf14b05c76f9e4df0d53664630b5d48632ed17a137f39076",
		Salt:     "1234000000000000000000000000000000000000000000000000000000000000"}
	if !equalTable(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	opt, err := ParseVerityTable(strings.Replace(verityLine, "1234000000000000000000000000000000000000000000000000000000000000", "- 2 restart_on_corruption ignore_zero_blocks", 1))
	if err != nil {
		t.Fatal(err)
	}
	if opt.Salt != "-" || !slices.Equal(opt.Options, []string{"restart_on_corruption", "ignore_zero_blocks"}) {
		t.Errorf("with options: %+v", opt)
	}
	upper, err := ParseVerityTable(strings.ToUpper(verityLine[:30]) + verityLine[30:])
	if err != nil || upper.Algorithm != "sha256" {
		t.Errorf("upper-case prefix: %+v %v", upper, err)
	}
}

func equalTable(a, b VerityTable) bool {
	return a.Version == b.Version && a.DataDev == b.DataDev && a.HashDev == b.HashDev && a.DataBlockSize == b.DataBlockSize &&
		a.HashBlockSize == b.HashBlockSize && a.NumDataBlocks == b.NumDataBlocks && a.HashStart == b.HashStart &&
		a.Algorithm == b.Algorithm && a.RootHash == b.RootHash && a.Salt == b.Salt && slices.Equal(a.Options, b.Options)
}

func TestParseVerityTableRejects(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"", "0 fields, want at least 10"},
		{"1 8:17 8:33 4096 4096 262144 1 sha256 4392712b", "9 fields"},
		{strings.Replace(verityLine, "262144", "-1", 1), `number of data blocks "-1" is not a number`},
		{"2" + verityLine[1:], "unknown version 2"},
		{strings.Replace(verityLine, "4392712ba0", "zz92712ba0", 1), "root hash"},
		{strings.Replace(verityLine, "1234000000", "12340000xx", 1), "salt"},
		{verityLine + " 2 restart_on_corruption", "1 optional parameters after the count \"2\""},
		{verityLine + " x", "after the count \"x\""},
	} {
		_, err := ParseVerityTable(tc.line)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseVerityTable(%q) = %v, want an error containing %q", tc.line, err, tc.want)
		}
	}
}

func FuzzParseVerityTable(f *testing.F) {
	f.Add(verityLine)
	f.Add(verityLine + " 1 ignore_corruption")
	f.Add("0 253:0 253:1 512 4096 8 0 sha1 0123456789abcdef0123456789abcdef01234567 -")
	f.Fuzz(func(t *testing.T, line string) {
		v, err := ParseVerityTable(line)
		if err != nil {
			return
		}
		if v.RootHash != strings.ToLower(v.RootHash) || len(v.RootHash) < 32 {
			t.Errorf("root hash %q accepted", v.RootHash)
		}
		if v.Version > 1 {
			t.Errorf("version %d accepted", v.Version)
		}
	})
}
