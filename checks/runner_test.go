package checks

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
)

// probeFunc adapts a function to Check.
type probeFunc func(ctx context.Context) (Result, error)

func (f probeFunc) Probe(ctx context.Context) (Result, error) { return f(ctx) }

func fixed(c Check) Factory { return func(*Env) (Check, error) { return c, nil } }

func testEnv(t testing.TB, mutate func(c *config.Config)) *Env {
	t.Helper()
	c := config.Default()
	c.Runner.FirstRunSpread = config.Duration{Duration: 4 * time.Second}
	if mutate != nil {
		mutate(c)
	}
	return &Env{Config: c, NodeName: "n1", Role: report.RoleWorker, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Sys: upADay{RealSys()}, Now: time.Now}
}

// upADay is the host's system calls on a host booted a day ago: checks with
// a grace after the boot (ClockNotSynchronized, CNIUnhealthy) judge as they
// do for the life of a node, whenever the machine running the tests booted.
type upADay struct{ Sys }

func (upADay) SinceBoot() (time.Duration, error) { return 24 * time.Hour, nil }

var healthy = map[string]Result{
	"ClockNotSynchronized": {Status: report.StatusFalse, Reason: "ClockSynchronized"},
	"DiskUsageHigh":        {Status: report.StatusFalse, Reason: "DiskUsageOK"},
	"NodeInfoStale":        {Status: report.StatusFalse, Reason: "NodeInfoFresh"},
	"CNIUnhealthy":         {Status: report.StatusFalse, Reason: "CNIHealthy"},
}

// recordingFactories returns healthy checks that record when they ran.
func recordingFactories(start time.Time, runs *sync.Map) map[string]Factory {
	f := map[string]Factory{}
	for name, res := range healthy {
		f[name] = fixed(probeFunc(func(context.Context) (Result, error) {
			v, _ := runs.LoadOrStore(name, &[]time.Duration{})
			p := v.(*[]time.Duration)
			*p = append(*p, time.Since(start))
			return res, nil
		}))
	}
	return f
}

// The first runs are spread; then every check runs on its interval's grid
// from the runner's start, so checks due together run together.
func TestRunnerStaggersFirstRunsThenRunsOnAGrid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := testEnv(t, nil)
		start := time.Now()
		var runs sync.Map
		store := report.NewStore("b")
		r, err := NewRunner(env, Options{Store: store, Factories: recordingFactories(start, &runs)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var firstPass []time.Duration
		done := make(chan struct{})
		go func() {
			r.Run(ctx, func() { firstPass = append(firstPass, time.Since(start)) })
			close(done)
		}()
		time.Sleep(2*time.Minute + time.Millisecond)
		cancel()
		<-done

		// Catalog order: DiskUsageHigh, NodeInfoStale, ClockNotSynchronized, CNIUnhealthy;
		// first runs spread evenly over 4s, then on the grid.
		want := map[string][]time.Duration{
			"DiskUsageHigh":        {0, 2 * time.Minute},
			"NodeInfoStale":        {1 * time.Second, time.Minute, 2 * time.Minute},
			"ClockNotSynchronized": {2 * time.Second, time.Minute, 2 * time.Minute},
			"CNIUnhealthy":         {3 * time.Second, 30 * time.Second, time.Minute, 90 * time.Second, 2 * time.Minute},
		}
		for name, w := range want {
			v, ok := runs.Load(name)
			if !ok {
				t.Errorf("%s never ran", name)
				continue
			}
			if got := *v.(*[]time.Duration); !slices.Equal(got, w) {
				t.Errorf("%s ran at %v, want %v", name, got, w)
			}
		}
		if !slices.Equal(firstPass, []time.Duration{3 * time.Second}) {
			t.Errorf("first pass reported at %v, want once at 3s", firstPass)
		}
		if n := len(store.All()); n != 4 {
			t.Errorf("%d conditions in the store, want 4", n)
		}
	})
}

func runOnce(t *testing.T, name string, c Check, timeout time.Duration) report.Condition {
	t.Helper()
	env := testEnv(t, func(c *config.Config) {
		c.Checks.NodeInfoStale.Timeout = config.Duration{Duration: timeout}
	})
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Only: []string{name}, Factories: map[string]Factory{name: fixed(c)}})
	if err != nil {
		t.Fatal(err)
	}
	conds := r.RunOnce(t.Context())
	if len(conds) != 1 {
		t.Fatalf("RunOnce returned %d conditions", len(conds))
	}
	return conds[0]
}

func TestRunnerTurnsFailuresIntoUnknown(t *testing.T) {
	for _, tc := range []struct {
		name       string
		probe      probeFunc
		wantReason report.Reason
		wantMsg    string
	}{
		{"error", func(context.Context) (Result, error) { return Result{}, errors.New("nodes.json: permission denied") },
			report.ReasonCheckFailed, "nodes.json: permission denied"},
		{"timeout honouring ctx", func(ctx context.Context) (Result, error) { <-ctx.Done(); return Result{}, ctx.Err() },
			report.ReasonCheckTimeout, "check did not finish within its timeout of 5s"},
		{"panic", func(context.Context) (Result, error) { var m map[string]int; m["x"]++; return Result{}, nil },
			report.ReasonCheckPanicked, "check panicked: assignment to entry in nil map"},
		{"reason not in catalog", func(context.Context) (Result, error) {
			return Result{Status: report.StatusTrue, Reason: "Bogus"}, nil
		}, report.ReasonCheckFailed, `internal error: check returned status "True" with reason "Bogus", not in the catalog`},
		{"unknown with a catalog reason", func(context.Context) (Result, error) {
			return Result{Status: report.StatusUnknown, Reason: report.ReasonNoData, Message: "no nodes.json yet"}, nil
		}, report.ReasonNoData, "no nodes.json yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := runOnce(t, "NodeInfoStale", tc.probe, 5*time.Second)
				if c.Status != report.StatusUnknown || c.Reason != tc.wantReason || c.Message != tc.wantMsg {
					t.Errorf("got %s/%s %q, want Unknown/%s %q", c.Status, c.Reason, c.Message, tc.wantReason, tc.wantMsg)
				}
			})
		})
	}
}

// loopNodeInfo runs the runner's loop with one probe for NodeInfoStale
// (interval 1m, timeout 10s) until the returned stop is called.
func loopNodeInfo(t *testing.T, probe Check) (*report.Store, func()) {
	t.Helper()
	env := testEnv(t, nil)
	store := report.NewStore("b")
	return store, loopNodeInfoIn(t, env, store, probe)
}

// loopNodeInfoIn runs NodeInfoStale's loop with env, probe its probe and
// store its conditions, until stop is called.
func loopNodeInfoIn(t *testing.T, env *Env, store *report.Store, probe Check) (stop func()) {
	t.Helper()
	r, err := NewRunner(env, Options{Store: store, Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
	if err != nil {
		t.Fatal(err)
	}
	return runLoop(t, r)
}

// runLoop runs r's loop until stop is called, which waits for it to return.
func runLoop(t *testing.T, r *Runner) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { r.Run(ctx, nil); close(done) }()
	return func() { cancel(); <-done }
}

// A probe that ignores its context is abandoned at the timeout; while it is
// still stuck the next run does not start another one.
func TestRunnerDoesNotPileUpStuckProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var calls int
		var mu sync.Mutex
		probe := probeFunc(func(context.Context) (Result, error) {
			mu.Lock()
			calls++
			mu.Unlock()
			<-release
			return Result{Status: report.StatusFalse, Reason: "NodeInfoFresh"}, nil
		})
		store, stop := loopNodeInfo(t, probe)

		time.Sleep(10*time.Second + time.Millisecond) // past the 10s timeout
		synctest.Wait()
		c, _ := store.Get("NodeInfoStale")
		if c.Reason != report.ReasonCheckTimeout || c.Message != "check did not finish within its timeout of 10s" {
			t.Errorf("after the timeout: %+v", c)
		}
		time.Sleep(time.Minute) // the next run: the probe is still stuck
		synctest.Wait()
		c, _ = store.Get("NodeInfoStale")
		if c.Message != "the previous run (timeout 10s) has still not returned" {
			t.Errorf("second run: %+v", c)
		}
		mu.Lock()
		if calls != 1 {
			t.Errorf("probe started %d times while stuck, want 1", calls)
		}
		mu.Unlock()
		close(release)
		time.Sleep(time.Minute) // the probe returned; the next run starts a fresh one
		synctest.Wait()
		if c, _ = store.Get("NodeInfoStale"); c.Status != report.StatusFalse {
			t.Errorf("after release: %+v", c)
		}
		stop()
	})
}

func TestRunnerRecoversFromPanicAndKeepsRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		probe := probeFunc(func(context.Context) (Result, error) {
			n++
			if n == 1 {
				panic("boom")
			}
			return Result{Status: report.StatusFalse, Reason: "NodeInfoFresh"}, nil
		})
		store, stop := loopNodeInfo(t, probe)
		synctest.Wait()
		if c, _ := store.Get("NodeInfoStale"); c.Reason != report.ReasonCheckPanicked || c.Message != "check panicked: boom" {
			t.Errorf("after the panic: %+v", c)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusFalse {
			t.Errorf("the loop did not survive the panic: %+v", c)
		}
		stop()
	})
}

// A probe that ignores its context and takes longer than the interval
// (here 75 s, at a 1 min interval and 10 s timeout) makes runs alternate:
// one times out, the next finds it still running, the one after starts
// another that times out. That is one situation, not a change at every
// run: logged once, and once when the check works again.
func TestRunnerLogsAProbeThatOverrunsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		env := testEnv(t, nil)
		env.Log = slog.New(slog.NewTextHandler(&logs, nil))
		var mu sync.Mutex
		slow := true
		probe := probeFunc(func(context.Context) (Result, error) {
			mu.Lock()
			s := slow
			mu.Unlock()
			if s {
				time.Sleep(75 * time.Second)
			}
			return Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh}, nil
		})
		store := report.NewStore("b")
		r, err := NewRunner(env, Options{Store: store, Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { r.Run(ctx, nil); close(done) }()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		mu.Lock()
		slow = false
		mu.Unlock()
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		cancel()
		<-done
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusFalse {
			t.Fatalf("after the probe is fast again: %+v", c)
		}
		timedOut, still := strings.Count(logs.String(), "check timed out"), strings.Count(logs.String(), "check still running")
		if timedOut+still != 1 || strings.Count(logs.String(), "check works again") != 1 {
			t.Errorf("10 min of a probe overrunning its 1 min interval: %d 'timed out' and %d 'still running' lines, want 1 in all, then one 'works again':\n%s",
				timedOut, still, logs.String())
		}
	})
}

// goroutineID is the calling goroutine's number, from its stack's header.
func goroutineID() string {
	var buf [64]byte
	header := string(buf[:runtime.Stack(buf[:], false)])
	id, _, _ := strings.Cut(strings.TrimPrefix(header, "goroutine "), " ")
	return id
}

// A check's loop probes on one worker goroutine, run after run, through a
// panic and a probe stuck past its timeout; the worker ends with the loop.
func TestRunnerProbesOnOneWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var ids []string
		release := make(chan struct{})
		probe := probeFunc(func(context.Context) (Result, error) {
			mu.Lock()
			ids = append(ids, goroutineID())
			n := len(ids)
			mu.Unlock()
			switch n {
			case 2:
				panic("boom")
			case 3:
				<-release // past the timeout
			}
			return Result{Status: report.StatusFalse, Reason: "NodeInfoFresh"}, nil
		})
		store, stop := loopNodeInfo(t, probe)
		for range 3 {
			time.Sleep(time.Minute)
			synctest.Wait()
		}
		if c, _ := store.Get("NodeInfoStale"); c.Message != "the previous run (timeout 10s) has still not returned" {
			t.Errorf("while the third probe is stuck: %+v", c)
		}
		close(release)
		time.Sleep(time.Minute)
		synctest.Wait()
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusFalse {
			t.Errorf("after the stuck probe returned: %+v", c)
		}
		stop()
		mu.Lock()
		defer mu.Unlock()
		if len(ids) != 4 {
			t.Fatalf("%d probes, want 4", len(ids))
		}
		for _, id := range ids {
			if id != ids[0] {
				t.Errorf("probes ran on goroutines %v, want one", ids)
				break
			}
		}
		// synctest.Test fails if the worker outlives the loop.
	})
}

// A probe that ends its goroutine (runtime.Goexit) is reported like a
// panic, and the check runs on: a new worker takes its next runs.
func TestRunnerSurvivesAProbeThatEndsItsGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		n := 0
		probe := probeFunc(func(context.Context) (Result, error) {
			mu.Lock()
			n++
			first := n == 1
			mu.Unlock()
			if first {
				runtime.Goexit()
			}
			return Result{Status: report.StatusFalse, Reason: "NodeInfoFresh"}, nil
		})
		store, stop := loopNodeInfo(t, probe)
		synctest.Wait()
		if c, _ := store.Get("NodeInfoStale"); c.Reason != report.ReasonCheckPanicked || !strings.Contains(c.Message, "runtime.Goexit") {
			t.Errorf("after the probe ended its goroutine: %+v", c)
		}
		for range 3 {
			time.Sleep(time.Minute)
			synctest.Wait()
		}
		if c, _ := store.Get("NodeInfoStale"); c.Status != report.StatusFalse {
			t.Errorf("the check did not run on: %+v", c)
		}
		stop()
		mu.Lock()
		defer mu.Unlock()
		if n != 4 {
			t.Errorf("%d probes in 3 minutes, want 4", n)
		}
	})
}

// RunOnce (a goroutine per check) reports such a probe at once too, not
// after its timeout.
func TestRunOnceReportsAProbeThatEndsItsGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probe := probeFunc(func(context.Context) (Result, error) {
			runtime.Goexit()
			return Result{}, nil
		})
		store := report.NewStore("b")
		r, err := NewRunner(testEnv(t, nil), Options{Store: store, Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		r.RunOnce(t.Context())
		if c, _ := store.Get("NodeInfoStale"); c.Reason != report.ReasonCheckPanicked || time.Since(start) != 0 {
			t.Errorf("after %v: %+v, want CheckPanicked at once", time.Since(start), c)
		}
	})
}

func TestRunnerTransitionTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		results := []Result{
			{Status: report.StatusFalse, Reason: "NodeInfoFresh", Message: "age 10s"},
			{Status: report.StatusFalse, Reason: "NodeInfoFresh", Message: "age 20s"},
			{Status: report.StatusTrue, Reason: "NodeInfoOutdated", Message: "age 6m"},
			{Status: report.StatusTrue, Reason: "NodeInfoOutdated", Message: "age 7m"},
			{Status: report.StatusFalse, Reason: "NodeInfoFresh", Message: "age 1s"},
		}
		i := 0
		probe := probeFunc(func(context.Context) (Result, error) {
			r := results[min(i, len(results)-1)]
			i++
			return r, nil
		})
		start := time.Now()
		store, stop := loopNodeInfo(t, probe)
		wantLTT := []time.Duration{0, 0, 2 * time.Minute, 2 * time.Minute, 4 * time.Minute}
		for k, w := range wantLTT {
			synctest.Wait()
			c, _ := store.Get("NodeInfoStale")
			if got := c.LastTransitionTime.Sub(start); got != w || c.Message != results[k].Message {
				t.Errorf("run %d: transition at %v (%q), want %v (%q)", k, got, c.Message, w, results[k].Message)
			}
			time.Sleep(time.Minute)
		}
		stop()
	})
}

func TestPlan(t *testing.T) {
	env := testEnv(t, func(c *config.Config) { c.Checks.DiskUsageHigh.Enabled = false })
	states := map[string]PlanState{}
	for _, p := range Plan(env, nil, nil) {
		states[p.Desc.Type] = p.State
		if p.State != Scheduled && p.State != Elsewhere && (p.Placeholder.Status != report.StatusUnknown || p.Placeholder.Reason == "") {
			t.Errorf("%s: placeholder %+v", p.Desc.Type, p.Placeholder)
		}
	}
	if len(states) != len(report.Conditions) {
		t.Errorf("plan has %d conditions, the catalog %d", len(states), len(report.Conditions))
	}
	for name, want := range map[string]PlanState{
		"ClockNotSynchronized":         Scheduled,
		"DiskUsageHigh":                Disabled,
		"GpuActivationFailed":          NotApplicable, // not a GPU node
		"APIServerSourceIPUnavailable": NotApplicable, // a worker
		"ProxyNotServing":              Scheduled,     // worker-only, and this is a worker
	} {
		if states[name] != want {
			t.Errorf("%s: %s, want %s", name, states[name], want)
		}
	}
	env.Role = report.RoleControlPlane
	if got := Plan(env, []string{"ProxyNotServing"}, nil); len(got) != 1 || got[0].State != NotApplicable {
		t.Errorf("on a control plane node ProxyNotServing is planned %+v, want not-applicable", got)
	}
	if got := Plan(env, []string{"ClockNotSynchronized"}, nil); len(got) != 1 {
		t.Errorf("--only plan has %d entries", len(got))
	}
}

// A scheduled check whose interval or timeout is not positive (a Config built
// in code, or a catalog row without its config table) is refused: its loop
// would probe without pause.
func TestNewRunnerRefusesZeroIntervalOrTimeout(t *testing.T) {
	healthyProbe := fixed(probeFunc(func(context.Context) (Result, error) { return healthy["NodeInfoStale"], nil }))
	for _, tc := range []struct {
		name   string
		mutate func(c *config.Config)
		want   string
	}{
		{"zero interval", func(c *config.Config) { c.Checks.NodeInfoStale.Interval = config.Duration{} },
			"check NodeInfoStale: interval (0s) and timeout (10s) must be positive"},
		{"negative timeout", func(c *config.Config) { c.Checks.NodeInfoStale.Timeout = config.Duration{Duration: -time.Second} },
			"check NodeInfoStale: interval (1m0s) and timeout (-1s) must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(t, tc.mutate)
			r, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": healthyProbe}})
			if err == nil || err.Error() != tc.want {
				t.Fatalf("NewRunner = %v, %v; want error %q", r, err, tc.want)
			}
		})
	}
	// The same check disabled is not scheduled: its interval does not matter.
	env := testEnv(t, func(c *config.Config) {
		c.Checks.NodeInfoStale.Interval = config.Duration{}
		c.Checks.NodeInfoStale.Enabled = false
	})
	if _, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": healthyProbe}}); err != nil {
		t.Errorf("disabled check: %v", err)
	}
}

// A check that keeps failing the same way logs once, not every run: again
// when the error changes, and once when it works again.
func TestRunnerLogsAFailureOncePerChange(t *testing.T) {
	var logs testenv.SyncBuffer
	env := testEnv(t, nil)
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	var err error
	probe := probeFunc(func(context.Context) (Result, error) {
		if err != nil {
			return Result{}, err
		}
		return Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh}, nil
	})
	r, nerr := NewRunner(env, Options{Store: report.NewStore("b"), Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
	if nerr != nil {
		t.Fatal(nerr)
	}
	runs := func(n int, e error) {
		err = e
		for range n {
			r.RunOnce(t.Context())
		}
	}
	runs(2, nil)
	runs(5, errors.New("dial unix /run/dbus/system_bus_socket: connect: no such file or directory"))
	runs(3, errors.New("permission denied"))
	runs(2, nil)
	runs(1, errors.New("permission denied"))
	var failed, works []string
	for _, l := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(l, "check failed"):
			failed = append(failed, l)
		case strings.Contains(l, "check works again"):
			works = append(works, l)
		}
	}
	if len(failed) != 3 || !strings.Contains(failed[0], "no such file") || !strings.Contains(failed[1], "permission denied") {
		t.Errorf("want 3 'check failed' lines (dial, permission, permission again after recovery), got %d:\n%s", len(failed), logs.String())
	}
	if len(works) != 1 || !strings.Contains(works[0], "failed_runs=3") || !strings.Contains(works[0], `last_failure="failed: permission denied"`) {
		t.Errorf("want one 'check works again' line after 3 failed runs, got:\n%s", strings.Join(works, "\n"))
	}
}

// A check that panics at every run, or keeps returning a status and reason
// outside the catalog, logs it once per change as a failing check does, and
// once when it works again: not a stack trace at error priority every
// interval (every 10 s for the repair checks).
func TestRunnerLogsAPanicOncePerChange(t *testing.T) {
	var logs testenv.SyncBuffer
	env := testEnv(t, nil)
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	var mode string
	probe := probeFunc(func(context.Context) (Result, error) {
		switch mode {
		case "nil map":
			var m map[string]int
			m["x"]++
		case "boom":
			panic("boom")
		case "bad reason":
			return Result{Status: report.StatusTrue, Reason: "NotInTheCatalog"}, nil
		}
		return Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh}, nil
	})
	r, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
	if err != nil {
		t.Fatal(err)
	}
	runs := func(n int, m string) {
		mode = m
		for range n {
			r.RunOnce(t.Context())
		}
	}
	runs(5, "nil map")
	runs(3, "boom")
	runs(4, "bad reason")
	runs(2, "")
	// The lines without their stack traces.
	var msgs []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		l, _, _ = strings.Cut(l, " stack=")
		msgs = append(msgs, l)
	}
	all := strings.Join(msgs, "\n")
	count := func(s string) int { return strings.Count(all, s) }
	if n := count("check panicked"); n != 2 {
		t.Errorf("%d 'check panicked' lines for 5 runs of one panic and 3 of another, want 2:\n%s", n, all)
	}
	if n := count("that is not in the catalog"); n != 1 {
		t.Errorf("%d 'not in the catalog' lines for 4 runs, want 1:\n%s", n, all)
	}
	if n := count("check works again"); n != 1 || !strings.Contains(all, "failed_runs=4") {
		t.Errorf("want one 'check works again' line after 4 failed runs:\n%s", all)
	}
}

// watchingProbe is a check that wakes itself (a Watcher).
type watchingProbe struct {
	probeFunc
	wake chan func()
}

func (w watchingProbe) Watch(ctx context.Context, wake func()) { w.wake <- wake; <-ctx.Done() }

// A Watcher's wake runs its check before the interval, never sooner than
// minWakeGap after its previous run, and a burst of wakes is one run.
func TestRunnerWakesAWatcher(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var runs []time.Duration
		w := watchingProbe{probeFunc: func(context.Context) (Result, error) {
			mu.Lock()
			runs = append(runs, time.Since(start))
			mu.Unlock()
			return Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh}, nil
		}, wake: make(chan func(), 1)}
		env := testEnv(t, func(c *config.Config) { c.Runner.FirstRunSpread = config.Duration{} })
		store := report.NewStore("b")
		r, err := NewRunner(env, Options{Store: store, Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(w)}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx, nil); close(done) }()
		wake := <-w.wake
		synctest.Wait() // the first run, at 0
		time.Sleep(300 * time.Millisecond)
		for range 50 {
			wake()
		}
		synctest.Wait()
		time.Sleep(2 * time.Second) // past the gap
		synctest.Wait()
		if !r.Wake("NodeInfoStale") || r.Wake("NodeTampered") {
			t.Error("Wake: the runner's check is woken, another is not")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		want := []time.Duration{0, time.Second, 2300 * time.Millisecond}
		if !slices.Equal(runs, want) {
			t.Errorf("runs at %v, want %v (interval 1m)", runs, want)
		}
	})
}

func TestNextRun(t *testing.T) {
	anchor := time.Now()
	at := func(d time.Duration) time.Time { return anchor.Add(d) }
	for _, tc := range []struct {
		start, interval, want time.Duration
	}{
		{0, 10 * time.Second, 10 * time.Second},
		{3 * time.Second, 10 * time.Second, 10 * time.Second},                   // a first run in the spread
		{10*time.Second + time.Millisecond, 10 * time.Second, 20 * time.Second}, // a timer a little late
		{19 * time.Second, 10 * time.Second, 20 * time.Second},                  // a woken run, 1 s before the grid
		{19500 * time.Millisecond, 10 * time.Second, 30 * time.Second},          // 0.5 s before: the point after
		{45 * time.Second, 30 * time.Second, time.Minute},
		{7 * time.Second, 2 * time.Second, 8 * time.Second},
		{7900 * time.Millisecond, time.Second, 8 * time.Second}, // interval not over the gap
		{-time.Second, 10 * time.Second, 0},
	} {
		grid := tick.New(anchor)
		if got := nextRun(grid, at(tc.start), tc.interval).Sub(anchor); got != tc.want {
			t.Errorf("start %s, interval %s: next at %s, want %s", tc.start, tc.interval, got, tc.want)
		}
		if gap := nextRun(grid, at(tc.start), tc.interval).Sub(at(tc.start)); gap > tc.interval+minWakeGap || gap <= 0 {
			t.Errorf("start %s, interval %s: next after %s", tc.start, tc.interval, gap)
		}
	}
}

// deep uses about n KB of stack, as a probe deep in net/http, TLS or D-Bus
// decoding does.
//
//go:noinline
func deep(n int) int {
	var pad [1000]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		return int(pad[0])
	}
	return deep(n-1) + int(pad[n%len(pad)])
}

// BenchmarkRunOne is one run of a check whose probe uses 32 KB of stack: on
// the loop's worker, and ("goroutine") on a goroutine of its own, as each
// run was before, whose stack grew from the start every time.
func BenchmarkRunOne(b *testing.B) {
	env := testEnv(b, nil)
	probe := probeFunc(func(context.Context) (Result, error) {
		deep(32)
		return Result{Status: report.StatusFalse, Reason: "NodeInfoFresh"}, nil
	})
	r, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: []string{"NodeInfoStale"}, Factories: map[string]Factory{"NodeInfoStale": fixed(probe)}})
	if err != nil {
		b.Fatal(err)
	}
	e := r.current()[0]
	for _, worker := range []bool{true, false} {
		name := "worker"
		if !worker {
			name = "goroutine"
		}
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()
			var runs chan probeRun
			if worker {
				runs = make(chan probeRun)
				go e.worker(ctx, runs)
			}
			for b.Loop() {
				r.runOne(ctx, e, runs)
			}
		})
	}
}
