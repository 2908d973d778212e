package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// The control socket: one JSON request and one JSON answer per connection,
// from root only (the peer's credentials, SO_PEERCRED). Its operations: the
// operator's clear of the tamper conditions (`autopilot-health tamper
// clear`: never automatic, always logged and evented), and a reload of the
// configuration that answers with its outcome (`autopilot-health reload`,
// the unit's ExecReload=: a refused file fails `systemctl reload`).

// ControlRequest is a request on the control socket.
type ControlRequest struct {
	Op string `json:"op"` // "tamper-clear" or "reload"
	// Reason is why the operator clears (required for tamper-clear).
	Reason string `json:"reason"`
	// By names the operator as the client knows it (login user); the
	// daemon adds the peer's uid and pid.
	By string `json:"by"`
	// Until is when the client stops waiting for the answer (the
	// client's clock: it runs on the daemon's host). A request waits in
	// the socket's backlog while the daemon starts (the socket is bound
	// in New, served once Run begins) or is frozen; one the daemon gets
	// to after its client gave up, and told the operator it failed, is
	// not applied (a clear with too little time left to be applied and
	// answered neither): it is logged. Zero (an older client): applied.
	Until time.Time `json:"until,omitzero"`
}

// ControlAnswer is the daemon's answer.
type ControlAnswer struct {
	Error string `json:"error,omitempty"`
	// Conditions are the tamper conditions after the clear's re-evaluation.
	Conditions []report.Condition `json:"conditions,omitempty"`
	// Reloaded says what a reload changed (Reloaded.Text).
	Reloaded string `json:"reloaded,omitempty"`
	// Refused: the reload was refused (Error says why: the file's line
	// and key, or the keys that need a restart); the daemon runs on.
	Refused bool `json:"refused,omitempty"`
}

// The operations.
const (
	// OpTamperClear clears the tamper conditions.
	OpTamperClear = "tamper-clear"
	// OpReload reads the configuration file again (ReloadNotified).
	OpReload = "reload"
)

// maxControlRequest bounds a request.
const maxControlRequest = 8 << 10

// reloadWait bounds how long a reload over the control socket is waited
// for.
const reloadWait = 2 * time.Minute

// clearSettle bounds how long a clear waits for the re-evaluation.
const clearSettle = 30 * time.Second

// clearApply bounds how long a clear takes to be applied (the state file's
// save and tamper.json's, tamper.SaveWait each) and answered: a clear
// whose client waits less than this longer is not applied.
const clearApply = 2*tamper.SaveWait + time.Second

// The clients' waits for the answer (askControl); variables for tests.
var (
	reloadClientWait = reloadWait + 10*time.Second
	clearClientWait  = clearSettle + 15*time.Second
)

// listenControl creates the control socket: its directory 0700, the socket
// 0600, a stale socket of an earlier run replaced. Its look for a daemon
// answering, the removal of a stale socket and the bind are one step under
// an exclusive flock of the socket's directory: two daemons started at once
// (the unit's and one run by hand) each found nothing answering, and the
// later removed the earlier's fresh socket as stale and bound its own, so
// both ran on the same state directory, the earlier with no socket file
// (no reload, no tamper clear). A start that finds the lock held refuses,
// as one that finds a daemon answering does: another is starting.
func listenControl(path string, log *slog.Logger) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	unlock, err := lockStart(dir, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer unlock()
	ln, id, err := takeSocket(path, "another daemon is listening")
	if err != nil {
		return nil, err
	}
	return newSocketListener(path, ln, id), nil
}

// takeSocket binds a Unix socket at path where no daemon answers there
// (daemonAnswers: its error says words where one does): a socket file left
// by a daemon that is gone is replaced, anything else there left, its
// error naming it (removeStaleSocket). The start of both sockets and their
// rebind take the path so.
func takeSocket(path, words string) (*net.UnixListener, fileID, error) {
	if err := daemonAnswers(path, words); err != nil {
		return nil, fileID{}, err
	}
	socketDialed()
	if err := removeStaleSocket(path); err != nil {
		return nil, fileID{}, err
	}
	return bindSocket(path)
}

// lockStart takes the exclusive flock of dir (listenControl) without
// waiting, and returns its release. Held, it is another daemon starting.
// A lock the file system refuses for another reason (flock not supported,
// ENOLCK) is gone without, as before: a daemon that refused to start would
// leave the node without health reporting. That is logged, once (a
// warning naming the directory and the error): two daemons started at
// once may then both take the socket.
func lockStart(dir string, log *slog.Logger) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	switch err := flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		f.Close()
		return nil, errors.New("another daemon is starting on it (its directory is locked)")
	case err != nil:
		f.Close()
		log.Warn("control socket: its directory cannot be locked, so the start goes on without the lock (two daemons started at once could both take the socket)", "dir", dir, "err", err)
		return func() {}, nil
	}
	return func() { f.Close() }, nil
}

// daemonAnswers dials the socket at path: nil only where nothing listens
// there (ECONNREFUSED: a stale socket file, or no socket; ENOENT: no
// file), else an error: a daemon that accepts (words say so), one whose
// backlog is full (a frozen or stopped daemon: a connect fails at once,
// EAGAIN), and any other error (EACCES, EPROTOTYPE: a socket of another
// type that something holds), which cannot tell that the socket is stale,
// and is no socket to remove. Each says how to find the process. A path
// that holds no socket (Lstat) is nil whatever the connect's error, for
// removeStaleSocket to name it
// (TestSocketPathThatIsNotASocketIsKept).
func daemonAnswers(path, words string) error {
	// Something not a socket (a file, a directory, a symlink) is left to
	// removeStaleSocket, which names it, before any connect: one through a
	// symlink may reach a socket that answers (this daemon's other one, at
	// a rebind), which would read as another daemon at the path.
	if fi, err := os.Lstat(path); err == nil && notASocket(fi) != "" {
		return nil
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	find := fmt.Sprintf("`ss -xlp src %s` names its process: stop it (one stopped by SIGSTOP or Ctrl-Z takes a `kill -CONT` first)", path)
	switch {
	case err == nil:
		c.Close()
		return fmt.Errorf("%s: %s; %s", path, words, find)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, os.ErrNotExist):
		return nil
	case errors.Is(err, syscall.EAGAIN):
		return fmt.Errorf("%s: another daemon is listening, but takes no connection (its listen backlog is full: it may be hung or stopped); %s", path, find)
	}
	if fi, lerr := os.Lstat(path); lerr == nil && notASocket(fi) != "" {
		// Put there since the look above: removeStaleSocket names it.
		return nil
	}
	return fmt.Errorf("%s: not known to be stale (a connect failed: %w), so left as it is: another daemon may hold it; %s", path, err, find)
}

// flock is syscall.Flock (tests make it fail as a file system without
// locks does).
var flock = syscall.Flock

// socketDialed runs between takeSocket's dial that found nothing
// answering and its removal of a stale socket (tests put another start
// there).
var socketDialed = func() {}

// removeStaleSocket removes the socket file at path that nothing answers
// on (a daemon that is gone left it). Anything else there (a file, a
// directory, a symlink: the key set to a path in use) is left as it is,
// and the error names it: a socket path is never made room for by
// deleting what holds it.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if what := notASocket(fi); what != "" {
		return fmt.Errorf("%s: not a socket but %s, left as it is (only a socket file left by a daemon that is gone is replaced): name another path or move it away", path, what)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// serveControl answers control requests until ctx is done.
// An accept that fails (out of descriptors: EMFILE) is tried again with
// backoff (retryListener): the socket serves on once it works again.
func (d *Daemon) serveControl(ctx context.Context, ln net.Listener) {
	ln = newRetryListener(ln, listenerControl, d.log, d.acceptFailures(listenerControl))
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error("control socket failed; tamper clear and reload (systemctl reload) are not possible until the daemon restarts (kill -HUP still reloads)", "err", err)
			}
			return
		}
		// Counted before serveControl returns: Run waits for the
		// handlers (awaitControl) once it has.
		d.controlN.Add(1)
		d.controlWG.Go(func() {
			defer d.controlN.Add(-1)
			d.handleControl(ctx, c.(*net.UnixConn))
		})
	}
}

// controlStopWait bounds how long a stop waits for the control requests in
// flight (awaitControl). A variable for tests.
var controlStopWait = 2 * time.Second

// awaitControl waits, controlStopWait at most, for the control requests in
// flight to be answered: a reload or a tamper clear asked for as the daemon
// stops gets its answer before the process exits, not a connection closed
// under it (the client's "reading the daemon's answer: EOF"). A tamper
// clear answers soon then (ClearTamper does not wait for the checks once
// the daemon stops); a reload ends when it has applied or been refused. One that takes longer (a reload waiting on a
// check that does not stop) does not hold up the stop: it is logged, and
// its client sees the connection closed. For Run, once serveControl has
// returned (no request is counted after).
func (d *Daemon) awaitControl() {
	n := d.controlN.Load()
	if n == 0 {
		return
	}
	d.log.Info("waiting for the control requests in flight to be answered before stopping", "requests", n, "at_most", controlStopWait)
	done := make(chan struct{})
	go func() {
		d.controlWG.Wait()
		close(done)
	}()
	t := time.NewTimer(controlStopWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		d.log.Warn("stopping without the answer of the control requests still in flight: their clients see the connection closed",
			"requests", d.controlN.Load(), "waited", controlStopWait)
	}
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

func (d *Daemon) handleControl(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(clearSettle + 10*time.Second))
	answer := func(a ControlAnswer) { json.NewEncoder(c).Encode(a) }
	cred, err := peerCred(c)
	if err != nil {
		answer(ControlAnswer{Error: "cannot read the peer's credentials: " + err.Error()})
		return
	}
	var req ControlRequest
	line, err := bufio.NewReader(&limitedReader{c, maxControlRequest}).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	switch {
	case err != nil:
		answer(ControlAnswer{Error: "bad request: " + err.Error()})
	case cred.Uid != 0:
		d.log.Warn("control request refused: not root", "op", req.Op, "uid", cred.Uid, "pid", cred.Pid)
		answer(ControlAnswer{Error: fmt.Sprintf("refused: only root may %s (you are uid %d)", req.Op, cred.Uid)})
	case !req.Until.IsZero() && time.Until(req.Until) < needed(req.Op):
		// Its client has given up (or is about to) and told the
		// operator the request failed: applied now, a clear would drop
		// the findings behind the back of an operator who believes it
		// did not run.
		d.log.Warn("control request not applied: its client stopped waiting for the answer before the daemon got to it (sent while the daemon was starting, or was not answering)",
			"op", req.Op, "client_waited_until", req.Until.UTC().Format(time.RFC3339Nano), "uid", cred.Uid, "pid", cred.Pid)
		answer(ControlAnswer{Error: "not applied: the daemon got to the request after its client stopped waiting; ask again"})
	case req.Op == OpReload:
		// A reload waits for the checks it stops, each within its
		// timeout: the client waits as long.
		c.SetDeadline(time.Now().Add(reloadWait))
		r, err := d.ReloadNotified()
		if err != nil {
			answer(ControlAnswer{Error: err.Error(), Refused: true})
			return
		}
		answer(ControlAnswer{Reloaded: r.Text()})
	case req.Op != OpTamperClear:
		answer(ControlAnswer{Error: fmt.Sprintf("unknown operation %q (this daemon is version %s: restart it if the binary was updated)", req.Op, d.version)})
	case strings.TrimSpace(req.Reason) == "":
		answer(ControlAnswer{Error: "a reason is required (--reason): a clear is a deliberate act, and its reason is logged and evented"})
	case ctx.Err() != nil:
		// The daemon stops (SIGTERM; the request waited in the backlog,
		// or was read after): applied now, the tamper checks would not
		// run again, the clear would reach no Node, and the next start
		// would hold the conditions True as saved.
		d.log.Warn("tamper clear refused: the daemon is stopping", "reason", req.Reason, "uid", cred.Uid, "pid", cred.Pid)
		answer(ControlAnswer{Error: "not applied: the daemon is stopping (SIGTERM); clear again once it runs (systemctl status autopilot-health)"})
	default:
		by := fmt.Sprintf("%s (uid %d, pid %d)", statedBy(req.By), cred.Uid, cred.Pid)
		if !req.Until.IsZero() {
			c.SetDeadline(req.Until)
		}
		conds, err := d.clearTamper(ctx, req.Reason, by, req.Until)
		if err != nil {
			// A clear applied but not saved, or whose checks did not run
			// again in time, still answers with the conditions as they
			// are: the command prints them before the error.
			answer(ControlAnswer{Error: err.Error(), Conditions: conds})
			return
		}
		answer(ControlAnswer{Conditions: conds})
	}
}

// operatorForm is what `autopilot-health tamper clear` states as the
// operator: the sudo user and the login user when known, and its uid.
var operatorForm = regexp.MustCompile(`^(sudo user [^\s,()]{1,64}, )?(login user [^\s,()]{1,64}, )?uid [0-9]{1,10}$`)

// statedBy returns the operator a client states when it has the form the
// command writes, else "operator not stated": by is published on the Node
// (the tamper report's cleared.by), so it carries names and ids only,
// never free text a client sent.
func statedBy(by string) string {
	if operatorForm.MatchString(by) {
		return by
	}
	return "operator not stated"
}

type limitedReader struct {
	c *net.UnixConn
	n int
}

func (r *limitedReader) Read(b []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("request too long")
	}
	b = b[:min(len(b), r.n)]
	n, err := r.c.Read(b)
	r.n -= n
	return n, err
}

// clearStepHook, when set (tests), is called by ClearTamper with its
// reason at each step: "waiting" when another clear is being applied,
// "prepared" once the state file is saved without this boot's baseline
// digest, before the clear is applied.
var clearStepHook func(step, reason string)

// ClearTamper is the operator's clear of the tamper conditions: the
// findings and the baseline are dropped (a new baseline is taken of the
// files as they are now, the recorded hashes are read afresh), the
// conditions may go back to what a new evaluation finds, the clear is
// logged and evented. It waits (up to 30 s) for the tamper checks to run
// again and returns the tamper conditions.
func (d *Daemon) ClearTamper(ctx context.Context, reason, by string) ([]report.Condition, error) {
	return d.clearTamper(ctx, reason, by, time.Time{})
}

// needed is how long before its client stops waiting the daemon must get
// to a request of op for it to be applied and answered in time: a reload
// ends when it has applied or been refused (its client waits reloadWait
// and more from the send), a clear may take clearApply.
func needed(op string) time.Duration {
	if op == OpTamperClear {
		return clearApply
	}
	return 0
}

// clearTamper is ClearTamper answering by answerBy (zero: no bound), when
// its client stops waiting: the wait for the re-evaluation ends a second
// before, so that a clear applied is answered, never one its client
// reports as failed.
func (d *Daemon) clearTamper(ctx context.Context, reason, by string, answerBy time.Time) ([]report.Condition, error) {
	k := d.currentEnv().Tamper
	if k == nil {
		return nil, errors.New("this daemon keeps no tamper state")
	}
	// Clears are applied one at a time, a second one waiting for the
	// first's preparation, save and application (never for its
	// re-evaluation): run beside it, the first one's application ended
	// the second one's preparation (Keeper.PrepareClear), so the baseline
	// taken after the first was kept in state.json while the second
	// dropped it from tamper.json, and a restart then found a false
	// BaselineCorrupt. Waiting, not refusing: both operators mean to
	// accept the node as it is, each clear is logged and evented with its
	// own reason, and the wait is short (2 * SaveWait at most, with a hung
	// disk), where a refusal would fail a deliberate act for nothing.
	if !d.clearMu.TryLock() {
		if clearStepHook != nil {
			clearStepHook("waiting", reason)
		}
		d.clearMu.Lock()
	}
	now := time.Now()
	// A write of tamper.json that does not return (a failing or hung disk
	// under state_dir) is not waited for, and one that fails (a read-only
	// or full state_dir) is not undone: the keeper has dropped the
	// findings in memory either way, so the clear is applied, logged and
	// evented (a write that returns later, or the next one that works,
	// saves it), and the answer says it is not saved.
	//
	// The state file keeps this boot's baseline digest (NodeTampered
	// compares it with tamper.json at a start): it is saved without it
	// first, and waited for, so that a restart at any point of the clear
	// (SIGKILL, a crash, a SIGTERM before the check ran again) never finds
	// it naming a baseline tamper.json no longer holds, a false
	// BaselineCorrupt. The new baseline's digest is kept once tamper.json
	// holds it (Keeper.KeptDigest).
	k.PrepareClear()
	if err := d.saveStateNow(tamper.SaveWait); err != nil {
		d.log.Warn("the state file is not saved before the tamper clear; a restart before it is may find this boot's baseline gone (BaselineCorrupt): clear again then", "path", d.statePath(), "err", err)
	}
	if clearStepHook != nil {
		clearStepHook("prepared", reason)
	}
	saveErr := k.ClearAll(tamper.Clear{At: now, Reason: reason, By: by})
	d.clearMu.Unlock()
	types := []string{tamper.CondNode, tamper.CondSealed}
	for _, t := range types {
		d.store.Release(t, now)
	}
	if saveErr != nil {
		d.log.Warn("tamper conditions cleared by an operator; the clear is not saved", "reason", reason, "by", by, "err", saveErr)
	} else {
		d.log.Warn("tamper conditions cleared by an operator", "reason", reason, "by", by)
	}
	d.store.Emit(report.Event{Reason: report.EventTamperCleared, Time: now,
		Message: fmt.Sprintf("NodeTampered and SealedOSTampered cleared by %s: %s", by, reason)})
	r := d.currentRunner()
	var woken []string
	for _, t := range types {
		if r.Wake(t) {
			woken = append(woken, t)
		}
	}
	settle := clearSettle
	if !answerBy.IsZero() {
		settle = max(0, min(settle, time.Until(answerBy)-time.Second))
	}
	deadline := time.NewTimer(settle)
	defer deadline.Stop()
	for {
		if ctx.Err() != nil {
			// The daemon stops before the checks ran again: the clear
			// is applied, logged and evented all the same (and saved as
			// saveErr says); the answer says so, with the conditions as
			// they are. A condition is lowered only by a clear this
			// process made or one the Node shows (Store.Adopt): the next
			// start holds them True as saved, unless the reporter
			// published the clear before the stop.
			conds := d.tamperConditions(types)
			stopErr := errors.New("cleared; the daemon is stopping before the tamper checks ran again: they run when it starts")
			if slices.ContainsFunc(conds, func(c report.Condition) bool { return c.Status == report.StatusTrue }) {
				stopErr = errors.New("cleared; the daemon is stopping before the tamper checks ran again: the next start brings the findings back (the conditions True as saved) unless the Node shows this clear (its tamper report's cleared.at): once it runs, see autopilot-health status, and clear again")
			}
			return conds, errors.Join(unsaved(saveErr), stopErr)
		}
		changed := d.store.Changed()
		done := true
		for _, t := range woken {
			if c, ok := d.store.Get(t); !ok || !c.LastUpdateTime.After(now) {
				done = false
			}
		}
		if done {
			break
		}
		select {
		case <-changed:
		case <-time.After(time.Second): // a run that changes nothing
		case <-deadline.C:
			return d.tamperConditions(types), errors.Join(unsaved(saveErr), fmt.Errorf("cleared; the tamper checks did not run again within %s", settle.Round(time.Second)))
		case <-ctx.Done(): // answered at the top
		}
	}
	return d.tamperConditions(types), unsaved(saveErr)
}

// unsaved is the answer to a clear applied in memory whose write of
// tamper.json failed, or has not returned (a *tamper.NotSavedError), with
// err (nil: saved).
func unsaved(err error) error {
	if err == nil {
		return nil
	}
	var e *tamper.NotSavedError
	if !errors.As(err, &e) {
		return fmt.Errorf("cleared, but not saved: %w (journalctl -u autopilot-health); the next change of the tamper state that can be written saves it, as does the daemon's stop once the file can be written, and a restart while it cannot brings the findings back: run the clear again then", err)
	}
	return fmt.Errorf("cleared, but not saved: the write of %s has not returned since %s (a failing or hung disk?; journalctl -u autopilot-health); it is saved once that write returns, and a restart of the daemon before then brings the findings back: run the clear again then",
		e.Path, e.Since.UTC().Format(time.RFC3339))
}

func (d *Daemon) tamperConditions(types []string) []report.Condition {
	var out []report.Condition
	for _, t := range types {
		if c, ok := d.store.Get(t); ok {
			out = append(out, c)
		}
	}
	return out
}

// dialControl connects to the daemon's control socket; what fails names
// the socket and, when the daemon is not there, says so.
func dialControl(socket, retry string) (*net.UnixConn, error) {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	what, notRunning := DialFailure(socket, err)
	if what != "" {
		// A daemon whose control_socket names it leaves it and does
		// not start (listenControl).
		return nil, NotASocketError{Socket: socket, What: what}
	}
	if notRunning {
		// Also a daemon starting (the socket is bound once its
		// configuration is read, which retries for up to a minute on an
		// I/O error) or stopping (the socket is removed as the stop
		// begins, before the final saves).
		return nil, fmt.Errorf("%w, or still starting or stopping (no control socket at %s; systemctl status autopilot-health says which: activating or deactivating while it does): if it is inactive, start it (systemctl start autopilot-health) and %s", ErrNotRunning, socket, retry)
	}
	if errors.Is(err, syscall.EACCES) {
		return nil, fmt.Errorf("%s: permission denied: the control socket is root's (run with sudo)", socket)
	}
	if errors.Is(err, syscall.EAGAIN) {
		// Connections the daemon did not accept fill the backlog (the
		// process frozen); the connect fails at once. Nothing was sent.
		return nil, fmt.Errorf("the daemon on %s takes no connection (its listen backlog is full): it may be hung (systemctl status autopilot-health; journalctl -u autopilot-health); nothing was sent", socket)
	}
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// ErrNotRunning: no daemon listens on the socket.
var ErrNotRunning = errors.New("the daemon is not running")

// NotASocketError: what is at the control socket's path is not a socket (a
// file, a directory, a symlink), which a daemon whose control_socket names
// it leaves there, and does not start. It is an ErrNotRunning that says
// what is there.
type NotASocketError struct {
	Socket string
	What   string // "a regular file", "a directory", "a symlink", ...
}

func (e NotASocketError) Error() string {
	return fmt.Sprintf("%v: %s is not a socket but %s, which a daemon whose control_socket names it leaves as it is, and does not start (journalctl -u autopilot-health says so)", ErrNotRunning, e.Socket, e.What)
}

func (NotASocketError) Unwrap() error { return ErrNotRunning }

// askControl sends req to the daemon listening on socket and reads its
// answer, waiting at most wait for it.
func askControl(socket, retry string, wait time.Duration, req ControlRequest) (ControlAnswer, error) {
	c, err := dialControl(socket, retry)
	if err != nil {
		return ControlAnswer{}, err
	}
	defer c.Close()
	req.Until = time.Now().Add(wait)
	c.SetDeadline(req.Until)
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return ControlAnswer{}, err
	}
	var a ControlAnswer
	got := FirstBytes{Max: 200}
	err = json.NewDecoder(io.TeeReader(c, &got)).Decode(&a)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		// Connected, so a daemon holds the socket: still starting (the
		// socket is bound at the start's beginning and served once it
		// is done) or hung. The request carries this deadline: the
		// daemon does not apply it once it is past.
		return ControlAnswer{}, fmt.Errorf("the daemon on %s did not answer within %s: it may be still starting (it answers once the start is done; systemctl status autopilot-health says activating meanwhile) or hung (journalctl -u autopilot-health); a request the daemon has not got to by now is not applied: ask again", socket, wait)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		// The daemon's stop: its listener closed with this connection
		// in the backlog (ECONNRESET), or a request in flight given up
		// on after controlStopWait (EOF), and the process gone.
		return ControlAnswer{}, fmt.Errorf("the daemon on %s closed the connection without an answer: it stopped, or is stopping (systemctl status autopilot-health); a request it had not read is not applied, one it had is in journalctl -u autopilot-health: ask again once it runs", socket)
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syn) || errors.As(err, &typ) {
		// Something answered, but not the daemon's control answer:
		// another program's socket (the daemon's status socket, which
		// answers HTTP, given for its control socket). Its first bytes,
		// printable, say whose; nothing was applied by it.
		return ControlAnswer{}, fmt.Errorf("the answer on %s is not the daemon's control answer (is it the daemon's control socket, control_socket?): %v: %s", socket, err, report.CapMessage(strings.TrimSpace(got.String())))
	}
	if err != nil {
		return ControlAnswer{}, fmt.Errorf("reading the daemon's answer: %w", err)
	}
	return a, nil
}

// FirstBytes keeps the first Max bytes written to it (an io.Writer; safe
// for a writer and a reader on other goroutines), to name an answer that
// is not the one asked for by its first bytes: the control client's
// (askControl) and `autopilot-health status`'s.
type FirstBytes struct {
	Max int
	mu  sync.Mutex
	b   []byte
}

func (f *FirstBytes) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.b = append(f.b, p[:max(0, min(len(p), f.Max-len(f.b)))]...)
	return len(p), nil
}

// Len is how many bytes it kept.
func (f *FirstBytes) Len() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.b) }

func (f *FirstBytes) String() string { f.mu.Lock(); defer f.mu.Unlock(); return string(f.b) }

// RequestReload asks the daemon listening on socket to read its
// configuration again and returns what changed, or why it was refused
// (the client of `autopilot-health reload`).
func RequestReload(socket string) (string, error) {
	a, err := askControl(socket, "its configuration is read at start", reloadClientWait, ControlRequest{Op: OpReload})
	switch {
	case err != nil:
		return "", err
	case a.Refused:
		return "", RefusedError(a.Error)
	case a.Error != "":
		return "", errors.New(a.Error)
	}
	return a.Reloaded, nil
}

// RefusedError is the daemon's refusal of a reload (a file it does not
// accept, a key that needs a restart), as against a daemon that could not
// be asked or did not allow the request.
type RefusedError string

func (e RefusedError) Error() string { return string(e) }

// RequestTamperClear asks the daemon listening on socket to clear the
// tamper conditions (the client of `autopilot-health tamper clear`).
func RequestTamperClear(socket, reason, by string) ([]report.Condition, error) {
	a, err := askControl(socket, "clear again", clearClientWait, ControlRequest{Op: OpTamperClear, Reason: reason, By: by})
	if err != nil {
		return nil, err
	}
	if a.Error != "" {
		return a.Conditions, errors.New(a.Error)
	}
	return a.Conditions, nil
}

// DialFailure classifies err, a connect to the unix socket at path, as the
// clients of the daemon's sockets (status, the control commands) word it:
// what is non-empty where something other than a socket is at path (a
// file, a directory, a symlink: one that loops, ELOOP, or runs through a
// file, ENOTDIR), which a daemon leaves as it is and serves no socket on;
// else notRunning where nothing listens there (ENOENT, ECONNREFUSED: no
// daemon, or one that has not bound it yet). Neither for any other error,
// nor for a path under a file with nothing there (ENOTDIR, no symlink),
// which keep the connect's own error.
func DialFailure(path string, err error) (what string, notRunning bool) {
	refused := errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
	if refused || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
		if what := NotASocket(path); what != "" {
			return what, false
		}
	}
	return "", refused
}

// NotASocket says what is at path when it is there and not a socket ("a
// regular file", "a directory", "a symlink", ...), as the daemon, which
// leaves it as it is and does not serve that socket, names it; "" when
// nothing or a socket is there.
func NotASocket(path string) string {
	fi, err := os.Lstat(path)
	if err != nil {
		return ""
	}
	return notASocket(fi)
}

func notASocket(fi os.FileInfo) string {
	switch {
	case fi.Mode().Type() == os.ModeSocket:
		return ""
	case fi.Mode().IsRegular():
		return "a regular file"
	case fi.IsDir():
		return "a directory"
	case fi.Mode()&os.ModeSymlink != 0:
		return "a symlink"
	case fi.Mode()&os.ModeNamedPipe != 0:
		return "a FIFO"
	}
	return "a " + fi.Mode().Type().String()
}
