//go:build integration

package tests

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// crashLoopUnit fails 0.2 s after each start (exit 1) and is restarted by
// systemd (Restart=always, RestartSec=100ms) until its start limit, burst
// starts in 60 s: then it stays failed.
func crashLoopUnit(burst int) string {
	return fmt.Sprintf("[Unit]\nDefaultDependencies=no\nStartLimitBurst=%d\nStartLimitIntervalSec=60\n"+
		"[Service]\nExecStart=/bin/sh -c 'sleep 0.2; exit 1'\nRestart=always\nRestartSec=100ms\n", burst)
}

// seenState is one read of a unit: its ActiveState/SubState.
type seenState struct{ active, sub string }

func (s seenState) String() string { return s.active + "/" + s.sub }

// compact is the states read, repeats folded: "a/b x3 -> c/d".
func compact(seen []seenState) string {
	var parts []string
	for i := 0; i < len(seen); {
		j := i
		for j < len(seen) && seen[j] == seen[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%s x%d", seen[i], j-i))
		i = j
	}
	return strings.Join(parts, " -> ")
}

// A method call cannot see the failed a unit passes through before systemd
// restarts it automatically: systemd, one thread, sets failed and then
// auto-restart in one call (service_enter_dead; in 254 and later the first
// of the two is failed-before-auto-restart) and answers calls only between
// such calls. A crash-looping Restart=always unit is read as fast as two
// readers can (the daemon's read, ListUnitsByNames with its Gets, and a
// Properties.GetAll of its Unit interface) until its start limit leaves it
// failed: no read sees failed but the last, lasting one. Only a
// PropertiesChanged signal (the daemon subscribes to none) tells the
// passing failed: systemd sends out the pending one before each state
// change. ServiceNotRecovering's wait for a restart after a failed it
// reads (settle, 50 ms re-reads for up to twice RestartSec) never had
// anything to wait for.
func TestFailedIsNeverSeenBeforeAnAutomaticRestart(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const unit = "crashloop.service"
	const burst = 5
	if err := s.AddUnit(ctx, unit, crashLoopUnit(burst)); err != nil {
		t.Fatal(err)
	}
	defer s.Bus.ResetFailed(ctx, unit)
	defer s.StopUnit(ctx, unit)

	conn, err := systemd.DialBus(ctx, s.BusSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var path godbus.ObjectPath
	mgr := conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
	if err := mgr.CallWithContext(ctx, "org.freedesktop.systemd1.Manager.LoadUnit", 0, unit).Store(&path); err != nil {
		t.Fatal(err)
	}
	// The signals of the unit, on a connection of their own.
	sigConn, err := systemd.DialBus(ctx, s.BusSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer sigConn.Close()
	if err := sigConn.AddMatchSignal(godbus.WithMatchObjectPath(path), godbus.WithMatchInterface("org.freedesktop.DBus.Properties"), godbus.WithMatchMember("PropertiesChanged")); err != nil {
		t.Fatal(err)
	}
	signals := make(chan *godbus.Signal, 4096)
	sigConn.Signal(signals)
	if err := sigConn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Err; err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	var listed, got []seenState
	var listErr, getErr error
	wg.Add(2)
	go func() { // the daemon's read
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			u, err := s.Bus.Unit(ctx, unit)
			if err != nil {
				listErr = err
				return
			}
			listed = append(listed, seenState{u.ActiveState, u.SubState})
		}
	}()
	go func() { // GetAll of the Unit interface
		defer wg.Done()
		obj := conn.Object("org.freedesktop.systemd1", path)
		for {
			select {
			case <-done:
				return
			default:
			}
			var props map[string]godbus.Variant
			if err := obj.CallWithContext(ctx, "org.freedesktop.DBus.Properties.GetAll", 0, "org.freedesktop.systemd1.Unit").Store(&props); err != nil {
				getErr = err
				return
			}
			a, _ := props["ActiveState"].Value().(string)
			b, _ := props["SubState"].Value().(string)
			got = append(got, seenState{a, b})
		}
	}()
	start := time.Now()
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	// burst starts of 0.3 s each, then the start limit: failed for good.
	final := waitUnit(t, s, unit, "failed at its start limit", func(u systemd.Unit) bool {
		return u.ActiveState == "failed" && u.Job == 0 && u.NRestarts == burst
	})
	time.Sleep(500 * time.Millisecond) // reading on: it stays failed
	close(done)
	wg.Wait()
	if listErr != nil || getErr != nil {
		t.Fatalf("reading %s: %v, %v", unit, listErr, getErr)
	}
	t.Logf("%s at its start limit after %s: result %s, NRestarts %d", unit, time.Since(start).Round(time.Millisecond), final.Result, final.NRestarts)

	for _, r := range []struct {
		how  string
		seen []seenState
	}{{"ListUnitsByNames", listed}, {"GetAll", got}} {
		t.Logf("%s, %d reads: %s", r.how, len(r.seen), compact(r.seen))
		autoRestarts, firstFailed := 0, -1
		for i, st := range r.seen {
			if st.sub == "auto-restart" && (i == 0 || r.seen[i-1].sub != "auto-restart") {
				autoRestarts++
			}
			if st.active == "failed" && firstFailed < 0 {
				firstFailed = i
			}
			if firstFailed >= 0 && st.active != "failed" {
				t.Errorf("%s: read %d saw %s after read %d saw %s: a failed that systemd restarted was seen", r.how, i, st, firstFailed, r.seen[firstFailed])
				break
			}
		}
		// The reads were fast enough to see the restarts' delays: a
		// failed in between would have been seen as well.
		if autoRestarts < burst-1 {
			t.Errorf("%s: saw %d auto-restart waits of %d: the reads were too slow to tell", r.how, autoRestarts, burst)
		}
		if firstFailed < 0 || r.seen[len(r.seen)-1].active != "failed" {
			t.Errorf("%s: the lasting failed was not read", r.how)
		}
	}

	// The signals tell each failed the unit passed through: it did, once
	// per run that systemd restarted.
	var announced []string
	for len(signals) > 0 {
		sig := <-signals
		if len(sig.Body) < 2 {
			continue
		}
		if iface, _ := sig.Body[0].(string); iface != "org.freedesktop.systemd1.Unit" {
			continue
		}
		changed, _ := sig.Body[1].(map[string]godbus.Variant)
		if a, ok := changed["ActiveState"].Value().(string); ok && (len(announced) == 0 || announced[len(announced)-1] != a) {
			announced = append(announced, a)
		}
	}
	restartedAfterFailed := 0
	for i := 1; i < len(announced); i++ {
		if announced[i-1] == "failed" && announced[i] != "failed" {
			restartedAfterFailed++
		}
	}
	t.Logf("ActiveState in PropertiesChanged signals: %s", strings.Join(announced, " -> "))
	if restartedAfterFailed != burst {
		t.Errorf("the signals said failed, then not, %d times, want %d (each run's failure before its restart)", restartedAfterFailed, burst)
	}
}

// countingBus counts a Manager's single-unit reads (Unit), the re-reads of
// one unit; Units, the read of a run, passes through.
type countingBus struct {
	*systemd.DBus
	unitReads atomic.Int32
}

func (b *countingBus) Unit(ctx context.Context, name string) (systemd.Unit, error) {
	b.unitReads.Add(1)
	return b.DBus.Unit(ctx, name)
}

// A critical unit that systemd's automatic restarts drove into its start
// limit stays failed, and systemd 252 keeps its last run's result
// (exit-code, not start-limit-hit). ServiceNotRecovering reads it once per
// run and says failed: it re-read it every 50 ms for up to twice its
// RestartSec (a second here; with containerd's 5 s, 9 s of the run's 10 s
// timeout), at every run, for as long as it stayed failed.
func TestServiceNotRecoveringReadsAUnitAtItsStartLimitOnce(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const unit = "crashlimit.service"
	if err := s.AddUnit(ctx, unit, crashLoopUnit(3)); err != nil {
		t.Fatal(err)
	}
	defer s.Bus.ResetFailed(ctx, unit)
	defer s.StopUnit(ctx, unit)
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	u := waitUnit(t, s, unit, "failed at its start limit", func(u systemd.Unit) bool {
		return u.ActiveState == "failed" && u.Job == 0 && u.NRestarts == 3
	})
	t.Logf("%s: %s/%s, result %s, NRestarts %d", unit, u.ActiveState, u.SubState, u.Result, u.NRestarts)

	bus := &countingBus{DBus: s.Bus}
	env, _ := sdEnv(t, s, func(c *config.Config) { c.Checks.ServiceNotRecovering.WorkerUnits = []string{unit} })
	env.Systemd = bus
	c, err := checks.NewForTest("ServiceNotRecovering", env)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // the check's default timeout
	defer cancel()
	began := time.Now()
	r, err := c.Probe(rctx)
	took := time.Since(began)
	if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonUnitFailed || r.Message != unit+" is failed ("+u.Result+")" {
		t.Errorf("a unit at its start limit: %+v, %v", r, err)
	}
	if n := bus.unitReads.Load(); n != 0 {
		t.Errorf("%s, failed at its start limit (result %s): re-read %d times in one run (%s), want 0: read once with the run's units", unit, u.Result, n, took.Round(time.Millisecond))
	}
}
