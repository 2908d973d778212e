package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"

	"github.com/syself/autopilot-health/internal/testenv"
)

// stopWithReloadInFlight starts a daemon with a control socket, asks it
// for a reload over the socket (`autopilot-health reload`) and holds the
// reload past its RELOADING=1 (the re-plan's lock, which the caller must
// unlock), then stops the daemon (SIGTERM). It returns Run's result and the
// client's answer.
func stopWithReloadInFlight(t *testing.T) (f *fileDaemon, runErr, answered chan error) {
	t.Helper()
	if os.Getuid() != 0 {
		testenv.Skip(t, "the control socket answers root only (TestControlRefusesANonRootPeer)")
	}
	sock := notifySocket(t)
	control := filepath.Join(t.TempDir(), "control.sock")
	f = newFileDaemon(t, "", Options{ControlSocket: control})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	runErr = make(chan error, 1)
	go func() { runErr <- f.Run(ctx) }()
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })

	f.planMu.Lock() // the reload stops before it applies
	answered = make(chan error, 1)
	go func() { _, err := RequestReload(control); answered <- err }()
	next(t, sock, "the reload's RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
	cancel() // SIGTERM
	next(t, sock, "STOPPING=1", func(m string) bool { return m == "STOPPING=1" })
	return f, runErr, answered
}

// A control request in flight when SIGTERM arrives (`autopilot-health
// reload` or `tamper clear` by hand as the daemon stops) gets its answer
// before the daemon exits: Run waits for the request's handler (a while:
// TestStopWaitsForAControlRequestAWhileOnly). Before, Run returned without
// waiting for it, the process exited, and the client printed "reading the
// daemon's answer: EOF".
func TestControlRequestInFlightAtStopIsAnswered(t *testing.T) {
	saved := controlStopWait
	t.Cleanup(func() { controlStopWait = saved })
	controlStopWait = time.Hour // the test, not the bound, ends the wait
	f, runErr, answered := stopWithReloadInFlight(t)

	// Run says it waits for the request, or returns without its answer.
	const waiting = "waiting for the control requests in flight to be answered"
	deadline := time.After(10 * time.Second)
	for !strings.Contains(f.logs.String(), waiting) {
		select {
		case err := <-runErr:
			f.planMu.Unlock()
			t.Fatalf("Run returned (%v) with a reload in flight on the control socket, its answer not written: the client reads EOF as the process exits", err)
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			f.planMu.Unlock()
			t.Fatalf("Run neither returned nor logged %q within 10s of the stop", waiting)
		}
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) while the reload in flight was held", err)
	default:
	}
	f.planMu.Unlock()
	if err := <-answered; err != nil {
		t.Errorf("the reload in flight at the stop: %v, want it answered", err)
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}

// The wait is bounded: a control request that does not end (a reload
// waiting on a check that does not stop) holds the stop controlStopWait at
// most, and the log says it stopped without that answer.
func TestStopWaitsForAControlRequestAWhileOnly(t *testing.T) {
	saved := controlStopWait
	t.Cleanup(func() { controlStopWait = saved })
	controlStopWait = 50 * time.Millisecond
	f, runErr, answered := stopWithReloadInFlight(t)
	defer func() { f.planMu.Unlock(); <-answered }()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run did not return within 10s of the stop with a control request held; the wait for it is %v", controlStopWait)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "stopping without the answer of the control requests still in flight") || !strings.Contains(logs, "requests=1") {
		t.Errorf("the stop without the held request's answer is not logged as such:\n%s", grepLines(logs, "control"))
	}
}

// holdLog holds the goroutine that logs a record whose message begins with
// prefix (the first one only) until release is closed; entered is closed
// when it arrives. The other records, from any goroutine, pass.
type holdLog struct {
	slog.Handler
	prefix           string
	once             *sync.Once
	entered, release chan struct{}
}

func (h holdLog) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		held := false
		h.once.Do(func() { held = true; close(h.entered) })
		if held {
			<-h.release
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h holdLog) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h holdLog) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// The tamper clear's path of TestControlRequestInFlightAtStopIsAnswered:
// `autopilot-health tamper clear` in flight when SIGTERM arrives (here held
// once the clear is applied, at its log line, until the stop waits for it)
// gets its answer before Run returns, and the answer is the stop's (the
// clear applied; the tamper checks run again at the next start), not a
// wait for checks that no longer run.
func TestTamperClearInFlightAtStopIsAnswered(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "the control socket answers root only (TestControlRefusesANonRootPeer)")
	}
	saved := controlStopWait
	t.Cleanup(func() { controlStopWait = saved })
	controlStopWait = time.Hour // the test, not the bound, ends the wait
	sock := notifySocket(t)
	control := filepath.Join(t.TempDir(), "control.sock")
	logs := &syncBuffer{}
	hold := holdLog{Handler: slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}),
		prefix: "tamper conditions cleared by an operator", once: &sync.Once{}, entered: make(chan struct{}), release: make(chan struct{})}
	d, err := New(tamperClearConfig(t), slog.New(hold), Options{Version: "test", Listener: newIdleListener(), ControlSocket: control})
	if err != nil {
		t.Fatal(err)
	}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold.release) }) }
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact) // a baseline to clear

	type clearAnswer struct {
		conds []report.Condition
		err   error
	}
	answered := make(chan clearAnswer, 1)
	go func() {
		conds, err := RequestTamperClear(control, "INC-10: reviewed", "uid 0")
		answered <- clearAnswer{conds, err}
	}()
	select {
	case <-hold.entered:
	case a := <-answered:
		t.Fatalf("the clear was answered (%v) without logging its clear", a.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the clear did not reach its log line within 10s")
	}
	cancel() // SIGTERM
	next(t, sock, "STOPPING=1", func(m string) bool { return m == "STOPPING=1" })

	// Run says it waits for the request, or returns without its answer.
	const waiting = "waiting for the control requests in flight to be answered"
	deadline := time.After(10 * time.Second)
	for !strings.Contains(logs.String(), waiting) {
		select {
		case err := <-runErr:
			t.Fatalf("Run returned (%v) with a tamper clear in flight on the control socket, its answer not written: the client reads EOF as the process exits", err)
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("Run neither returned nor logged %q within 10s of the stop", waiting)
		}
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) while the tamper clear in flight was held", err)
	default:
	}
	release()
	select {
	case a := <-answered:
		if a.err == nil || !strings.Contains(a.err.Error(), "cleared; the daemon is stopping before the tamper checks ran again") {
			t.Errorf("the tamper clear in flight at the stop: %v; want it answered as cleared, its checks left to the next start", a.err)
		}
		if len(a.conds) != 1 || a.conds[0].Type != "NodeTampered" {
			t.Errorf("the answer's conditions: %+v; want NodeTampered", a.conds)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the tamper clear in flight at the stop was not answered within 10s of its release")
	}
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of the clear's answer")
	}
}
