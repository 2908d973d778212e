package kmsg

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/syself/autopilot-health/report"
)

// A custom disk-io-error rule whose dev group catches far more than a
// device name (here 1,000 bytes, a different string at every line) keeps
// the window's part of the state file small: each device name kept is cut
// to maxDevLen bytes, ending in "…". Before, a full window of such names
// was 3.1 MB of the state file (its load limit is 4 MiB: past it the file
// is moved aside at the next start and every state lost).
func TestCustomDevGroupKeepsTheWindowSmall(t *testing.T) {
	rules := append([]Rule{{Name: "WideDev", Kind: DiskIOError, Reason: "BlockIOError",
		Pattern: `wide I/O error on (?P<dev>.+)$`}}, DefaultRules...)
	rs, err := Compile(rules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	store := report.NewStore("b")
	o := opts(t, store)
	o.Rules = rs
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	// Names a URL path escape triples (every byte but the digits is a
	// blank), each one different from the one before.
	for i := range windowCap {
		dev := fmt.Sprintf("%04d", i) + strings.Repeat(" ", 996)
		mon.Handle(rec(uint64(1000+i)*1000, "wide I/O error on "+dev), t0)
	}
	es := mon.windowEntries(nil)
	if len(es) != windowCap {
		t.Fatalf("the window holds %d errors, want %d", len(es), windowCap)
	}
	b, err := json.Marshal(cursor{Seq: 1, Have: true, IOErrors: es})
	if err != nil {
		t.Fatal(err)
	}
	// 1,024 names of 64 bytes, each escaped at most three times over.
	if len(b) > 256<<10 {
		t.Errorf("the window is %d bytes of the state file", len(b))
	}
	t.Logf("the window is %d bytes of the state file", len(b))
	for _, e := range es {
		if len(e.Dev) > maxDevLen || !utf8.ValidString(e.Dev) || !strings.HasSuffix(e.Dev, "…") {
			t.Fatalf("a device name kept is %d bytes (%.40q...), want at most %d ending in …", len(e.Dev), e.Dev, maxDevLen)
		}
	}
	// What is kept is what a restart reads back.
	var back cursor
	if err := json.Unmarshal(b, &back); err != nil || len(back.IOErrors) != windowCap || back.IOErrors[5] != es[5] {
		t.Errorf("read back: %v, %d errors", err, len(back.IOErrors))
	}
	if c := disksFailure(store); c.Status != report.StatusTrue {
		t.Errorf("DisksFailure: %+v", c)
	}
}

// capDev leaves a device name of up to maxDevLen bytes as it is and cuts a
// longer one at a character's start, so that it ends in "…" within
// maxDevLen bytes.
func TestCapDev(t *testing.T) {
	long := strings.Repeat("a", 100)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"nvme0n1", "nvme0n1"},
		{strings.Repeat("a", maxDevLen), strings.Repeat("a", maxDevLen)},
		{long, strings.Repeat("a", maxDevLen-3) + "…"},
		// A two-byte character across the cut is left out whole.
		{strings.Repeat("a", maxDevLen-4) + "éé" + long, strings.Repeat("a", maxDevLen-4) + "…"},
	} {
		if got := capDev([]byte(tc.in)); got != tc.want || len(got) > maxDevLen {
			t.Errorf("capDev(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
