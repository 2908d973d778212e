package checks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// outdated is NodeInfoStale's True with a message of its own per run.
func outdated(msg string) probeFunc {
	return func(context.Context) (Result, error) {
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoOutdated, Message: msg}, nil
	}
}

// failures are the ways a run of a check fails (the previous run not
// returned: TestRunnerHoldsATrueThroughAStuckProbe), each with the reason, the
// message and the result (autopilot_health_check_runs_total) it has, and
// how long after the run's start it is recorded.
var failures = []struct {
	name    string
	probe   probeFunc
	reason  report.Reason
	message string
	result  string
	after   time.Duration
}{
	{"error", func(context.Context) (Result, error) { return Result{}, errors.New("dbus: NoReply") },
		report.ReasonCheckFailed, "dbus: NoReply", report.ResultError, 0},
	{"timeout", func(ctx context.Context) (Result, error) { <-ctx.Done(); return Result{}, ctx.Err() },
		report.ReasonCheckTimeout, "check did not finish within its timeout of 10s", report.ResultTimeout, 10 * time.Second},
	{"panic", func(context.Context) (Result, error) { panic("boom") },
		report.ReasonCheckPanicked, "check panicked: boom", report.ResultPanic, 0},
}

// A True condition is held, status, reason, message and transition time,
// through up to 2 failed runs of its check in a row (an error, a timeout, a
// panic): one D-Bus call answered NoReply must
// not make the Node's condition True -> Unknown -> True, which restarts the
// MachineHealthCheck's timeout and every alert's `for:`. A run that decides
// resets the count; the 3rd failed run in a row makes it Unknown with the
// failure's reason and message. Each failed run is counted in
// autopilot_health_check_runs_total at once.
func TestRunnerHoldsATrueThroughTwoFailedRuns(t *testing.T) {
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				script := []probeFunc{
					outdated("age 6m"), // 0
					f.probe,            // 1: held
					f.probe,            // 2: held
					outdated("age 9m"), // 3: decides, the count starts again
					f.probe,            // 4: held
					f.probe,            // 5: held
					f.probe,            // 6: the 3rd in a row: Unknown
					outdated("age 7m"), // 7: True again, a new transition
				}
				var mu sync.Mutex
				i := 0
				probe := probeFunc(func(ctx context.Context) (Result, error) {
					mu.Lock()
					p := script[min(i, len(script)-1)]
					i++
					mu.Unlock()
					return p(ctx)
				})
				env := testEnv(t, nil)
				store := report.NewStore("b")
				m := report.NewMetrics("test")
				r, err := NewRunner(env, Options{Store: store, Metrics: m, Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				stop := runLoop(t, r)
				type want struct {
					status report.Status
					reason report.Reason
					msg    string
					ltt    time.Duration
					failed int // failed runs counted so far
				}
				// isOutdated is NodeInfoStale's True with msg, since ltt.
				isOutdated := func(msg string, ltt time.Duration, failed int) want {
					return want{report.StatusTrue, report.ReasonNodeInfoOutdated, msg, ltt, failed}
				}
				wants := []want{
					isOutdated("age 6m", 0, 0),
					isOutdated("age 6m", 0, 1),
					isOutdated("age 6m", 0, 2),
					isOutdated("age 9m", 0, 2),
					isOutdated("age 9m", 0, 3),
					isOutdated("age 9m", 0, 4),
					{report.StatusUnknown, f.reason, f.message, 6*time.Minute + f.after, 5},
					isOutdated("age 7m", 7*time.Minute, 5),
				}
				for k, w := range wants {
					// Past run k's timeout: its outcome is recorded.
					time.Sleep(time.Until(start.Add(time.Duration(k)*time.Minute + 11*time.Second)))
					synctest.Wait()
					c, _ := store.Get("NodeInfoStale")
					if c.Status != w.status || c.Reason != w.reason || c.Message != w.msg || c.LastTransitionTime.Sub(start) != w.ltt {
						t.Errorf("after run %d: %s/%s %q since %v, want %s/%s %q since %v",
							k, c.Status, c.Reason, c.Message, c.LastTransitionTime.Sub(start), w.status, w.reason, w.msg, w.ltt)
					}
					body := scrapeRegistry(t, m)
					series := `autopilot_health_check_runs_total{check="NodeInfoStale",result="` + f.result + `"} `
					if got := metricValue(body, series); got != w.failed {
						t.Errorf("after run %d: %s%d, want %d", k, series, got, w.failed)
					}
				}
				stop()
			})
		})
	}
}

// metricValue is the value of the series (its name and labels, then a
// space) in an exposition page; 0 when absent.
func metricValue(body, series string) int {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// A probe that ignores its context holds a True through its timeout and
// the next run that finds it still running; the third such run in a row
// makes it Unknown, and the check's next decision sets it again.
func TestRunnerHoldsATrueThroughAStuckProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		n := 0
		probe := probeFunc(func(context.Context) (Result, error) {
			mu.Lock()
			n++
			k := n
			mu.Unlock()
			if k == 2 {
				<-release // run 1, and runs 2 and 3 find it running
			}
			return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoOutdated, Message: fmt.Sprintf("probe %d", k)}, nil
		})
		start := time.Now()
		store, stop := loopNodeInfo(t, probe)
		check := func(at time.Duration, status report.Status, msg string, ltt time.Duration) {
			t.Helper()
			time.Sleep(time.Until(start.Add(at)))
			synctest.Wait()
			c, _ := store.Get("NodeInfoStale")
			if c.Status != status || c.Message != msg || c.LastTransitionTime.Sub(start) != ltt {
				t.Errorf("at %v: %s %q since %v, want %s %q since %v", at, c.Status, c.Message, c.LastTransitionTime.Sub(start), status, msg, ltt)
			}
		}
		check(time.Second, report.StatusTrue, "probe 1", 0)
		check(time.Minute+11*time.Second, report.StatusTrue, "probe 1", 0) // timed out: held
		check(2*time.Minute+time.Second, report.StatusTrue, "probe 1", 0)  // still running: held
		check(3*time.Minute+time.Second, report.StatusUnknown, "the previous run (timeout 10s) has still not returned", 3*time.Minute)
		close(release)
		check(4*time.Minute+time.Second, report.StatusTrue, "probe 3", 4*time.Minute)
		stop()
	})
}

// An Unknown of the probe's own (an NVMe drive that did not answer beside
// one that did: TestNVMeHungDriveKeepsTheOthers) is a run that decided:
// it is set at once, a True not held through it.
func TestRunnerDoesNotHoldATrueThroughTheProbesOwnUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, c := acrossASwitch(t, outdated("age 6m"),
			returns(Result{Status: report.StatusUnknown, Reason: report.ReasonCheckFailed, Message: "not readable: nvme1"}, nil))
		if c.Status != report.StatusUnknown || c.Message != "not readable: nvme1" {
			t.Errorf("after the probe's own Unknown: %+v, want it set at once", c)
		}
	})
}

// acrossASwitch runs NodeInfoStale's loop with before's probe, then with
// after's from the next run (a minute later), and is the condition after
// each of the two runs.
func acrossASwitch(t *testing.T, before, after probeFunc) (first, then report.Condition) {
	t.Helper()
	probe, set := switchedProbe(before, after)
	store, stop := loopNodeInfo(t, probe)
	defer stop()
	synctest.Wait()
	first, _ = store.Get("NodeInfoStale")
	set(true)
	time.Sleep(time.Minute)
	synctest.Wait()
	then, _ = store.Get("NodeInfoStale")
	return first, then
}

// A False or Unknown condition turns Unknown at the first failed run, as
// before: only a True is held.
func TestRunnerDoesNotHoldAFalseThroughAFailedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first, c := acrossASwitch(t, returns(Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh, Message: "fresh"}, nil),
			returns(Result{}, errors.New("permission denied")))
		if first.Status != report.StatusFalse {
			t.Fatalf("first run: %+v", first)
		}
		if c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed || c.Message != "permission denied" {
			t.Errorf("a False after one failed run: %+v, want Unknown/CheckFailed at once", c)
		}
	})
}

// A check that evaluates one part of its condition (DisksFailure's NVMe
// SMART part) holds its part's True the same way: the condition does not
// turn Unknown, nor get a new transition time, for one failed SMART read.
func TestRunnerHoldsATruePartThroughTwoFailedRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probe, setFail := switchedProbe(returns(Result{Status: report.StatusTrue, Reason: report.ReasonNVMeCriticalWarning, Message: "nvme0: SMART critical warning 0x04"}, nil),
			returns(Result{}, errors.New("nvme0: input/output error")))
		store := report.NewStore("b")
		r, err := NewRunner(testEnv(t, nil), Options{Store: store, Only: []string{"DisksFailure"}, Factories: map[string]Factory{"DisksFailure": fixed(probe)}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		r.RunOnce(t.Context())
		setFail(true)
		for k := 1; k <= 3; k++ {
			time.Sleep(5 * time.Minute)
			r.RunOnce(t.Context())
			c, _ := store.Get("DisksFailure")
			p, _ := store.Part(report.SourceCheck, "DisksFailure")
			if k < 3 {
				if c.Status != report.StatusTrue || c.LastTransitionTime != start || p.Status != report.StatusTrue || p.Message != "nvme0: SMART critical warning 0x04" {
					t.Errorf("failed run %d: condition %+v, part %+v; want both held True since the start", k, c, p)
				}
				continue
			}
			if c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed || p.Status != report.StatusUnknown || !c.LastTransitionTime.Equal(time.Now()) {
				t.Errorf("failed run 3: condition %+v, part %+v; want Unknown/CheckFailed now", c, p)
			}
		}
	})
}

// A True restored from the state file at a restart is held the same way:
// with no failed runs kept (a state file without them), the first failed
// run after the start counts 1, and a single failure after a restart does
// not flap the condition. A restart in the middle of a run of failures
// carries the count on: TestRunnerHoldCountsFailuresAcrossARestart.
func TestRunnerHoldsATrueRestoredFromTheStateFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		before := report.NewStore("b")
		set := time.Now()
		before.Set(report.Condition{Type: "ServiceNotRecovering", Status: report.StatusTrue, Reason: report.ReasonUnitFailed, Message: "kubelet.service failed"}, set)
		if err := before.Save(dir, set); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour) // the daemon restarts an hour later
		store := report.NewStore("b")
		if _, err := store.Load(dir); err != nil {
			t.Fatal(err)
		}
		probe := probeFunc(func(context.Context) (Result, error) {
			return Result{}, errors.New("Message recipient disconnected from message bus without replying")
		})
		r, err := NewRunner(testEnv(t, nil), Options{Store: store, Only: []string{"ServiceNotRecovering"}, Factories: map[string]Factory{"ServiceNotRecovering": fixed(probe)}})
		if err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= 3; k++ {
			r.RunOnce(t.Context())
			c, _ := store.Get("ServiceNotRecovering")
			held := c.Status == report.StatusTrue && c.Reason == report.ReasonUnitFailed && c.LastTransitionTime.Equal(set)
			if held != (k < 3) {
				t.Errorf("failed run %d after the restart: %+v (held %v, want %v)", k, c, held, k < 3)
			}
			time.Sleep(time.Minute)
		}
	})
}

// A reload that builds the check again (its settings changed) carries on
// its count of failed runs in a row: the True is held through 2 failed runs
// in all, not 2 before the reload and 2 more after it. Holding says what a
// held True is held through (the status command shows it), and nothing
// once the check decides again or the condition turned Unknown.
func TestRunnerHoldCountsFailuresAcrossAReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probe, setFail := failingAfter()
		store := report.NewStore("b")
		factories := map[string]Factory{"NodeInfoStale": fixed(probe)}
		r, err := NewRunner(testEnv(t, nil), Options{Store: store, Only: []string{"NodeInfoStale"}, Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		r.RunOnce(t.Context())
		if _, ok := r.Holding("NodeInfoStale"); ok {
			t.Error("held after a run that decided")
		}
		setFail(true)
		time.Sleep(time.Minute)
		r.RunOnce(t.Context())
		h, ok := r.Holding("NodeInfoStale")
		if want := (HeldFailure{Runs: 1, Since: start.Add(time.Minute), Reason: report.ReasonCheckFailed, Message: "nodes.json: input/output error"}); !ok || h != want {
			t.Errorf("after a failed run: Holding = %+v, %v; want %+v", h, ok, want)
		}
		a, err := r.Apply(testEnv(t, func(c *config.Config) { c.Checks.NodeInfoStale.MaxAge = config.Duration{Duration: 7 * time.Minute} }))
		if err != nil || len(a.Changed) != 1 {
			t.Fatalf("Apply = %+v, %v; want NodeInfoStale changed", a, err)
		}
		time.Sleep(time.Minute)
		r.RunOnce(t.Context())
		if h, ok := r.Holding("NodeInfoStale"); !ok || h.Runs != 2 || !h.Since.Equal(start.Add(time.Minute)) {
			t.Errorf("the 2nd failed run, after the reload: Holding = %+v, %v; want 2 runs since the first", h, ok)
		}
		time.Sleep(time.Minute)
		r.RunOnce(t.Context())
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusUnknown || !c.LastTransitionTime.Equal(time.Now()) {
			t.Errorf("the 3rd failed run in a row, across a reload: %+v, want Unknown now", c)
		}
		if h, ok := r.Holding("NodeInfoStale"); ok {
			t.Errorf("Unknown, still held through %+v", h)
		}
	})
}

// runHoldDaemon runs NodeInfoStale's loop as the daemon does, its count of
// failed runs kept in store (Env.Memos), until stop is called.
func runHoldDaemon(t *testing.T, store *report.Store, probe Check) (stop func()) {
	t.Helper()
	env := testEnv(t, nil)
	env.Memos = store
	return loopNodeInfoIn(t, env, store, probe)
}

// failingAfter is NodeInfoStale's True until fail is set, then an error.
func failingAfter() (probeFunc, func(bool)) {
	return switchedProbe(outdated("age 6m"), returns(Result{}, errors.New("nodes.json: input/output error")))
}

// switchedProbe is before's probe until switched on (set(true)), then
// after's; set(false) switches it back.
func switchedProbe(before, after probeFunc) (probe probeFunc, set func(bool)) {
	var mu sync.Mutex
	on := false
	probe = func(ctx context.Context) (Result, error) {
		mu.Lock()
		p := before
		if on {
			p = after
		}
		mu.Unlock()
		return p(ctx)
	}
	return probe, func(v bool) { mu.Lock(); on = v; mu.Unlock() }
}

// A daemon restarted in the middle of a run of failed runs (systemctl
// restart, a crash, an OOM kill: Restart=always) carries the count on
// through the state file: the True is held through 2 failed runs in all,
// not 2 more after every start. Otherwise a check that fails at every run
// on a daemon restarted every 2 runs kept a stale True on the Node for
// ever. Each failed run has the state saved soon (Store.Touch), so a crash
// keeps the count too.
func TestRunnerHoldCountsFailuresAcrossARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		probe, setFail := failingAfter()
		start := time.Now()
		store := report.NewStore("b")
		stop := runHoldDaemon(t, store, probe)
		synctest.Wait()
		setFail(true)
		for k := 1; k <= 2; k++ {
			select {
			case <-store.Dirty():
			default:
			}
			time.Sleep(time.Until(start.Add(time.Duration(k)*time.Minute + time.Second)))
			synctest.Wait()
			if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusTrue || !c.LastTransitionTime.Equal(start) {
				t.Fatalf("failed run %d before the restart: %+v, want held True", k, c)
			}
			select {
			case <-store.Dirty():
			default:
				t.Errorf("failed run %d: the state file is not told (Store.Touch): a crash loses the count", k)
			}
		}
		stop()
		if err := store.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // RestartSec=5s
		for restart := 1; restart <= 3; restart++ {
			store = report.NewStore("b")
			if _, err := store.Load(dir); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			stop = runHoldDaemon(t, store, probe)
			synctest.Wait()
			if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed {
				t.Errorf("restart %d: the 3rd failed run in a row or later, after a restart: %+v, want Unknown/CheckFailed", restart, c)
			}
			time.Sleep(time.Until(began.Add(time.Minute + time.Second)))
			synctest.Wait()
			stop()
			if err := store.Save(dir, time.Now()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Second)
		}
	})
}

// A re-plan for a new role or GPU (the daemon's redetect) builds a new
// runner, whose checks carry on the count of the old one's: a role or GPU
// detected again does not give a failing check more failed runs before
// its True turns Unknown.
func TestRunnerHoldCountsFailuresAcrossAReplan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probe, setFail := failingAfter()
		start := time.Now()
		store := report.NewStore("b")
		stop := runHoldDaemon(t, store, probe)
		synctest.Wait()
		setFail(true)
		time.Sleep(time.Until(start.Add(2*time.Minute + time.Second)))
		synctest.Wait()
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusTrue {
			t.Fatalf("2 failed runs: %+v, want held True", c)
		}
		stop()
		stop = runHoldDaemon(t, store, probe) // the new plan's runner
		synctest.Wait()
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusUnknown || !c.LastTransitionTime.Equal(time.Now()) {
			t.Errorf("the 3rd failed run in a row, the first of the new plan's runner: %+v, want Unknown now", c)
		}
		stop()
	})
}
