package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// hungDisk is the state writer's file system (stateWriter.write) on a disk
// whose writes block in the kernel (D state) while hang is set, until the
// test releases them; then they reach the real file.
type hungDisk struct {
	mu                         sync.Mutex
	calls, inFlight, maxFlight int
	hang                       bool
	release                    chan struct{}
}

func newHungDisk() *hungDisk { return &hungDisk{hang: true, release: make(chan struct{})} }

func (h *hungDisk) write(path string, data []byte, perm os.FileMode) error {
	h.mu.Lock()
	h.calls++
	h.inFlight++
	h.maxFlight = max(h.maxFlight, h.inFlight)
	hang, release := h.hang, h.release
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight--
		h.mu.Unlock()
	}()
	if hang {
		<-release
	}
	return report.WriteFileAtomic(path, data, perm)
}

// hangNow makes the next writes hang until unblock.
func (h *hungDisk) hangNow() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hang, h.release = true, make(chan struct{})
}

// unblock lets the blocked writes return, and the next ones through.
func (h *hungDisk) unblock() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hang {
		h.hang = false
		close(h.release)
	}
}

func (h *hungDisk) counts() (calls, inFlight, maxFlight int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls, h.inFlight, h.maxFlight
}

// gaugeValue reads a gauge of the daemon's registry (-1: absent).
func gaugeValue(t *testing.T, d *Daemon, name string) float64 {
	t.Helper()
	mfs, err := d.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func healthz(d *Daemon) (int, string) {
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code, rec.Body.String()
}

// A write of the state file that blocks in the kernel (a dying disk, a thin
// pool out of space queueing I/O, a hung NFS /var) is not the daemon stuck:
// every loop, the state writer's included, goes on making progress, so
// /healthz answers 200 and the watchdog keeps being pinged (it pings while
// Healthy is nil), naming the blocked write, as do status, the status line
// and autopilot_health_state_write_blocked_seconds; no second write starts
// on top of the hung one, however many changes come; once it returns, the
// changes made meanwhile are saved and the note clears. Before, the state
// writer was stuck 90 s into the write, /healthz answered 503, and systemd's
// watchdog aborted a daemon that a task in D state cannot even end.
func TestStateWriteBlockedInIOIsNotStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, d, logs, disk, stop := runOnADiskThatWillHang(t)
		defer func() { disk.unblock(); synctest.Wait() }() // no write blocked, none left when the temp dir goes
		base, _, _ := disk.counts()

		// The disk hangs; a condition changes.
		disk.hangNow()
		set := func(s report.Status, r report.Reason) {
			d.Store().Set(report.Condition{Type: "ClockNotSynchronized", Status: s, Reason: r}, time.Now())
		}
		set(report.StatusTrue, report.ReasonClockUnsynchronized)
		began := time.Now()
		// Ten minutes, with changes that want saving.
		for i := range 10 {
			time.Sleep(time.Minute)
			if i%2 == 0 {
				set(report.StatusFalse, report.ReasonClockSynchronized)
			} else {
				set(report.StatusTrue, report.ReasonClockUnsynchronized)
			}
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()

		path := filepath.Join(cfg.StateDir, report.StateFileName)
		if calls, inFlight, maxFlight := disk.counts(); calls != base+1 || inFlight != 1 || maxFlight != 1 {
			t.Errorf("%d writes begun while one hangs (%d in flight, at most %d); want exactly one", calls-base, inFlight, maxFlight)
		}
		if err := d.Healthy(); err != nil {
			t.Errorf("a state write blocked in I/O makes the daemon unhealthy (no watchdog ping): %v", err)
		}
		if code, body := healthz(d); code != http.StatusOK || !strings.Contains(body, "the write of "+path+" has been blocked in I/O since") {
			t.Errorf("/healthz %d %q; want 200 naming the blocked write of %s", code, body, path)
		}
		st := d.Status(time.Now())
		if st.Unhealthy != "" || st.StateWriteBlocked == nil || st.StateWriteBlocked.Path != path || st.StateWriteBlocked.Since.Sub(began) > 2*time.Second {
			t.Errorf("status: unhealthy %q, state write blocked %+v; want the write of %s since %v", st.Unhealthy, st.StateWriteBlocked, path, began)
		}
		if s := d.StatusLine(); !strings.HasPrefix(s, "state not saved: the write of "+path+" has been blocked in I/O since ") {
			t.Errorf("status line %q", s)
		}
		if v := gaugeValue(t, d, "autopilot_health_state_write_blocked_seconds"); v < 10*60 || v > 11*60 {
			t.Errorf("autopilot_health_state_write_blocked_seconds = %v, want about 630", v)
		}
		if n := strings.Count(logs.String(), "saving state is blocked in I/O"); n != 1 {
			t.Errorf("the blocked write logged %d times:\n%s", n, logs.String())
		}

		// The write returns: the changes made meanwhile are saved, and
		// the note clears.
		unblockAndExpectSaved(t, cfg, d, disk, base)
		if code, body := healthz(d); code != http.StatusOK || strings.Contains(body, "blocked") {
			t.Errorf("/healthz %d %q after the write returned", code, body)
		}
		if v := gaugeValue(t, d, "autopilot_health_state_write_blocked_seconds"); v != 0 {
			t.Errorf("autopilot_health_state_write_blocked_seconds = %v after the write returned", v)
		}
		if n := strings.Count(logs.String(), "the blocked state write returned"); n != 1 {
			t.Errorf("the return logged %d times:\n%s", n, logs.String())
		}
		stop()
	})
}

// The state writer blocked anywhere but in its write (here: a value the
// checks keep whose producer never returns, under the store's lock) is
// stuck, as before: /healthz names it and the watchdog pings stop.
func TestStateWriterDeadlockedOutsideTheWriteIsStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &Daemon{cfg: testConfig(t), log: slog.New(slog.DiscardHandler), store: report.NewStore("b"),
			metrics: report.NewMetrics("test"), live: NewLiveness(time.Now)}
		block := make(chan struct{})
		d.store.Keep("deadlock", func() any { <-block; return 1 })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.persist(ctx); close(done) }()
		d.store.Touch()
		time.Sleep(persistEvery + loopSlack + 5*time.Second)
		synctest.Wait()
		if err := d.Healthy(); err == nil || !strings.Contains(err.Error(), "stuck loops: state (no progress for") {
			t.Errorf("Healthy = %v; want the state writer stuck", err)
		}
		if _, ok := d.stateW.blocked(); ok {
			t.Error("a deadlock outside the write reads as a write blocked in I/O")
		}
		close(block)
		cancel()
		<-done
		synctest.Wait() // the save begun after the release ends before the temp dir goes
	})
}

// SIGTERM while the state write hangs, or with the final save hanging: the
// stop waits finalSaveWait at most, logs that the state was not saved, and
// exits 0; it does not start a write on top of the hung one. Before, Run
// waited for the final save for ever: the stop ran into TimeoutStopSec and
// a SIGKILL that a task in D state does not answer either.
func TestStopDoesNotWaitForAHungStateWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		// inFlight: the disk hangs while the daemon runs (a write is
		// blocked at SIGTERM); else only the final save hangs.
		inFlight bool
		log      string
	}{
		{"write blocked at SIGTERM", true, "state not saved on shutdown: the previous write is blocked in I/O; stopping anyway"},
		{"final save blocks", false, "state not saved on shutdown: the write is blocked in I/O; stopping anyway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t)
				cfg.Checks.ClockNotSynchronized.Enabled = false
				cfg.Checks.NodeTampered.Enabled = false
				d, logs := newLoggedDaemon(t, cfg)
				disk := newHungDisk()
				disk.unblock()
				d.stateW.write = disk.write
				// A failed test ends with no write blocked, and every write
				// ends before the temp dir is removed (RemoveAll would find
				// the write's temp file: "directory not empty").
				defer func() { disk.unblock(); synctest.Wait() }()
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- d.Run(ctx) }()
				time.Sleep(time.Minute)
				synctest.Wait()
				disk.mu.Lock()
				disk.hang, disk.release = true, make(chan struct{})
				disk.mu.Unlock()
				if tc.inFlight {
					d.Store().Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusTrue, Reason: report.ReasonClockUnsynchronized}, time.Now())
					time.Sleep(time.Minute)
					synctest.Wait()
				}
				before, _, _ := disk.counts()
				if took := stopRun(t, cancel, done, "the hung state write"); took > finalSaveWait+time.Second {
					t.Errorf("the stop took %v with the state write hung; want at most %v", took, finalSaveWait)
				}
				if !strings.Contains(logs.String(), tc.log) {
					t.Errorf("the unsaved state is not logged (%q):\n%s", tc.log, logs.String())
				}
				calls, _, maxFlight := disk.counts()
				if maxFlight != 1 || (tc.inFlight && calls != before) {
					t.Errorf("%d writes at SIGTERM (at most %d at once); want none on top of the hung one", calls-before, maxFlight)
				}
			})
		})
	}
}

// The final save with a writable disk still saves (and counts nothing
// when it works, as before).
func TestStopSavesTheState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Checks.NodeTampered.Enabled = false
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := d.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(cfg.StateDir, report.StateFileName)); err != nil {
			t.Errorf("not saved at the stop: %v", err)
		}
		if n := testutil.ToFloat64(d.metrics.StateWritesFor("error")); n != 0 {
			t.Errorf("%v failed writes", n)
		}
	})
}

// A write of tamper.json that blocks in the kernel holds neither the
// operator's clear nor anything else: `tamper clear` answers within
// tamper.SaveWait that the clear is applied but not saved yet (a restart
// before it is would bring the findings back), and so does a retry, at
// once, without a second write on top of the hung one; the blocked write
// is logged once and named in status, the status line and /healthz, as the
// state file's; once it returns, the latest clear is saved and the note
// clears. Before, the clear wrote tamper.json under the keeper's lock and
// hung until the connection's deadline (40 s) without a word, each retry
// leaving one more goroutine on the lock, and the tamper checks behind it.
func TestTamperClearWhileTheTamperWriteIsBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		// Not run here (no Run); their watcher blocks in a read the fake
		// clock cannot wait out.
		cfg.Checks.NodeTampered.Enabled = false
		cfg.Checks.SealedOSTampered.Enabled = false
		d, logs := newLoggedDaemon(t, cfg)
		k := d.currentEnv().Tamper
		disk := newHungDisk()
		defer func() { disk.unblock(); synctest.Wait() }() // a failed test ends with no write blocked
		k.SetWrite(disk.write)

		clear := func(reason string) chan error {
			done := make(chan error, 1)
			go func() {
				_, err := d.ClearTamper(context.Background(), reason, "uid 0 (uid 0, pid 1)")
				done <- err
			}()
			return done
		}
		answered := func(done chan error, what string) error {
			t.Helper()
			select {
			case err := <-done:
				return err
			default:
				t.Fatalf("%s: no answer while the write of tamper.json hangs", what)
				return nil
			}
		}
		began := time.Now()
		done := clear("INC-1: reviewed")
		time.Sleep(tamper.SaveWait + time.Second)
		synctest.Wait()
		err := answered(done, "tamper clear")
		if err == nil || !strings.Contains(err.Error(), "cleared, but not saved: the write of "+k.Path()+" has not returned since") || !strings.Contains(err.Error(), "run the clear again") {
			t.Errorf("tamper clear: %v; want cleared but not saved, naming %s", err, k.Path())
		}
		if c := k.State().Cleared; c == nil || c.Reason != "INC-1: reviewed" {
			t.Errorf("clear in memory: %+v", c)
		}
		// The operator retries: answered at once, the same way.
		retry := clear("INC-1: retry")
		synctest.Wait()
		err = answered(retry, "the retry")
		if err == nil || !strings.Contains(err.Error(), "cleared, but not saved") {
			t.Errorf("retry: %v; want cleared but not saved", err)
		}

		time.Sleep(tamper.WriteBlockedAfter)
		synctest.Wait()
		if calls, inFlight, _ := disk.counts(); calls != 1 || inFlight != 1 {
			t.Errorf("%d writes of tamper.json begun (%d in flight) while one hangs; want exactly one", calls, inFlight)
		}
		st := d.Status(time.Now())
		if b := st.TamperWriteBlocked; b == nil || b.Path != k.Path() || !b.Since.Equal(began) || st.StateWriteBlocked != nil {
			t.Errorf("status: tamper write blocked %+v, state write blocked %+v; want the write of %s since %v", b, st.StateWriteBlocked, k.Path(), began)
		}
		if s := d.StatusLine(); !strings.HasPrefix(s, "tamper state not saved: the write of "+k.Path()+" has been blocked in I/O since ") {
			t.Errorf("status line %q", s)
		}
		if code, body := healthz(d); code != http.StatusOK || !strings.Contains(body, "the write of "+k.Path()+" has been blocked in I/O since") {
			t.Errorf("/healthz %d %q; want 200 naming the blocked write", code, body)
		}
		if n := strings.Count(logs.String(), "saving the tamper state is blocked in I/O"); n != 1 {
			t.Errorf("the blocked write logged %d times:\n%s", n, logs.String())
		}

		// The write returns: the latest clear is saved, the note clears.
		disk.unblock()
		synctest.Wait()
		s, err := tamper.LoadState(cfg.StateDir)
		if err != nil || s == nil || s.Cleared == nil || s.Cleared.Reason != "INC-1: retry" {
			t.Errorf("saved: %+v, %v; want the retried clear", s, err)
		}
		if b := d.Status(time.Now()).TamperWriteBlocked; b != nil || strings.Contains(d.StatusLine(), "not saved") {
			t.Errorf("the note stays after the write returned: %+v %q", b, d.StatusLine())
		}
		if n := strings.Count(logs.String(), "the blocked tamper state write returned"); n != 1 {
			t.Errorf("the return logged %d times:\n%s", n, logs.String())
		}
	})
}

// SIGTERM while the write of tamper.json hangs with a clear not saved yet:
// the stop waits finalSaveWait at most for it, logs that the tamper state
// was not saved (the clear must be made again after the start), and
// exits 0.
func TestStopDoesNotWaitForAHungTamperWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Checks.NodeTampered.Enabled = false // its watcher blocks in a read the fake clock cannot wait out
		cfg.Checks.SealedOSTampered.Enabled = false
		d, logs := newLoggedDaemon(t, cfg)
		k := d.currentEnv().Tamper
		disk := newHungDisk()
		defer func() { disk.unblock(); synctest.Wait() }() // a failed test ends with no write blocked
		k.SetWrite(disk.write)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(time.Minute)
		synctest.Wait()
		if _, err := d.ClearTamper(context.Background(), "INC-2", "uid 0"); err == nil {
			t.Fatal("the clear says saved while the write hangs")
		}
		if took := stopRun(t, cancel, done, "the hung write of tamper.json"); took > 2*finalSaveWait+time.Second {
			t.Errorf("the stop took %v with the write of tamper.json hung", took)
		}
		if !strings.Contains(logs.String(), "tamper state not saved on shutdown: its write is blocked in I/O; stopping anyway") {
			t.Errorf("the unsaved tamper state is not logged:\n%s", logs.String())
		}
	})
}

// A clear whose write of tamper.json fails outright (a read-only or full
// /var, not a hang) is applied all the same, as one whose write hangs: the
// keeper dropped its findings in memory already, so refusing the clear
// left the conditions held True over findings that were gone, with no log
// line or Event, and every retry failed the same way. It is released,
// logged and evented, and the answer says it is not saved and why.
func TestTamperClearWhoseWriteFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Checks.NodeTampered.Enabled = false
		cfg.Checks.SealedOSTampered.Enabled = false
		d, logs := newLoggedDaemon(t, cfg)
		rec := &eventRecorder{}
		d.Store().Observe(rec)
		k := d.currentEnv().Tamper
		k.SetWrite(func(string, []byte, os.FileMode) error {
			return &os.PathError{Op: "open", Path: k.Path() + ".tmp1", Err: syscall.EROFS}
		})
		_, err := d.ClearTamper(context.Background(), "INC-2: reviewed", "uid 0 (uid 0, pid 1)")
		if err == nil || !strings.Contains(err.Error(), "cleared, but not saved") || !strings.Contains(err.Error(), "read-only file system") {
			t.Errorf("tamper clear with tamper.json not writable: %v; want cleared but not saved, naming the error", err)
		}
		if !strings.Contains(logs.String(), "tamper conditions cleared by an operator") {
			t.Errorf("the clear is not logged:\n%s", logs.String())
		}
		rec.mu.Lock()
		evs := slices.Clone(rec.events)
		rec.mu.Unlock()
		if !slices.ContainsFunc(evs, func(e report.Event) bool { return e.Reason == report.EventTamperCleared }) {
			t.Errorf("no %s Event: %+v", report.EventTamperCleared, evs)
		}
	})
}

// The status line's notes come in README's order ("Under systemd",
// STATUS=): the metrics port, a write blocked in I/O, a refused reload,
// then the summary (before the first pass is over, the starting line).
func TestStatusLineNotesInOrder(t *testing.T) {
	d, err := New(testConfig(t), quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.metricsBind.err = "listen tcp :20257: bind: address already in use"
	d.lastReload = &ReloadOutcome{Result: "refused", Error: "config.toml:3: key x: unknown"}
	d.mu.Unlock()
	d.stateW.mu.Lock()
	d.stateW.cur = &stateWrite{path: "/var/lib/autopilot-health/state.json", since: time.Now(), done: make(chan struct{}), blocked: true}
	d.stateW.mu.Unlock()
	for _, ready := range []bool{false, true} {
		d.mu.Lock()
		d.ready = ready
		d.mu.Unlock()
		body := d.Summary()
		if !ready {
			body = "starting: first pass of "
		}
		line := d.StatusLine()
		var at []int
		for _, part := range []string{"metrics not served: ", "state not saved: ", "configuration reload refused", body} {
			i := strings.Index(line, part)
			if i < 0 {
				t.Fatalf("status line %q lacks %q", line, part)
			}
			at = append(at, i)
		}
		if !slices.IsSorted(at) {
			t.Errorf("status line %q: notes out of order (at %v)", line, at)
		}
	}
}

// newLoggedDaemon is New on cfg with its log in a buffer and a listener
// that never accepts (the tests that read the log).
func newLoggedDaemon(t *testing.T, cfg *config.Config) (*Daemon, *testenv.SyncBuffer) {
	t.Helper()
	logs := &testenv.SyncBuffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	return d, logs
}

// A state write another began (saveStateNow: a tamper clear saves the state
// file before it writes tamper.json) and that blocks in I/O is reported as
// the persister's own are: once in the log, on the status line, in
// /healthz and the gauge. Before, the persister found a write in flight,
// started none, and never said the state was not being saved. When it
// returns, what changed meanwhile is saved.
func TestBlockedSaveOfAClearIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, d, logs, disk, stop := runOnADiskThatWillHang(t)
		defer func() { disk.unblock(); synctest.Wait() }() // no write blocked, none left when the temp dir goes
		base, _, _ := disk.counts()

		disk.hangNow()
		if err := d.saveStateNow(5 * time.Second); err == nil {
			t.Fatal("saveStateNow on a hung disk: no error")
		}
		d.Store().Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusTrue, Reason: report.ReasonClockUnsynchronized}, time.Now())
		time.Sleep(time.Minute)
		synctest.Wait()

		path := filepath.Join(cfg.StateDir, report.StateFileName)
		if calls, inFlight, _ := disk.counts(); calls != base+1 || inFlight != 1 {
			t.Errorf("%d writes begun while one hangs (%d in flight); want the clear's one", calls-base, inFlight)
		}
		if s := d.StatusLine(); !strings.HasPrefix(s, "state not saved: the write of "+path+" has been blocked in I/O since ") {
			t.Errorf("status line %q, want the clear's save named as blocked", s)
		}
		if code, body := healthz(d); code != http.StatusOK || !strings.Contains(body, "has been blocked in I/O since") {
			t.Errorf("/healthz %d %q", code, body)
		}
		if n := strings.Count(logs.String(), "saving state is blocked in I/O"); n != 1 {
			t.Errorf("the blocked write logged %d times:\n%s", n, logs.String())
		}
		if v := gaugeValue(t, d, "autopilot_health_state_write_blocked_seconds"); v < 60 {
			t.Errorf("autopilot_health_state_write_blocked_seconds = %v, want over 60", v)
		}

		unblockAndExpectSaved(t, cfg, d, disk, base)
		stop()
	})
}

// runOnADiskThatWillHang is runWithStateWrites through a hungDisk, let
// through until the test hangs it.
func runOnADiskThatWillHang(t *testing.T) (*config.Config, *Daemon, *testenv.SyncBuffer, *hungDisk, func()) {
	t.Helper()
	disk := newHungDisk()
	disk.unblock() // the start's writes go through
	cfg, d, logs, stop := runWithStateWrites(t, disk.write)
	return cfg, d, logs, disk, stop
}

// runWithStateWrites runs a daemon (inside synctest.Test) whose state
// file's writes go through write, and returns once the daemon is ready;
// stop ends it. ClockNotSynchronized is off (the tests set it), and so is
// NodeTampered (its watcher blocks in a read the fake clock cannot wait
// out).
func runWithStateWrites(t *testing.T, write func(path string, data []byte, perm os.FileMode) error) (*config.Config, *Daemon, *testenv.SyncBuffer, func()) {
	t.Helper()
	cfg := testConfig(t)
	cfg.Checks.ClockNotSynchronized.Enabled = false
	cfg.Checks.NodeTampered.Enabled = false
	d, logs := newLoggedDaemon(t, cfg)
	d.stateW.write = write
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	time.Sleep(time.Minute)
	synctest.Wait()
	if !d.readyNow() {
		t.Fatal("not ready after a minute")
	}
	return cfg, d, logs, func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// unblockAndExpectSaved lets the hung write return and checks that the
// change made meanwhile (ClockNotSynchronized True) is saved by one more
// write, and that the blocked-write note is gone.
func unblockAndExpectSaved(t *testing.T, cfg *config.Config, d *Daemon, disk *hungDisk, base int) {
	t.Helper()
	disk.unblock()
	time.Sleep(2 * time.Second)
	synctest.Wait()
	if calls, inFlight, _ := disk.counts(); calls != base+2 || inFlight != 0 {
		t.Errorf("after the write returned: %d writes (%d in flight); want the one saving what changed meanwhile", calls-base, inFlight)
	}
	saved := report.NewStore("x")
	if _, err := saved.Load(cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	if c, _ := saved.Get("ClockNotSynchronized"); c.Status != report.StatusTrue {
		t.Errorf("saved %s, want the change made while the write hung (True)", c.Status)
	}
	if _, ok := d.stateW.blocked(); ok || d.Status(time.Now()).StateWriteBlocked != nil || strings.Contains(d.StatusLine(), "state not saved") {
		t.Errorf("the note stays after the write returned: %q", d.StatusLine())
	}
}

// A clear's save that the persister adopted (it found it in flight) and
// that returns while the clear still waits for it is counted once in
// autopilot_health_state_writes_total, not by both: the counter counts
// writes of the file, as the disk saw them.
func TestAdoptedSaveIsCountedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, d, _, disk, stop := runOnADiskThatWillHang(t)
		defer func() { disk.unblock(); synctest.Wait() }()
		base, _, _ := disk.counts()
		okBase := stateWritesOK(t, d)

		disk.hangNow()
		saved := make(chan error, 1)
		go func() { saved <- d.saveStateNow(30 * time.Second) }()
		time.Sleep(time.Second)
		// A change wakes the persister: it finds the clear's write in
		// flight and adopts it.
		d.Store().Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusTrue, Reason: report.ReasonClockUnsynchronized}, time.Now())
		time.Sleep(5 * time.Second)
		synctest.Wait()
		disk.unblock() // within the clear's wait: both see the write return
		if err := <-saved; err != nil {
			t.Fatalf("saveStateNow: %v", err)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		calls, _, _ := disk.counts()
		if got, want := stateWritesOK(t, d)-okBase, float64(calls-base); got != want {
			t.Errorf("state_writes_total{result=\"ok\"} rose by %v for %v writes of the file", got, want)
		}
		stop()
	})
}

// stateWritesOK is autopilot_health_state_writes_total{result="ok"}.
func stateWritesOK(t *testing.T, d *Daemon) float64 {
	t.Helper()
	mfs, err := d.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_state_writes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "ok" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// stopRun cancels a daemon's Run and returns how long it took to return,
// failing the test when it returns an error or has not returned within a
// minute (waiting for what).
func stopRun(t *testing.T, cancel context.CancelFunc, done <-chan error, what string) time.Duration {
	t.Helper()
	stop := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the stop waits for %s", what)
	}
	return time.Since(stop)
}

// The daemon tells the store the end of each of its state file writes,
// with the values the write held (report.Store.OnWritten): the kernel log
// reader counts a gap of lost records only once the move past it is on
// disk. A failed write is told too, with its error.
func TestStateWritesTellTheStoreTheirEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Checks.NodeTampered.Enabled = false
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
		if err != nil {
			t.Fatal(err)
		}
		if !d.store.WritesReported() {
			t.Fatal("the daemon's store does not say that its writes are told")
		}
		var mu sync.Mutex
		value := 1
		d.store.Keep("probe", func() any { mu.Lock(); defer mu.Unlock(); return value })
		type end struct {
			v   any
			err error
		}
		var ends []end
		d.store.OnWritten("probe", func(v any, err error) { mu.Lock(); ends = append(ends, end{v, err}); mu.Unlock() })
		fail := errors.New("disk full")
		var failing atomic.Bool
		d.stateW.write = func(path string, data []byte, perm os.FileMode) error {
			if failing.Load() {
				return fail
			}
			return report.WriteFileAtomic(path, data, perm)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.persist(ctx); close(done) }()
		d.store.Touch()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		mu.Lock()
		value = 2
		mu.Unlock()
		failing.Store(true)
		d.store.Touch()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		// The failed write is retried with backoff: each try is told.
		if len(ends) < 2 || ends[0] != (end{1, nil}) || slices.ContainsFunc(ends[1:], func(e end) bool { return e.v != 2 || !errors.Is(e.err, fail) }) {
			t.Errorf("ends told: %+v; want value 1 written, then value 2 failed with %v", ends, fail)
		}
	})
}

// The persister encodes the store, then starts the write of what it
// encoded: two steps, between which a tamper clear's save (saveStateNow)
// can encode, write and end a newer state. The older encoding is not
// written over it: the state file would go back until the next save (the
// clear's save undone; a lost-records gap told saved, and counted, while
// the file holds the cursor of before it, so that a restart counts it
// again). The start of an encoding older than one whose write began is
// refused, as the start of a second write is: the newer write holds what
// it held.
func TestAnOlderEncodingIsNotWrittenOverANewerOne(t *testing.T) {
	cfg := testConfig(t)
	cfg.Checks.NodeTampered.Enabled = false
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	value := 1
	d.store.Keep("probe", func() any { mu.Lock(); defer mu.Unlock(); return value })
	// The persister's encoding (persist: EncodeWrite, then stateW.start).
	older, gen, err := d.store.EncodeWrite(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// Meanwhile the value moves and a clear's save writes it.
	mu.Lock()
	value = 2
	mu.Unlock()
	if err := d.saveStateNow(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The persister goes on to its start.
	if sw := d.stateW.start(d.statePath(), older, gen); sw != nil {
		<-sw.done
		d.countWrite(sw)
	}
	b, err := os.ReadFile(d.statePath())
	if err != nil {
		t.Fatal(err)
	}
	var sf struct {
		Memos map[string]json.RawMessage `json:"memos"`
	}
	if err := json.Unmarshal(b, &sf); err != nil {
		t.Fatal(err)
	}
	if got := string(sf.Memos["probe"]); got != "2" {
		t.Errorf("the state file holds probe %s after the newer save and the older encoding's start; want 2 (the newer save's)", got)
	}
}
