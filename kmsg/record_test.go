package kmsg

import (
	"errors"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
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
		in   string
		msg  string
		usec uint64
		time TimeKind
		form Form
		skip bool
	}{
		{"3,396,6530965,-;INFO: task kubelet:128 blocked for more than 1 seconds.", "INFO: task kubelet:128 blocked for more than 1 seconds.", 6530965, Monotonic, FormKmsg, false},
		{"[    6.530965] INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 6530965, Monotonic, FormDmesg, false},
		{"<3>[    6.530965] INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 6530965, Monotonic, FormDmesgRaw, false},
		{"[    6.530965] node-1 kernel: INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 6530965, Monotonic, FormJournalMono, false},
		// journalctl -o short-delta: the first entry's delta is spaces.
		{"[51476.597414                ] vm kernel: INFO: task kubelet:128 blocked", "INFO: task kubelet:128 blocked", 51476597414, Monotonic, FormJournalDelta, false},
		{"[51494.298964 <    0.003653 >] vm unknown: EXT4-fs (sda1): Remounting filesystem read-only", "EXT4-fs (sda1): Remounting filesystem read-only", 51494298964, Monotonic, FormJournalDelta, false},
		{"[51494.298964 <    0.003653 >] kernel: x", "x", 51494298964, Monotonic, FormJournalDelta, false},
		// A dmesg line whose message looks like "word word: " keeps it.
		{"[    2.000001] usb 1-1: new high-speed USB device number 2", "usb 1-1: new high-speed USB device number 2", 2000001, Monotonic, FormDmesg, false},
		// Forms without a year count from 1970.
		{"Dec 02 10:00:00 node-1 kernel: EXT4-fs (sda1): Remounting filesystem read-only", "EXT4-fs (sda1): Remounting filesystem read-only", 28980000000000, Wall, FormJournalShort, false},
		// journalctl --no-hostname: the ident alone.
		{"Dec 02 10:00:00 kernel: INFO: task x:1 blocked", "INFO: task x:1 blocked", 28980000000000, Wall, FormJournalShort, false},
		{"Dec  2 10:00:00.000001 h kernel: m", "m", 28980000000001, Wall, FormJournalPrecise, false},
		{"2026-12-02T19:07:04+0100 vm kernel: m", "m", 1796234824000000, Wall, FormJournalISO, false},
		{"2026-12-02T19:07:04.278559+0000 vm systemd-journald[72]: m", "m", 1796238424278559, Wall, FormJournalISOPrec, false},
		{"Wed 2026-12-02 19:07:04 UTC vm kernel: m", "m", 1796238424000000, Wall, FormJournalFull, false},
		{"1796238424.278559 vm kernel: m", "m", 1796238424278559, Wall, FormJournalUnix, false},
		{"[Wed Dec  2 19:07:01 2026] m", "m", 1796238421000000, Wall, FormDmesgCtime, false},
		{"kern  :warn  : [Wed Dec  2 19:07:01 2026] m", "m", 1796238421000000, Wall, FormDmesgCtime + " -x", false},
		{"kern  :info  : [    6.530965] m", "m", 6530965, Monotonic, FormDmesg + " -x", false},
		{"kern  :info  : m", "m", 0, NoTime, FormDmesg + " -x", false},
		{"2026-12-02T19:07:01,061701+00:00 m", "m", 1796238421061701, Wall, FormDmesgISO, false},
		// Captured with dmesg --time-format reltime on this machine: a new
		// minute shows the wall time, later lines the time since the last.
		{"[Dec 2 19:07] loop0: detected capacity change from 0 to 16384", "loop0: detected capacity change from 0 to 16384", 29012820000000, Wall, FormDmesgReltime, false},
		{"[  +0.004073] m", "m", 4073, Delta, FormDmesgReltime, false},
		{"[<    0.004073>] m", "m", 4073, Delta, FormDmesgDelta, false},
		{`{"MESSAGE":"m","_SOURCE_MONOTONIC_TIMESTAMP":"9595061701","__REALTIME_TIMESTAMP":"1796238424278559"}`, "m", 9595061701, Monotonic, FormJournalJSON, false},
		{`{"MESSAGE":[104,105,255],"__REALTIME_TIMESTAMP":"1796238424278559"}`, "hi\xff", 1796238424278559, Wall, FormJournalJSON, false},
		{"EXT4-fs (sda1): Remounting filesystem read-only", "EXT4-fs (sda1): Remounting filesystem read-only", 0, NoTime, FormBare, false},
		{"[Hardware Error]: event severity: fatal", "[Hardware Error]: event severity: fatal", 0, NoTime, FormBare, false},
		{" __schedule+0x34d/0xa00", " __schedule+0x34d/0xa00", 0, NoTime, FormBare, false},
		{" SUBSYSTEM=block", "", 0, NoTime, FormUnknown, true},
		{"-- Boot 0e8831569cd045b0a40199f64b37fa93 --", "", 0, NoTime, formJournalSeparate, true},
		{"   ", "", 0, NoTime, FormUnknown, true},
		{"[    6.5309650] x\r\n", "x", 6530965, Monotonic, FormDmesg, false},
	} {
		l := ParseLine([]byte(tc.in))
		msg := string(l.Message)
		if l.Skip != tc.skip || l.Form != tc.form || (!l.Skip && (msg != tc.msg || l.Time != tc.time || l.Usec != tc.usec)) {
			t.Errorf("ParseLine(%q) = %q usec %d time %v form %q skip %v", tc.in, l.Message, l.Usec, l.Time, l.Form, l.Skip)
		}
	}
}

// Lines that begin like a time or a priority of no known form.
func TestParseLineLooksPrefixed(t *testing.T) {
	for _, in := range []string{"2026-12-02 19:07:04.278 node kernel: m", "<3 INFO: task", "12:00:01 kernel: m", "[Wed 2 Dec 2026 19:07] m", "{not json", "[ 12.5s] m"} {
		if l := ParseLine([]byte(in)); l.Form != FormBare || l.Prefixed || !l.LooksPrefixed {
			t.Errorf("ParseLine(%q) = form %q prefixed %v looks prefixed %v", in, l.Form, l.Prefixed, l.LooksPrefixed)
		}
	}
	for _, in := range []string{"EXT4-fs (sda1): x", "[drm] Initialized", "8021q: adding VLAN 0"} {
		if l := ParseLine([]byte(in)); l.LooksPrefixed {
			t.Errorf("ParseLine(%q): looks prefixed", in)
		}
	}
}

func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"3,379,3463590,-;device-mapper: verity: 7:1: data block 5 is corrupted\n", "6,399,6531168,-;x\n SUBSYSTEM=block\n", "4,5,6,c;fragment", "0,0,0,-;",
		// lib/ratelimit.c's count of the lines it dropped.
		"4,400,6531170,-;blk_print_req_error: 37 callbacks suppressed\n", "4,401,6531171,-;: 1 callbacks suppressed\n"} {
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
		checkReencodable(t, b)
		msg := Unescape(nil, r.Message)
		rs.Matches(nil, msg)
		if fn, _, ok := parseSuppressed(msg); ok && (len(fn) == 0 || !strings.HasSuffix(strings.TrimRight(string(msg), " \n"), " callbacks suppressed")) {
			t.Fatalf("%q: function %q", msg, fn)
		}
	})
}

func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"[    6.530965] node-1 kernel: INFO: task kubelet:128 blocked", "<3>[ 1.0] x", "3,1,2,-;m", "Dec 02 10:00:00 h kernel: m", " KEY=v"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l := ParseLine(b)
		if l.Skip {
			return
		}
		if l.Form == FormUnknown {
			t.Fatalf("a line that is not skipped has no form")
		}
		if l.Prefixed == (l.Form == FormBare) {
			t.Fatalf("form %q prefixed %v", l.Form, l.Prefixed)
		}
		if l.Form != FormJournalJSON && len(l.Message) > len(b) {
			t.Fatal("message longer than the line")
		}
	})
}

// User space writing to /dev/kmsg sets any facility up to 255 with its
// "<N>" prefix (the kernel's LOG_FACILITY is N>>3 & 0xff; the record's
// priority is facility<<3|level, up to 2047). Such a record is well formed:
// with kernel_only off its line is matched like any other; with it on it is
// left out as user space's. Before, a priority above 1023 was refused as
// malformed: counted in parse_errors_total, never matched.
func TestRecordOfAHighUserFacility(t *testing.T) {
	in := []byte("2043,52,7000000,-;EXT4-fs (sda1): Remounting filesystem read-only\n")
	r, err := ParseRecord(in)
	if err != nil || r.Facility != 255 || r.Level != 3 || r.Seq != 52 {
		t.Fatalf("ParseRecord(%q) = %+v, %v; want facility 255, level 3", in, r, err)
	}
	if _, err := ParseRecord([]byte("2048,1,2,-;m")); !errors.Is(err, ErrMalformed) {
		t.Errorf("priority 2048 (facility 256, which the kernel cannot store): %v, want ErrMalformed", err)
	}
	for _, kernelOnly := range []bool{false, true} {
		store := report.NewStore("b")
		o := opts(t, store)
		o.KernelOnly = kernelOnly
		mon := NewMonitor(o)
		mon.Start(t0, t0)
		mon.CaughtUp(0, t0)
		mon.Handle(r, t0)
		want := report.StatusTrue
		if kernelOnly {
			want = report.StatusFalse
		}
		if c, _ := store.Get("ReadonlyFilesystem"); c.Status != want {
			t.Errorf("kernel_only %v: ReadonlyFilesystem %s, want %s", kernelOnly, c.Status, want)
		}
	}
}
