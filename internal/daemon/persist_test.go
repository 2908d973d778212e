package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// The state cannot be saved (here: its directory's parent is a file, as a
// read-only /var refuses it): the persister retries with backoff instead
// of every second, logs the error once, and once when saving works again.
// Before, a busy kernel log made it log an error every second.
func TestPersistBacksOffWhenSavingFails(t *testing.T) {
	for _, kind := range []string{"Touch", "TouchLater"} {
		t.Run(kind, func(t *testing.T) { testPersistBacksOff(t, kind) })
	}
}

func testPersistBacksOff(t *testing.T, kind string) {
	synctest.Test(t, func(t *testing.T) {
		base := t.TempDir()
		blocker := filepath.Join(base, "var")
		if err := os.WriteFile(blocker, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t)
		cfg.StateDir = filepath.Join(blocker, "lib", "autopilot-health")
		var logs testenv.SyncBuffer
		d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil)), store: report.NewStore("b"),
			metrics: report.NewMetrics("test"), live: NewLiveness(time.Now)}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.persist(ctx); close(done) }()
		// A change every second for ten minutes: a value a check keeps
		// (Touch), or a kernel record moving the cursor (TouchLater).
		touch := d.store.Touch
		if kind == "TouchLater" {
			touch = d.store.TouchLater
		}
		for range 600 {
			touch()
			time.Sleep(time.Second)
		}
		failed := testutil.ToFloat64(d.metrics.StateWritesFor("error"))
		if failed < 5 || failed > 30 {
			t.Errorf("%v failed saves in 10 minutes; want a backoff (5..30)", failed)
		}
		if n := strings.Count(logs.String(), "saving state failed"); n != 1 {
			t.Errorf("the failure was logged %d times:\n%s", n, logs.String())
		}
		// /var is writable again: the next retry saves, once logged.
		os.Remove(blocker)
		touch()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if _, err := os.Stat(filepath.Join(cfg.StateDir, report.StateFileName)); err != nil {
			t.Errorf("not saved after recovery: %v", err)
		}
		if n := strings.Count(logs.String(), "saving state works again"); n != 1 {
			t.Errorf("recovery logged %d times:\n%s", n, logs.String())
		}
		cancel()
		<-done
	})
}

// A condition whose detail changes (another matching kernel line, a new
// percentage) with the same status and reason is not a new journal line at
// the default level: one line per change of state.
func TestLogOneLinePerChangeOfState(t *testing.T) {
	var logs testenv.SyncBuffer
	s := report.NewStore("b")
	s.Observe(newLogObserver(slog.New(slog.NewTextHandler(&logs, nil))))
	now := time.Now()
	for i := range 5 {
		s.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusTrue, Reason: report.ReasonFilesystemIsReadOnly,
			Message: "EXT4-fs (vda" + string(rune('1'+i)) + "): Remounting filesystem read-only"}, now)
	}
	if n := strings.Count(logs.String(), "condition changed"); n != 1 {
		t.Errorf("%d lines for one change of state:\n%s", n, logs.String())
	}
}

// A transition time read back from the Node in the future (written while
// the clock was ahead) is taken as now with one journal line that names the
// time read and the time taken.
func TestLogAFutureTransitionTimeTakenAsNow(t *testing.T) {
	var logs testenv.SyncBuffer
	s := report.NewStore("b")
	s.Observe(newLogObserver(slog.New(slog.NewTextHandler(&logs, nil))))
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s.SetClock(func() time.Time { return now })
	s.Adopt(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh,
		LastTransitionTime: now.Add(time.Hour)}, "b")
	out := logs.String()
	if n := strings.Count(out, "taken as now"); n != 1 ||
		!strings.Contains(out, "condition=DiskUsageHigh") || !strings.Contains(out, "from=node") ||
		!strings.Contains(out, "was=2026-12-01T11:00:00.000Z") || !strings.Contains(out, "now=2026-12-01T10:00:00.000Z") {
		t.Errorf("want one line naming the Node's 11:00 taken as 10:00:\n%s", out)
	}
}

// A read-only state directory fails each save on a new temp file name: the
// same failure, logged once.
func TestSaveErrorKeyIgnoresTheTempName(t *testing.T) {
	a := &os.PathError{Op: "open", Path: "/var/lib/autopilot-health/state.json.tmp1780316546", Err: syscall.EROFS}
	b := &os.PathError{Op: "open", Path: "/var/lib/autopilot-health/state.json.tmp3923618647", Err: syscall.EROFS}
	if saveErrKey(a) != saveErrKey(b) {
		t.Errorf("%q != %q", saveErrKey(a), saveErrKey(b))
	}
	if c := (&os.PathError{Op: "open", Path: a.Path, Err: syscall.ENOSPC}); saveErrKey(c) == saveErrKey(a) {
		t.Error("another cause reads as the same failure")
	}
}

// The kernel log's cursor moving (Store.TouchLater, a record every 100 ms
// for a minute) is saved once per persistLater, not once a second; a
// change that may not wait (Store.Touch) is saved within a second and
// takes the due one with it; nothing is saved while nothing changes.
func TestPersistCursorMovesWaitForPersistLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		d := &Daemon{cfg: cfg, log: slog.New(slog.DiscardHandler), store: report.NewStore("b"),
			metrics: report.NewMetrics("test"), live: NewLiveness(time.Now)}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.persist(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		saves := func() float64 { return testutil.ToFloat64(d.metrics.StateWritesFor("ok")) }

		start := time.Now()
		for time.Since(start) < time.Minute {
			d.store.TouchLater()
			time.Sleep(100 * time.Millisecond)
		}
		synctest.Wait()
		// 60 s of records: a save 10 s after the first, then one 10 s
		// after the first record after each save.
		if n := saves(); n < 5 || n > 7 {
			t.Fatalf("%v saves in a minute of kernel records; want one per %v (5..7)", n, persistLater)
		}
		time.Sleep(persistLater + time.Second)
		synctest.Wait()
		base := saves()

		// One record: not saved within a second, saved by persistLater.
		d.store.TouchLater()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if saves() != base {
			t.Fatalf("a cursor move was saved within 2 s")
		}
		time.Sleep(persistLater)
		synctest.Wait()
		if saves() != base+1 {
			t.Fatalf("a cursor move was not saved within %v (%v saves, want %v)", persistLater, saves(), base+1)
		}

		// A record, then a condition change: one save, a second after the
		// change, and none when the record's wait would have ended.
		d.store.TouchLater()
		time.Sleep(3 * time.Second)
		d.store.Touch()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if saves() != base+2 {
			t.Fatalf("a change was not saved within a second (%v saves, want %v)", saves(), base+2)
		}
		time.Sleep(persistLater)
		synctest.Wait()
		if saves() != base+2 {
			t.Fatalf("the change's save did not take the cursor's (%v saves, want %v)", saves(), base+2)
		}

		// A condition's change and a record at the same instant (a
		// record that changed a status): one save, within a second.
		d.store.Touch()
		d.store.TouchLater()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if saves() != base+3 {
			t.Fatalf("a change and a record at once: %v saves in 30 s, want 1", saves()-base-2)
		}

		// Nothing changes for ten minutes: nothing is written.
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if saves() != base+3 {
			t.Fatalf("%v saves while nothing changed", saves()-base-3)
		}
	})
}

// The state is lost (no state file) on a node whose kernel log monitor is
// off (kmsg.enabled = false), and the Node still shows DisksFailure True
// for the kernel's disk I/O errors, from when the monitor ran: the daemon
// takes the Node's word over at start (README, "When the state is lost"),
// but the kernel's part of it has no source here, so the SMART check's
// part decides alone once it runs, as at a start with the state file, not
// the kernel's part taken from the Node and then held for good.
func TestStateLostKeepsNoPartWithoutASource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t) // kmsg.enabled = false, no state file
		// Its watcher blocks in a read of file events the fake clock
		// cannot wait out.
		cfg.Checks.NodeTampered.Enabled = false
		// The first runs spread: the SMART check's first run comes
		// after the Node's conditions were read.
		cfg.Runner.FirstRunSpread = config.Duration{Duration: 5 * time.Minute}
		since := metav1.NewTime(time.Now().Add(-time.Hour))
		client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: "DisksFailure", Status: corev1.ConditionTrue,
				Reason: string(report.ReasonDiskIOErrors), Message: "the kernel logged 7 disk I/O errors in the last 10m0s (threshold 5) on sda",
				LastTransitionTime: since, LastHeartbeatTime: since}}}})
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client)})
		if err != nil {
			t.Fatal(err)
		}
		if d.kmsg != nil {
			t.Fatal("the kernel log monitor runs")
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		c, _ := d.Store().Get("DisksFailure")
		smart, _ := d.Store().Part(report.SourceCheck, "DisksFailure")
		if smart.Reason == "" {
			t.Fatal("the SMART check has not run")
		}
		if c.Status == report.StatusTrue {
			t.Errorf("DisksFailure %s/%s %q with the SMART part %s/%s and no kernel log monitor: held by a part nothing evaluates", c.Status, c.Reason, c.Message, smart.Status, smart.Reason)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// A change that may wait (a kernel record moving the cursor, which wakes
// the reader whenever the kernel logs it) is saved at the next point of
// persistLater's grid, where the 10 s checks wake the daemon anyway, not
// persistLater after the record: that was a second wake-up of its own.
func TestPersistLaterSavesOnTheGrid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		grid := tick.New(time.Now())
		cfg := testConfig(t)
		d := &Daemon{cfg: cfg, log: slog.New(slog.DiscardHandler), store: report.NewStore("b"),
			metrics: report.NewMetrics("test"), live: NewLiveness(time.Now), parts: &Parts{Grid: grid}}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.persist(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		saves := func() float64 { return testutil.ToFloat64(d.metrics.StateWritesFor("ok")) }
		for _, at := range []time.Duration{13230 * time.Millisecond, 29990 * time.Millisecond, 40 * time.Second} {
			time.Sleep(at - time.Since(grid.Anchor()))
			base := saves()
			d.store.TouchLater()
			next := grid.Next(time.Now(), persistLater)
			time.Sleep(time.Until(next) - time.Millisecond)
			synctest.Wait()
			if saves() != base {
				t.Fatalf("a record at %v was saved before the grid's next point %v", at, next.Sub(grid.Anchor()))
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
			if saves() != base+1 {
				t.Fatalf("a record at %v was not saved at the grid's next point %v (%v saves, want %v)", at, next.Sub(grid.Anchor()), saves(), base+1)
			}
		}
	})
}
