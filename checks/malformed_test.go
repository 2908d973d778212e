package checks

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// NodeTampered's mount watcher counts each reading's malformed lines of
// the mount table in autopilot_health_malformed_lines_total{reader=
// "mountinfo-watch"} and says them once, not at each reading; once a
// reading has none, their return is said again.
func TestMountWatcherMalformedLinesCountedAndSaidOnce(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"/etc/kubernetes", "/etc/cni/net.d"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bad := "22 1 8:2 / " + root + "/etc/cni/net.d rw shared:2 ext4 /dev/sda2 rw" // no "-"
	table := "1 0 8:0 / / rw - ext4 /dev/root rw\n21 1 8:1 / " + root + "/etc/kubernetes rw shared:1 - ext4 /dev/sda1 rw\n" + bad + "\n"
	p := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(p, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	old := tamper.MountsFile
	tamper.MountsFile = p
	t.Cleanup(func() { tamper.MountsFile = old })

	var logs bytes.Buffer
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		c.Checks.NodeTampered.Paths = []string{"/etc/kubernetes/kubelet.conf", "/etc/cni/net.d"}
	})
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	reg := prometheus.NewRegistry()
	env.Malformed = NewMalformedLines(reg)
	built, err := newNodeTamperedCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	c := built.(*nodeTamperedCheck)
	readings := c.mountReadings()
	for range 2 { // two readings of the same table
		m, err := tamper.NewMountWatcher(root, c.spec)
		if err != nil {
			t.Fatal(err)
		}
		readings(m.Malformed())
	}
	if got := env.Malformed.Value(MalformedMountWatch); got != 2 {
		t.Errorf("malformed lines counted %v, want 2 (one line, two readings)", got)
	}
	for _, r := range MalformedReaders {
		if r != MalformedMountWatch && env.Malformed.Value(r) != 0 {
			t.Errorf("reader %s counted %v, want 0", r, env.Malformed.Value(r))
		}
	}
	const said = "mount watcher: skipped malformed lines of the mount table"
	if n := strings.Count(logs.String(), said); n != 1 {
		t.Fatalf("said %d times across two readings, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "mountinfo line 3: malformed") {
		t.Errorf("the log does not name the first malformed line:\n%s", logs.String())
	}
	// A clean reading, then the line back: said again.
	readings(0, nil)
	m, err := tamper.NewMountWatcher(root, c.spec)
	if err != nil {
		t.Fatal(err)
	}
	readings(m.Malformed())
	if n := strings.Count(logs.String(), said); n != 2 {
		t.Fatalf("said %d times after the line came back, want twice:\n%s", n, logs.String())
	}
	// Every reader's series exists at 0 from the start.
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "autopilot_health_malformed_lines_total" && len(f.GetMetric()) != len(MalformedReaders) {
			t.Errorf("%d series, want one per reader (%d)", len(f.GetMetric()), len(MalformedReaders))
		}
	}
}

// NodeTampered's scan reads the mount table for the mounts the sandbox
// hides: a line there that the kernel does not write is skipped, as ever,
// counted at each run in
// autopilot_health_malformed_lines_total{reader="mountinfo-scan"} and said
// once across runs; the good line after it is still used (the hidden
// /root makes /root/.ssh unreadable). Before, it was skipped without a
// count or a word.
func TestNodeTamperedScanMalformedMountinfoCountedAndSaidOnce(t *testing.T) {
	h := newTamperHost(t)
	h.protect = []string{"/root/.ssh"}
	h.logs = &testenv.SyncBuffer{}
	h.malformed = NewMalformedLines(nil)
	bad := "107 66 0:47 /systemd/inaccessible/dir /home ro,nosuid,nodev,noexec,relatime shared:34" // no "-"
	h.write("/proc/self/mountinfo", "66 49 0:41 / / ro,relatime shared:1 - tmpfs rootfs rw,size=16384k,mode=755\n"+
		bad+"\n"+
		"108 66 0:47 /systemd/inaccessible/dir /root ro,nosuid,nodev,noexec,relatime shared:35 - tmpfs tmpfs rw,size=16384k,mode=755\n")
	mkdir(t, h.path("/root"))
	c := h.start("boot-1", report.NewStore("boot-1"))
	for range 2 {
		h.probe(c, report.StatusUnknown, report.ReasonCheckFailed, "/root/.ssh (hidden by the sandbox: /root is a systemd inaccessible mount")
	}
	if got := h.malformed.Value(MalformedMountScan); got != 2 {
		t.Errorf("malformed lines counted %v, want 2 (one line, two runs)", got)
	}
	const said = "scan: skipped malformed lines of the mount table"
	if n := strings.Count(h.logs.String(), said); n != 1 {
		t.Fatalf("said %d times across two runs, want once:\n%s", n, h.logs.String())
	}
	if !strings.Contains(h.logs.String(), "mountinfo line 2: malformed") {
		t.Errorf("the log does not name the first malformed line:\n%s", h.logs.String())
	}
}

// Where the journal is read with journalctl, its lines that are not
// journal entries are skipped, as ever, counted in
// autopilot_health_malformed_lines_total{reader="journalctl"} (each once:
// the next run starts after them) and logged once, not at each run (they
// were logged at every run before); after a run that reads entries and
// none such, they are logged again when they come back. The entries
// around them are still read.
func TestKubeletHeartbeatJournalctlGarbageCountedAndSaidOnce(t *testing.T) {
	now := hbLast
	fj := newFakeJournalctl(t)
	env := heartbeatEnv(t, journalRoot(t), fj, &now)
	var logs bytes.Buffer
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	env.Malformed = NewMalformedLines(nil)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1}, `{"__CURSOR":"s=1"`)
	fj.serve(t, 2, []int{2}, "-- No entries --", "garbage")
	fj.serve(t, 3, []int{3})
	fj.serve(t, 4, []int{4}, "garbage")
	const said = "skipped journalctl output that is not journal entries"
	for i, want := range []struct {
		count float64
		said  int
	}{{1, 1}, {3, 1}, {3, 1}, {4, 2}} {
		// Each run reads its one entry (the third a give-up, True).
		r, err := c.Probe(context.Background())
		if err != nil || r.Status == report.StatusUnknown {
			t.Fatalf("run %d: %s %q, %v; want the entry read", i+1, r.Status, r.Message, err)
		}
		if got := env.Malformed.Value(MalformedJournalctl); got != want.count {
			t.Errorf("run %d: %v lines counted, want %v", i+1, got, want.count)
		}
		if got := strings.Count(logs.String(), said); got != want.said {
			t.Fatalf("run %d: said %d times, want %d:\n%s", i+1, got, want.said, logs.String())
		}
	}
}
