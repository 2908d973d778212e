package kmsg

import (
	"errors"
	"testing"
)

func TestParseRecord(t *testing.T) {
	for _, tc := range []struct {
		in        string
		fac, lvl  uint8
		seq, usec uint64
		cont      bool
		msg       string
	}{
		{"3,379,3463590,-;device-mapper: verity: 7:1: data block 5 is corrupted\n", 0, 3, 379, 3463590, false, "device-mapper: verity: 7:1: data block 5 is corrupted"},
		{"6,399,6531168,-;task:kubelet state:D\n SUBSYSTEM=block\n DEVICE=b8:0\n", 0, 6, 399, 6531168, false, "task:kubelet state:D"},
		{"12,341,2135024265,-;kt-test hello\\x5cx01 \n", 1, 4, 341, 2135024265, false, `kt-test hello\x5cx01 `},
		{"4,5,6,c;fragment", 0, 4, 5, 6, true, "fragment"},
		{"30,1,2,-,caller=T1;with caller id\n", 3, 6, 1, 2, false, "with caller id"},
		{"0,0,0,-;\n", 0, 0, 0, 0, false, ""},
	} {
		r, err := ParseRecord([]byte(tc.in))
		if err != nil {
			t.Errorf("ParseRecord(%q): %v", tc.in, err)
			continue
		}
		if r.Facility != tc.fac || r.Level != tc.lvl || r.Seq != tc.seq || r.Usec != tc.usec || r.Cont != tc.cont || string(r.Message) != tc.msg {
			t.Errorf("ParseRecord(%q) = %+v (msg %q)", tc.in, r, r.Message)
		}
	}
	for _, bad := range []string{"", "no semicolon", "3,379;msg", "x,1,2,-;m", "3,-1,2,-;m", "3,1,2,;m", "99999,1,2,-;m", "3,1,99999999999999999999999,-;m", "3,1,2;m"} {
		if _, err := ParseRecord([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseRecord(%q) err = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:            "plain",
		`a\x5cb`:           `a\b`,
		`tab\x09here`:      "tab\there",
		`utf8 \xc3\xa9`:    "utf8 é",
		`bad \xZZ and \x4`: `bad \xZZ and \x4`,
		`trailing \`:       `trailing \`,
		`\x41\x42`:         "AB",
	} {
		if got := string(Unescape(nil, []byte(in))); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseLineFormats(t *testing.T) {
	for _, tc := range []struct {
		in      string
		msg     string
		usec    uint64
		hasTime bool
		skip    bool
	}{
		{"3,396,6530965,-;INFO: task kubelet:128 blocked for more than 1 seconds.", "INFO: task kubelet:128 blocked for more than 1 seconds.", 6530965, true, false},
		{"[    6.530965] INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 6530965, true, false},
		{"<3>[    6.530965] INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 6530965, true, false},
		{"[    6.530965] node-1 kernel: INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 6530965, true, false},
		{"Dec 02 10:00:00 node-1 kernel: EXT4-fs (sda1): Remounting filesystem read-only", "EXT4-fs (sda1): Remounting filesystem read-only", 0, false, false},
		{"EXT4-fs (sda1): Remounting filesystem read-only", "EXT4-fs (sda1): Remounting filesystem read-only", 0, false, false},
		{" __schedule+0x34d/0xa00", " __schedule+0x34d/0xa00", 0, false, false},
		{" SUBSYSTEM=block", "", 0, false, true},
		{"   ", "", 0, false, true},
		{"[    6.5309650] x\r\n", "x", 6530965, true, false},
	} {
		r, ht, skip := ParseLine([]byte(tc.in))
		if skip != tc.skip || (!skip && (string(r.Message) != tc.msg || ht != tc.hasTime || r.Usec != tc.usec)) {
			t.Errorf("ParseLine(%q) = %q usec %d time %v skip %v", tc.in, r.Message, r.Usec, ht, skip)
		}
	}
}

func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"3,379,3463590,-;device-mapper: verity: 7:1: data block 5 is corrupted\n", "6,399,6531168,-;x\n SUBSYSTEM=block\n", "4,5,6,c;fragment", "0,0,0,-;"} {
		f.Add([]byte(s))
	}
	rs, _ := Compile(DefaultRules, DefaultCriticalTasks)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRecord(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if r.Level > 7 {
			t.Fatalf("level %d", r.Level)
		}
		rs.Matches(nil, Unescape(nil, r.Message))
	})
}

func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"[    6.530965] node-1 kernel: INFO: task kubelet:128 blocked", "<3>[ 1.0] x", "3,1,2,-;m", "Dec 02 10:00:00 h kernel: m", " KEY=v"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, _, skip := ParseLine(b)
		if !skip && len(r.Message) > len(b) {
			t.Fatal("message longer than the line")
		}
	})
}
