package kmsg

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// A mount table with a line the kernel does not write is not judged (the
// read-only line is the node's, as before), and no longer silently: its
// malformed lines are counted at each lookup
// (autopilot_health_malformed_lines_total{reader="mountinfo-kmsg"}, the
// counter the daemon gives Options.MalformedMountinfo) and said once, not
// at each lookup; a table read clean again judges the device again.
func TestPodVolumeMalformedMountTableCountedAndSaidOnce(t *testing.T) {
	fixture, err := os.ReadFile(filepath.Join(podVolumeRoot, "proc", "self", "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	table := filepath.Join(proc, "self", "mountinfo")
	const bad = "600 22 8:64 / /x rw\n" // no " - " separator
	if err := os.WriteFile(table, append(append([]byte{}, fixture...), bad...), 0o644); err != nil {
		t.Fatal(err)
	}

	store := report.NewStore("b")
	var evs []report.Event
	store.Observe(events{&evs})
	var logs bytes.Buffer
	counter := prometheus.NewCounter(prometheus.CounterOpts{Name: "malformed"})
	o := opts(t, store)
	o.Sysfs, o.Proc = filepath.Join(podVolumeRoot, "sys"), proc
	o.MalformedMountinfo = counter
	o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	mon := NewMonitor(o)
	mon.volumes.now = func() uint64 { return nowUsec }
	mon.pods.now = mon.volumes.now
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)

	line := "EXT4-fs (rbd0): Remounting filesystem read-only"
	for i := range 2 {
		mon.Handle(rec(nowUsec-1, line), t0)
		if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
			t.Fatalf("lookup %d: ReadonlyFilesystem %+v, want True (the table is not judged)", i+1, c)
		}
	}
	if n := testutil.ToFloat64(counter); n != 2 {
		t.Errorf("malformed lines counted: %v, want 2 (one line, two lookups)", n)
	}
	said := strings.Count(logs.String(), "pod volume lookup: malformed lines")
	if said != 1 || !strings.Contains(logs.String(), `600 22 8:64 / /x rw`) || !strings.Contains(logs.String(), "lines=1") {
		t.Errorf("logged %d times, want once naming the line:\n%s", said, logs.String())
	}

	// Clean again: rbd0 is a pod's volume again, nothing more counted.
	if err := os.WriteFile(table, fixture, 0o644); err != nil {
		t.Fatal(err)
	}
	mon.Handle(rec(nowUsec-1, line), t0)
	if len(evs) != 1 || evs[0].Reason != report.EventPodVolumeReadOnly {
		t.Errorf("events %+v, want one PodVolumeReadOnly", evs)
	}
	if n := testutil.ToFloat64(counter); n != 2 {
		t.Errorf("malformed lines counted after a clean table: %v, want 2", n)
	}
}
