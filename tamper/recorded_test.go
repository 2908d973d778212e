package tamper

import (
	"maps"
	"strings"
	"testing"
)

const recordedFile = `# written at provisioning
root 4392712BA01368efdf14b05c76f9e4df0d53664630b5d48632ed17a137f39076

usr  9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
`

func TestParseRecorded(t *testing.T) {
	got, err := ParseRecorded(strings.NewReader(recordedFile))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"root": "4392712ba01368efdf14b05c76f9e4df0d53664630b5d48632ed17a137f39076",
		"usr":  "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	empty, err := ParseRecorded(strings.NewReader("# nothing sealed\n"))
	if err != nil || len(empty) != 0 {
		t.Errorf("comments only: %v %v", empty, err)
	}
}

func TestParseRecordedRejects(t *testing.T) {
	const h = "4392712ba01368efdf14b05c76f9e4df0d53664630b5d48632ed17a137f39076"
	for _, tc := range []struct{ in, want string }{
		{"root\n", `line 1: want "<layer> <root-hash>", got 1 fields`},
		{"root " + h + " extra\n", "got 3 fields"},
		{"# c\nroot xyz\n", "line 2: layer root: \"xyz\" is not a hex digest"},
		{"a/b " + h + "\n", `"a/b" is not a device-mapper name`},
		{"root " + h + "\nroot " + h + "\n", "line 2: layer root is listed twice"},
		{strings.Repeat("x", maxRecorded+1), "larger than"},
	} {
		_, err := ParseRecorded(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRecorded(%.40q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseRecorded(f *testing.F) {
	f.Add(recordedFile)
	f.Add("root 00\n")
	f.Add("# x\n\n\troot\t4392712ba01368efdf14b05c76f9e4df\r\n")
	f.Fuzz(func(t *testing.T, in string) {
		m, err := ParseRecorded(strings.NewReader(in))
		if err != nil {
			return
		}
		for l, h := range m {
			if !validLayerName(l) || h != strings.ToLower(h) || len(h) < 32 {
				t.Errorf("accepted layer %q hash %q", l, h)
			}
		}
	})
}
