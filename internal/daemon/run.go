package daemon

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/trim"
	"github.com/syself/autopilot-health/kmsg"
)

// Run runs until ctx is done, then shuts down cleanly: conditions are left
// as they are (saved, never cleared).
func (d *Daemon) Run(ctx context.Context) error {
	d.mu.Lock()
	d.started = time.Now()
	notes := d.notes
	d.mu.Unlock()
	LogConfigNotes(d.log, notes, nil)
	srv := d.gate.server(d.Handler())
	srvErr := make(chan error, 1)
	// The loops stop when Run says, not with ctx: the kernel log reader
	// first (stopReader), then the others (cancel).
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	if ln := d.metricsListener(); ln != nil {
		serveMetrics(srv, d.gate.listener(ln), srvErr)
		d.log.Info("serving metrics", "addr", ln.Addr().String(), "checks", len(d.currentRunner().Checks()))
	} else {
		// The address could not be bound (New logged why): the daemon
		// works on, and the metrics are served once it can be.
		d.log.Info("starting without the metrics listener", "addr", d.cfg.Metrics.ListenAddress, "checks", len(d.currentRunner().Checks()))
		wg.Go(func() { d.retryMetrics(rctx, func(ln net.Listener) { serveMetrics(srv, d.gate.listener(ln), srvErr) }) })
	}
	wg.Go(func() { d.persist(rctx) })
	wg.Go(func() { d.watchdog(rctx, WatchdogInterval()) })
	wg.Go(func() { d.statusLoop(rctx) })
	// The status socket answers through the stop, until the final save
	// is done: meanwhile systemd shows the unit deactivating, and
	// `autopilot-health status` says so, not "not running".
	statusCtx, stopStatus := context.WithCancel(context.Background())
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		d.serveStatus(statusCtx)
	}()
	defer func() {
		stopStatus()
		<-statusDone
	}()
	stopReader := func() {}
	if d.kmsg != nil {
		// Before the reporter reads the Node: the kernel conditions are in
		// the store (Unknown until the log is read, or as restored from this
		// boot), and the reader follows the log.
		d.kmsg.Start(time.Now(), kmsg.BootWall())
		d.live.Expect("kmsg", kmsgReadTimeout)
		kctx, stop := context.WithCancel(rctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.newReader().Run(kctx)
		}()
		stopReader = func() { stop(); <-done }
	}
	wg.Go(func() { d.reportToKubernetes(rctx) })
	// Before the starting line: how long the start may take.
	d.extendStart(d.currentRunner())
	d.sendStatus() // starting: first pass of N checks
	wg.Go(func() { d.runChecks(rctx) })
	if d.control != nil {
		wg.Go(func() { d.serveControl(rctx, d.control) })
	}
	// The sockets' files removed while it runs are bound again.
	watch := d.watchSockets()
	wg.Go(func() { watch(rctx) })
	if d.cfgPath != "" {
		wg.Go(func() { d.reloadLoop(rctx, d.reloadSig) })
	}
	wg.Go(func() { d.trimAgain(rctx) })
	if d.cfg.Role == "" || d.cfg.GPU == "auto" {
		wg.Go(func() { d.redetect(rctx, d.cfg.Detect.Interval.Duration) })
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-srvErr:
		runErr = fmt.Errorf("metrics server: %w", err)
	}
	d.tellStopping()
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	d.log.Info("shutting down; conditions are left as they are")
	// The kernel log reader stops first, and handles no record after:
	// the Event writer's last send and its last snapshot for the state
	// file then hold the events of every record the cursor in the final
	// save counts as handled. Stopped together, a record the reader
	// handled after the writer's last send was in no Event, and the
	// cursor saved was past it (a record lost at a clean stop).
	stopReader()
	cancel()
	wg.Wait()
	// Before the final save: what a reload or a clear in flight changes
	// is saved with it.
	d.awaitControl()
	shCtx, shCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer shCancel()
	srv.Shutdown(shCtx)
	d.finalSaves()
	return runErr
}

// finalSaves makes the stop's saves of the state file and tamper.json, then
// releases the state directory's lock: it is another daemon's to take once
// nothing of this one writes there. A write left blocked in I/O may still
// rename its file into place, so the lock then stays until the process
// exits, which the kernel makes wait for that write's return (a thread in
// D state), and the rename then never runs.
func (d *Daemon) finalSaves() {
	stateInFlight := d.finalSave()
	tamperInFlight := d.finalTamperSave()
	if d.unlockState != nil && !stateInFlight && !tamperInFlight {
		d.unlockState()
	}
}

// runChecks runs the current runner until ctx is done, and swaps in a new
// one when the plan changes (see redetect). The first full pass (of
// whichever runner gets there) makes the daemon ready.
func (d *Daemon) runChecks(ctx context.Context) {
	for {
		r := d.currentRunner()
		d.extendStart(r)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Run(rctx, func() { d.firstPass.Do(d.becomeReady) })
		}()
		select {
		case <-ctx.Done():
		case <-d.replan:
		}
		cancel()
		<-done
		if ctx.Err() != nil {
			return
		}
		// The old runner's loops have returned: a run of a check the new
		// plan dropped that ended after replanIdentity removed its series
		// cannot bring them back now.
		next := d.currentRunner().Checks()
		for _, c := range r.Checks() {
			if !slices.Contains(next, c) {
				d.checkStopped(c)
			}
		}
	}
}

// firstPassSlack is added to a runner's FirstPassBound for what a first
// pass waits on besides its checks (the scheduler of a loaded node).
const firstPassSlack = 30 * time.Second

// extendStart tells systemd, until the first pass is over, how long the
// first pass of r may take: READY=1 waits for every check's first run,
// which runner.first_run_spread (up to 5 min) and a check's timeout (up to
// its interval) may put past the unit's TimeoutStartSec= (3 min), and
// systemd would stop the daemon and start it again, each time before it
// is ready. A runner of a new plan (redetect) starts its first runs again;
// one already told of is not told again, unless again: a reload's Apply
// started first runs of r anew, from now (extendStartAgain).
func (d *Daemon) extendStart(r *checks.Runner) { d.tellFirstPassBound(r, false) }

// extendStartAgain tells systemd the first pass's length again from now,
// when a reload during the first pass started or changed checks of r:
// their first runs start from now, with their new timeouts, and READY=1
// waits for them. Told at the start only, a timeout raised past what
// systemd was told timed the start out.
func (d *Daemon) extendStartAgain(r *checks.Runner) { d.tellFirstPassBound(r, true) }

func (d *Daemon) tellFirstPassBound(r *checks.Runner, again bool) {
	bound := r.FirstPassBound() + firstPassSlack
	sent := false
	err := d.tell(func(n Notifier) error {
		// Looked at under the lock READY=1 is sent under (becomeReady
		// closes firstPassDone before it): looked at before it, a first
		// pass that ended in between had sent READY=1 already, and an
		// extension after it pushes the running unit's watchdog
		// deadline out.
		select {
		case <-d.firstPassDone:
			return nil
		default:
		}
		if d.sdExtendedFor == r && !again {
			return nil // Run's, before the starting line
		}
		d.sdExtendedFor, sent = r, true
		return n.ExtendStart(bound)
	})
	if err != nil {
		d.log.Warn("sd_notify EXTEND_TIMEOUT_USEC failed", "err", err)
	} else if sent {
		d.log.Debug("the first pass may take up to this long; systemd's start timeout is extended to it", "bound", bound)
	}
}

// trimAgainAfter is how long after the first pass the start-up pages are
// let go once more (trimAgain).
var trimAgainAfter = time.Minute

// trimAgainGrid is the step of the grid the second trim falls on.
var trimAgainGrid = 10 * time.Second

// trimAgain lets the binary's start-up pages go once more, a minute (and
// up to 10 s more, on the grid) after the first pass: the report
// annotations are first written only after the first pass, and the
// Kubernetes side's start (the kubeconfig read, the TLS handshake, the
// Node's conditions adopted, the first patches) may end after it too; what
// they touched once need not stay resident either.
func (d *Daemon) trimAgain(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-d.firstPassDone:
	}
	at := time.Now().Add(trimAgainAfter)
	t := time.NewTimer(trimAgainAfter + d.grid().Until(at, trimAgainGrid))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if n, err := trim.StartupPages(); err == nil {
		d.log.Debug("trimmed the pages of the binary once more", "advised_bytes", n)
	}
}

// becomeReady records the first full pass and tells systemd.
func (d *Daemon) becomeReady() {
	// The metric first: whoever sees the daemon ready sees it in /metrics.
	d.metrics.SetReady(true)
	d.mu.Lock()
	d.ready = true
	d.mu.Unlock()
	close(d.firstPassDone)
	status := d.StatusLine()
	d.log.Info("first pass complete", "status", status)
	// What start-up touched of the binary need not stay resident.
	if n, err := trim.StartupPages(); err != nil {
		d.log.Debug("not trimming the start-up pages of the binary", "err", err)
	} else {
		d.log.Debug("trimmed the start-up pages of the binary", "advised_bytes", n)
	}
	// Before READY=1: a file written after it is a reload of its own.
	d.reloadIfChangedDuringStart()
	// The line of now, not the one logged: a check whose result changed
	// since has had its line sent by the status loop.
	if err := d.sendReady(); err != nil {
		d.log.Warn("sd_notify READY failed", "err", err)
	}
	close(d.readySent)
}
