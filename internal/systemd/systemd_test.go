package systemd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A bus that accepts the connection and never answers (a hung
// dbus-daemon): the call gives up when its context is done, and the
// half-made connection is closed (the server sees it go).
func TestDialGivesUpWithTheCallsContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "bus")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	bus := NewDBusAt(sock)
	defer bus.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = bus.Unit(ctx, "kubelet.service")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Unit on a bus that never answers: %v, want the call's deadline", err)
	}
	var c net.Conn
	select {
	case c = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the client never connected")
	}
	defer c.Close()
	// The client's end is closed: reading on the server's end ends (EOF)
	// instead of waiting.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 256)
	for {
		_, err := c.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the half-made connection was left open")
		}
		if err != nil {
			break
		}
	}
}

// stateManager answers SystemState and a read of shutdown.target.
type stateManager struct {
	Manager
	state    string
	shutdown Unit
}

func (m stateManager) SystemState(context.Context) (string, error) { return m.state, nil }
func (m stateManager) Unit(_ context.Context, name string) (Unit, error) {
	if name != "shutdown.target" {
		return Unit{}, errors.New("not read here")
	}
	return m.shutdown, nil
}

// The system is stopping when systemd says so, and, before the boot
// finished (systemd then says "initializing" or "starting" whatever else
// happens), when shutdown.target is reached or its start job is queued.
func TestStopping(t *testing.T) {
	dead := Unit{Name: "shutdown.target", LoadState: "loaded", ActiveState: "inactive", SubState: "dead"}
	queued := dead
	queued.Job, queued.JobType = 12, "start"
	reached := dead
	reached.ActiveState, reached.SubState = "active", "active"
	for _, tc := range []struct {
		state    string
		shutdown Unit
		want     bool
	}{
		{"stopping", dead, true},
		{"running", dead, false},
		{"degraded", dead, false},
		{"maintenance", dead, false},
		{"running", queued, false}, // "stopping" is systemd's word once the boot finished
		{"starting", dead, false},
		{"starting", queued, true},
		{"initializing", reached, true},
	} {
		got, err := Stopping(context.Background(), stateManager{state: tc.state, shutdown: tc.shutdown})
		if err != nil || got != tc.want {
			t.Errorf("%s, shutdown.target %s/%s job %q: %v, %v; want %v", tc.state, tc.shutdown.ActiveState, tc.shutdown.SubState, tc.shutdown.JobType, got, err, tc.want)
		}
	}
}

// A job's result other than "done" is a *JobError: ErrJobFailed for
// errors.Is, worded as before, and "canceled" (another job replaced it)
// told apart, through Restart's wrapping.
func TestJobError(t *testing.T) {
	for _, tc := range []struct {
		result   string
		canceled bool
	}{{"dependency", false}, {"failed", false}, {"timeout", false}, {"canceled", true}} {
		err := fmt.Errorf("restart k.service: %w", &JobError{Unit: "k.service", Result: tc.result})
		if !errors.Is(err, ErrJobFailed) || JobCanceled(err) != tc.canceled {
			t.Errorf("%s: Is ErrJobFailed %v, JobCanceled %v", tc.result, errors.Is(err, ErrJobFailed), JobCanceled(err))
		}
		if want := `restart k.service: k.service: job result "` + tc.result + `": systemd job did not succeed`; err.Error() != want {
			t.Errorf("%q, want %q", err, want)
		}
	}
	if JobCanceled(errors.New("bus gone")) {
		t.Error("an error that is not a job's is canceled")
	}
}

// A failed service whose unit left the active state in its current run
// before its main process exited, with a result a stop ends with, was
// failed by a stop; the rest was failed by its process or by systemd's own
// kill.
func TestStopEndedFailed(t *testing.T) {
	stop := Unit{ActiveState: "failed", Result: "timeout", NotifyAccess: "none", MainStartMono: 10 * time.Second, ActiveExitMono: 20 * time.Second, MainExitMono: 21 * time.Second}
	for _, tc := range []struct {
		name string
		edit func(*Unit)
		want bool
	}{
		{"killed at its stop timeout", func(*Unit) {}, true},
		{"exited 1 on SIGTERM", func(u *Unit) { u.Result = "exit-code" }, true},
		{"crashed: its process exited first", func(u *Unit) { u.Result, u.MainExitMono = "signal", u.ActiveExitMono }, false},
		{"its watchdog", func(u *Unit) { u.Result = "watchdog" }, false},
		{"OOM kill under OOMPolicy=stop", func(u *Unit) { u.Result = "oom-kill" }, false},
		{"a start timeout: left active in a run before", func(u *Unit) { u.ActiveExitMono = 5 * time.Second }, false},
		{"not failed", func(u *Unit) { u.ActiveState = "inactive" }, false},
		{"timestamps not read", func(u *Unit) { u.ActiveExitMono, u.MainExitMono = 0, 0 }, false},
		// STOPPING=1, then exit 1: left active before its process exited,
		// with no stop.
		{"a service that may notify (Type=notify)", func(u *Unit) { u.Result, u.NotifyAccess = "exit-code", "main" }, false},
		{"NotifyAccess not read", func(u *Unit) { u.NotifyAccess = "" }, false},
		{"its RuntimeMaxSec reached", func(u *Unit) { u.RuntimeMax = time.Second }, false},
		{"exited 1 on SIGTERM, with a RuntimeMaxSec", func(u *Unit) { u.Result, u.RuntimeMax = "exit-code", time.Hour }, true},
	} {
		u := stop
		tc.edit(&u)
		if got := u.StopEndedFailed(); got != tc.want {
			t.Errorf("%s: %+v: StopEndedFailed %v, want %v", tc.name, u, got, tc.want)
		}
	}
}

// StoppedWithBound: a unit stopped by systemd because a unit it BindsTo=
// went down (it left active at or after that unit did, before that unit
// became active again), that unit running again, is no one's stop; one
// stopped by hand before the bound unit went down or after it came back,
// or stopped first by someone's stop of the bound unit (ordered after it),
// is; and none while the bound unit is down.
func TestStoppedWithBound(t *testing.T) {
	s := time.Second
	stopped := func(exit time.Duration) Unit {
		return Unit{Name: "kubelet.service", ActiveState: "inactive", ActiveExitMono: exit}
	}
	// containerd crashed at 100 s and its Restart= brought it back at 101 s.
	crashed := Bound{Name: "containerd.service", ActiveState: "active", ActiveExitMono: 100 * s, ActiveEnterMono: 101 * s}
	for _, tc := range []struct {
		name string
		u    Unit
		b    Bound
		want bool
	}{
		{"stopped by the crash", stopped(100*s + 20*time.Millisecond), crashed, true},
		{"stopped at the crash's microsecond", stopped(100 * s), crashed, true},
		{"stopped by hand before the crash", stopped(50 * s), crashed, false},
		{"stopped by hand after containerd came back", stopped(200 * s), crashed, false},
		{"stopped first by someone's stop of containerd", stopped(99*s + 900*time.Millisecond), crashed, false},
		{"containerd still down", stopped(100*s + 20*time.Millisecond), Bound{Name: "containerd.service", ActiveState: "activating", ActiveExitMono: 100 * s, ActiveEnterMono: 10 * s}, false},
		{"containerd never left active", stopped(100 * s), Bound{Name: "containerd.service", ActiveState: "active", ActiveEnterMono: 10 * s}, false},
		{"kubelet never left active (not started)", stopped(0), crashed, false},
		{"kubelet running", Unit{Name: "kubelet.service", ActiveState: "active", ActiveExitMono: 100*s + 20*time.Millisecond}, crashed, false},
	} {
		if got := StoppedWithBound(tc.u, tc.b); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// StoppedWithBoundCrashes: kubelet ran from 50 s, the daemon read
// containerd (NRestarts 3) at 90 s while kubelet ran; containerd crashed at
// 100 s (kubelet stopped by its BindsTo= at 100.02 s), came back at 101 s,
// crashed again at 102 s and came back at 103 s: systemd keeps only the
// second stop's times. Taken for systemd's stop only with containerd gone
// down twice since that read, running again, its last stop not before
// kubelet's, and the read made during kubelet's last run, before it left.
func TestStoppedWithBoundCrashes(t *testing.T) {
	s := time.Second
	kubelet := Unit{Name: "kubelet.service", ActiveState: "inactive", MainStartMono: 50 * s, ActiveExitMono: 100*s + 20*time.Millisecond}
	twice := Bound{Name: "containerd.service", ActiveState: "active", ActiveExitMono: 102 * s, ActiveEnterMono: 103 * s, NRestarts: 5}
	seen := BoundSeen{NRestarts: 3, At: 90 * s}
	with := func(f func(u *Unit, b *Bound, s *BoundSeen)) (Unit, Bound, BoundSeen) {
		u, b, s := kubelet, twice, seen
		f(&u, &b, &s)
		return u, b, s
	}
	for _, tc := range []struct {
		name string
		f    func(u *Unit, b *Bound, s *BoundSeen)
		want bool
	}{
		{"containerd crashed twice", func(*Unit, *Bound, *BoundSeen) {}, true},
		{"containerd crashed three times", func(_ *Unit, b *Bound, _ *BoundSeen) { b.NRestarts = 6 }, true},
		{"containerd crashed once (StoppedWithBound's)", func(_ *Unit, b *Bound, _ *BoundSeen) { b.NRestarts = 4 }, false},
		{"containerd not restarted since", func(_ *Unit, b *Bound, _ *BoundSeen) { b.NRestarts = 3 }, false},
		{"containerd's NRestarts reset since (a start by hand)", func(_ *Unit, b *Bound, _ *BoundSeen) { b.NRestarts = 1 }, false},
		{"NRestarts near its top", func(_ *Unit, b *Bound, s *BoundSeen) { s.NRestarts, b.NRestarts = 1<<32-2, 1<<32-1 }, false},
		{"containerd down again", func(_ *Unit, b *Bound, _ *BoundSeen) { b.ActiveState = "activating" }, false},
		{"kubelet stopped after containerd's last stop", func(u *Unit, _ *Bound, _ *BoundSeen) { u.ActiveExitMono = 102*s + time.Millisecond }, false},
		{"kubelet stopped after containerd came back", func(u *Unit, _ *Bound, _ *BoundSeen) { u.ActiveExitMono = 200 * s }, false},
		{"kubelet left active at containerd's last stop", func(u *Unit, _ *Bound, _ *BoundSeen) { u.ActiveExitMono = 102 * s }, true},
		{"read before kubelet's last run started", func(_ *Unit, _ *Bound, sn *BoundSeen) { sn.At = 40 * s }, false},
		{"read after kubelet left active", func(_ *Unit, _ *Bound, sn *BoundSeen) { sn.At = 101 * s }, false},
		{"no read (at 0)", func(_ *Unit, _ *Bound, s *BoundSeen) { s.At = 0 }, false},
		{"kubelet's start not read", func(u *Unit, _ *Bound, _ *BoundSeen) { u.MainStartMono = 0 }, false},
		{"kubelet never left active", func(u *Unit, _ *Bound, _ *BoundSeen) { u.ActiveExitMono = 0 }, false},
		{"kubelet failed", func(u *Unit, _ *Bound, _ *BoundSeen) { u.ActiveState = "failed" }, false},
		{"kubelet running", func(u *Unit, _ *Bound, _ *BoundSeen) { u.ActiveState = "active" }, false},
	} {
		u, b, sn := with(tc.f)
		if got := StoppedWithBoundCrashes(u, b, sn); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// StoppedBeforeBound: kubelet ran from 50 s and was stopped at 95 s; the
// daemon read containerd (NRestarts 3) at 90 s while kubelet ran. No stop
// of containerd stopped kubelet where containerd last left active after
// kubelet did and its Restart= has not brought it back since that read.
func TestStoppedBeforeBound(t *testing.T) {
	s := time.Second
	kubelet := Unit{Name: "kubelet.service", ActiveState: "inactive", MainStartMono: 50 * s, ActiveExitMono: 95 * s}
	seen := BoundSeen{NRestarts: 3, At: 90 * s}
	for _, tc := range []struct {
		name string
		b    Bound
		want bool
	}{
		{"containerd crashed after kubelet's stop, its Restart= to come", Bound{ActiveState: "activating", ActiveExitMono: 97 * s, NRestarts: 3}, true},
		{"containerd stopped by hand after kubelet (ordered after it)", Bound{ActiveState: "inactive", ActiveExitMono: 95*s + 100*time.Millisecond, NRestarts: 3}, true},
		{"containerd started by hand since (NRestarts reset)", Bound{ActiveState: "active", ActiveExitMono: 97 * s, ActiveEnterMono: 98 * s}, true},
		{"containerd's crash stopped kubelet, its Restart= to come", Bound{ActiveState: "activating", ActiveExitMono: 95*s - 20*time.Millisecond, NRestarts: 3}, false},
		{"containerd left active with kubelet", Bound{ActiveState: "activating", ActiveExitMono: 95 * s, NRestarts: 3}, false},
		{"containerd back once by its Restart=, down again after kubelet's stop", Bound{ActiveState: "activating", ActiveExitMono: 97 * s, NRestarts: 4}, false},
		{"containerd never left active", Bound{ActiveState: "active", ActiveEnterMono: 10 * s, NRestarts: 3}, false},
	} {
		if got := StoppedBeforeBound(kubelet, tc.b, seen); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if StoppedBeforeBound(Unit{ActiveState: "inactive"}, Bound{ActiveExitMono: 97 * s}, seen) {
		t.Error("kubelet never left active (no exit time): true, want false")
	}
}
