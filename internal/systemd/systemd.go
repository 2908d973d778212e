// Package systemd is the daemon's one place that talks to systemd: unit
// properties, restart and reset-failed over D-Bus (never systemctl). It
// reconnects when the bus drops (systemd re-exec, dbus restart).
package systemd

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Unit is the state of one unit as systemd reports it.
type Unit struct {
	Name        string    `json:"name"`
	LoadState   string    `json:"loadState"`
	ActiveState string    `json:"activeState"`
	SubState    string    `json:"subState"`
	Result      string    `json:"result,omitempty"`
	NRestarts   uint32    `json:"restarts"`
	Invocation  string    `json:"invocationID,omitempty"`
	MainStart   time.Time `json:"mainStart,omitzero"`
	// MainStartMono is the same start on CLOCK_MONOTONIC (time since boot;
	// 0: unknown): unlike MainStart, wall-clock time, it does not move
	// when the clock is stepped (at boot, an RTC ahead of the time that
	// chrony's makestep then sets), so ages and orders within the boot are
	// taken from it.
	MainStartMono time.Duration `json:"mainStartMono,omitempty"`
	// ActiveExitMono and MainExitMono (CLOCK_MONOTONIC; 0: unknown), read
	// for a service that is not active: when the unit last left the
	// active state (ActiveExitTimestampMonotonic) and when its main
	// process last exited (ExecMainExitTimestampMonotonic). A stop
	// leaves the active state first (SIGTERM sent) and the process exits
	// after; a process that exits on its own does so first.
	ActiveExitMono time.Duration `json:"-"`
	MainExitMono   time.Duration `json:"-"`
	// NotifyAccess is the service's NotifyAccess= ("none", "main", "exec",
	// "all"; "" when not read), read for a service that is not active:
	// one that may notify can leave the active state on its own
	// (STOPPING=1), before its process exits, as a stop makes it.
	NotifyAccess string `json:"-"`
	// RuntimeMax is the service's RuntimeMaxSec= (0: none, infinity, or
	// not read), read for a service that is not active: one that reaches
	// it is taken out of the active state before its process exits, as
	// a stop makes it, and ends failed, result "timeout", with no stop.
	RuntimeMax time.Duration `json:"-"`
	// Skipped, read for a loaded service that is not active: the
	// Condition…= that systemd found not met at the unit's last start,
	// which it then skipped (its ConditionResult "no"), in systemd's words
	// (Unmet): "ConditionPathExists=/usr/bin/kubelet". Such a start job
	// ends "done" though nothing started: the unit stays inactive at the
	// invocation it had. "" when its last start's conditions were met, or
	// it was never started.
	Skipped string `json:"-"`
	// AssertFailed is the same for an Assert…= (its AssertResult "no"),
	// which fails the start job instead (result "assert").
	AssertFailed string `json:"-"`
	// condResult, assertResult: the ConditionResult and AssertResult read
	// (checked: 1 met, 2 not; 0 not read), which the Conditions and
	// Asserts read after them are taken with; 0 again once Units returns.
	condResult, assertResult uint8
	// Job is the id of a job queued or running for the unit (0: none), e.g.
	// a start job waiting for the units it is ordered after.
	Job uint32 `json:"job,omitempty"`
	// JobType is that job's type ("start", "stop", "restart", ...).
	JobType string `json:"jobType,omitempty"`
}

// StopEndedFailed reports whether u, failed, was failed by a stop (a stop
// job: someone's `systemctl stop`, a conflict, a shutdown) that did not end
// cleanly, rather than by its process, which systemd does not restart
// whatever its Restart=: the unit left the active state in its current run
// (at or after its main process started) before its main process exited
// (a stop sends SIGTERM first), with a result a stop ends with: "timeout"
// (killed at its TimeoutStopSec), "exit-code", "signal", "core-dump" (its
// process or ExecStop= failed on the stop). A process that exits on its own
// does so before the unit leaves the active state; systemd's own kills
// that come first (its watchdog, an OOM kill under OOMPolicy=stop) end with
// "watchdog" and "oom-kill". A "timeout" of a service with a RuntimeMaxSec=
// is none: it may be that limit reached. Only for a service that cannot notify systemd (NotifyAccess
// none, the default but for Type=notify): one that can (containerd) leaves
// the active state on its own with STOPPING=1, before its process exits,
// and ends failed when it then exits non-zero, with no stop; systemd 252
// keeps nothing that tells that from a stop, and a failure must not be
// taken for a stop (the unit would stay down).
func (u Unit) StopEndedFailed() bool {
	if u.ActiveState != "failed" || u.NotifyAccess != "none" || u.MainStartMono <= 0 || u.ActiveExitMono < u.MainStartMono || u.MainExitMono <= u.ActiveExitMono {
		return false
	}
	switch u.Result {
	case "timeout":
		return u.RuntimeMax == 0
	case "exit-code", "signal", "core-dump":
		return true
	}
	return false
}

// ComingBack reports whether a start or restart job is queued or running
// for u: systemd is (re)starting it, whatever its state. A restart job is
// two halves: once its stop left the unit inactive (or failed, a stop that
// did not end cleanly), it turns into a start job that runs from systemd's
// run queue, and a read answered in between sees the unit inactive/dead or
// failed/failed with that start job; the start also waits, so read, for
// the units it is ordered after that have jobs of their own
// (TestARestartBetweenItsHalvesIsComingBack in tests/). The job ends by
// its unit's timeouts; a start that fails leaves the unit with no job.
func (u Unit) ComingBack() bool {
	return u.Job != 0 && (u.JobType == "start" || u.JobType == "restart")
}

// Problem reports whether the unit is failed (in a report list that must
// be cut, its entry is kept first).
func (u Unit) Problem() bool { return u.ActiveState == "failed" }

// Manager is what the daemon needs from systemd.
type Manager interface {
	Unit(ctx context.Context, name string) (Unit, error)
	// Restart restarts a unit (RestartUnit, mode "fail": a stop job
	// queued for it or a unit its start pulls in, someone's `systemctl
	// stop`, is not canceled, the request refused: ErrJobRefused) and
	// waits for the job. The unit is reset first (ResetFailedUnit, which
	// also resets its start rate limit), so our restarts never push it
	// into start-limit-hit.
	Restart(ctx context.Context, name string) error
	ResetFailed(ctx context.Context, name string) error
	// SystemState is the manager's SystemState: "initializing",
	// "starting", "running", "degraded", "maintenance" or "stopping" (the
	// word `systemctl is-system-running` prints).
	SystemState(ctx context.Context) (string, error)
}

// Stopping reports whether systemd is shutting the system down (poweroff,
// reboot, halt, kexec): its SystemState is "stopping". systemd answers
// "initializing" or "starting" for as long as the boot has not finished,
// even once a shutdown began (manager_state in src/core/manager.c looks at
// that first): then shutdown.target is read, and a start job queued for it
// (or the target reached) is a shutdown too. Read it only where something
// failed: it is a call to systemd.
func Stopping(ctx context.Context, m Manager) (bool, error) {
	state, err := m.SystemState(ctx)
	if err != nil {
		return false, err
	}
	switch state {
	case "stopping":
		return true, nil
	case "initializing", "starting":
		u, err := m.Unit(ctx, "shutdown.target")
		if err != nil {
			return false, err
		}
		return u.ActiveState == "active" || u.JobType == "start", nil
	}
	return false, nil
}

// DBus is a Manager over the system bus. Its reads and ResetFailedUnit are
// method calls on one connection it keeps for its life (busConn, the
// messages encoded and decoded by hand), with no signal subscribed: it wakes
// only for its own answers. A restart (a job whose end is a JobRemoved
// signal) uses a go-systemd connection of its own, made for the restart and
// closed after it: kept open, its match on every JobRemoved would wake the
// daemon for every job on the node (each container's scope unit is one).
type DBus struct {
	// dialing holds one token while a dial is in flight: one dial at a
	// time, and a call waits for it only as long as its own context allows
	// (a repair's long context dialing a hung bus does not hold up the
	// checks' reads).
	dialing chan struct{}
	// mu guards conn, closed and Reconnects.
	mu     sync.Mutex
	conn   *busConn
	closed bool // by Close: no new connection is made
	// socket is the bus's socket path.
	socket func() (string, error)
	// dial opens one authenticated godbus connection to the bus (jobs).
	dial func(ctx context.Context) (*godbus.Conn, error)
	// Reconnects counts new connections after the first.
	Reconnects int
}

// NewDBus returns a Manager that connects on first use to the system bus
// (DBUS_SYSTEM_BUS_ADDRESS, default /run/dbus/system_bus_socket). Its job
// connections are dialed as NewDBusAt's are (DialBus), so that their failed
// writes are counted (writeWatch): godbus.SystemBusPrivate's are not.
func NewDBus() *DBus {
	return &DBus{dialing: make(chan struct{}, 1), socket: systemBusSocket, dial: func(ctx context.Context) (*godbus.Conn, error) {
		socket, err := systemBusSocket()
		if err != nil {
			return nil, err
		}
		return DialBus(ctx, socket)
	}}
}

// NewDBusAt connects to the system bus at a unix socket path (tests reach
// a systemd in another mount namespace this way).
func NewDBusAt(socket string) *DBus {
	return &DBus{dialing: make(chan struct{}, 1),
		socket: func() (string, error) { return socket, nil },
		dial:   func(ctx context.Context) (*godbus.Conn, error) { return DialBus(ctx, socket) }}
}

// DialBus opens an authenticated godbus connection to the bus at a unix
// socket.
func DialBus(ctx context.Context, socket string) (*godbus.Conn, error) {
	nc, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	return newBusConn(ctx, nc)
}

// authHello authenticates a new connection (EXTERNAL, by uid, as go-systemd
// does: no user name lookup) and says Hello.
func authHello(c *godbus.Conn, err error) (*godbus.Conn, error) {
	if err != nil {
		return nil, err
	}
	if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.Hello(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// get returns a live connection, dialing a new one when there is none or
// the old one dropped.
func (d *DBus) get(ctx context.Context) (*busConn, error) {
	if c := d.live(); c != nil {
		return c, nil
	}
	select {
	case d.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("connecting to systemd over D-Bus: %w", ctx.Err())
	}
	defer func() { <-d.dialing }()
	if c := d.live(); c != nil {
		return c, nil // dialed while this call waited
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, errDBusClosed
	}
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
		d.Reconnects++
	}
	d.mu.Unlock()
	socket, err := d.socket()
	if err != nil {
		return nil, fmt.Errorf("connecting to systemd over D-Bus: %w", err)
	}
	c, err := dialBusConn(ctx, socket)
	if err != nil {
		return nil, fmt.Errorf("connecting to systemd over D-Bus: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return nil, errDBusClosed
	}
	d.conn = c
	return c, nil
}

var errDBusClosed = errors.New("the D-Bus client is closed")

// live is the connection when it is up, else nil.
func (d *DBus) live() *busConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil && d.conn.Connected() {
		return d.conn
	}
	return nil
}

// dialFor dials a connection that outlives the call that needs it: godbus
// closes a connection when the context it was dialed with is done, and a
// restart's context ends with the restart. The connection gets a context of
// its own, ended only to abandon a dial that ctx stopped waiting for (which
// closes what was half made; one that completes anyway is closed), or by
// end, which the caller calls once it closed the connection.
func dialFor[C any](ctx context.Context, dial func(ctx context.Context) (C, error), closeConn func(C)) (c C, end context.CancelFunc, err error) {
	type result struct {
		c   C
		err error
	}
	life, abandon := context.WithCancel(context.WithoutCancel(ctx))
	ch := make(chan result, 1)
	go func() {
		c, err := dial(life)
		ch <- result{c, err}
	}()
	var zero C
	select {
	case r := <-ch:
		if r.err != nil {
			abandon()
			return zero, nil, r.err
		}
		return r.c, abandon, nil
	case <-ctx.Done():
		abandon()
		go func() {
			if r := <-ch; r.err == nil {
				closeConn(r.c)
			}
		}()
		return zero, nil, ctx.Err()
	}
}

// drop forgets a connection that failed, so the next call dials again.
func (d *DBus) drop(c *busConn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == c && !c.Connected() {
		d.conn = nil
		d.Reconnects++
	}
}

// call runs f on a live connection; when the connection turns out to be
// dead it reconnects and tries once more. A connection found closed before
// f sent anything (another caller's exchange failed on it) is not a try:
// f runs on a new one, up to three times. A call systemd left without an
// answer (NoReply: it re-executed, `systemctl daemon-reexec`, while the
// call waited for it; the connection to the bus stays up) is made once
// more on the same connection: dbus-daemon holds it until systemd is back.
func (d *DBus) call(ctx context.Context, f func(c *busConn) error) error {
	notSent, noReply := 0, false
	for attempt := 0; ; attempt++ {
		c, err := d.get(ctx)
		if err != nil {
			return err
		}
		err = f(c)
		if errors.Is(err, errNotSent) && ctx.Err() == nil && notSent < 3 {
			notSent++
			attempt--
			d.drop(c)
			continue
		}
		if isNoReply(err) && !noReply && c.Connected() && ctx.Err() == nil {
			noReply = true
			attempt--
			continue
		}
		if err == nil || c.Connected() || attempt > 0 || ctx.Err() != nil {
			return err
		}
		d.drop(c)
	}
}

// isNoReply reports whether err is the bus's NoReply: the peer left the
// bus without answering the call (systemd re-executing), or did not answer
// within dbus-daemon's reply timeout. err is our connection's (*BusError)
// or go-systemd's (godbus.Error).
func isNoReply(err error) bool {
	const noReply = "org.freedesktop.DBus.Error.NoReply"
	var be *BusError
	var ge godbus.Error
	return errors.As(err, &be) && be.Name == noReply || errors.As(err, &ge) && ge.Name == noReply
}

// Close closes the connection; calls after it fail.
func (d *DBus) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
}

// managerCall is a call of a method of systemd's manager.
func managerCall(member string, array bool, args ...string) busCall {
	return busCall{dest: sdService, path: "/org/freedesktop/systemd1", iface: sdService + ".Manager", member: member, args: args, array: array}
}

// unitStatus is one entry of ListUnitsByNames' answer (a(ssssssouso)).
type unitStatus struct {
	Name, Description, LoadState, ActiveState, SubState, Following string
	Path                                                           string
	JobID                                                          uint32
	JobType                                                        string
	JobPath                                                        string
}

// listUnits is ListUnitsByNames: the states of the named units, in order
// (systemd loads a unit it does not know to answer: "not-found").
func listUnits(ctx context.Context, c *busConn, names []string) ([]unitStatus, error) {
	var st []unitStatus
	err := c.exchange(ctx, []busCall{managerCall("ListUnitsByNames", true, names...)}, func(_ int, m message) error {
		if m.typ == msgError {
			return errorOf(m)
		}
		var err error
		st, err = parseUnitStatuses(m)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(st) != len(names) {
		return nil, fmt.Errorf("systemd answered for %d of %d units", len(st), len(names))
	}
	return st, nil
}

// Unit reads a unit's properties. A unit that does not exist is not an
// error: systemd reports LoadState "not-found".
func (d *DBus) Unit(ctx context.Context, name string) (Unit, error) {
	us, err := d.Units(ctx, name)
	if err != nil {
		return Unit{Name: name}, err
	}
	return us[0], nil
}

// Units reads several units at once: one ListUnitsByNames for the states
// of all of them (LoadState, ActiveState, SubState, job), then the few
// properties the checks use, each a Properties.Get, all sent before the
// first answer is read: InvocationID (but of a unit that does not exist and
// does not run), for a failed service that is not loaded (masked, or its
// file removed since it failed) Result, and for a loaded service Result,
// NRestarts and ExecMainStartTimestamp (wall and monotonic), and when
// it is not active ActiveExitTimestampMonotonic,
// ExecMainExitTimestampMonotonic, NotifyAccess and RuntimeMaxUSec (the
// repairer's tell of a stop that ended failed), and ConditionResult,
// Conditions, AssertResult and Asserts (a start systemd skipped or failed
// on them: Skipped, AssertFailed; BenchmarkUnitReadNotActive in tests/). It read the whole of each unit before (GetAll of its
// Unit and Service interfaces, ~300 values): three services cost 7.3-8.5 ms
// of CPU and 27,158 allocations; with these calls through godbus 2.0-2.4 ms
// and 5,136; encoded and decoded by hand (busConn) 0.32-0.78 ms and 102
// (BenchmarkUnitsRead beside BenchmarkUnitsFullRead, the old read, in
// tests/ against systemd 252).
func (d *DBus) Units(ctx context.Context, names ...string) ([]Unit, error) {
	if len(names) == 0 {
		return nil, nil
	}
	var out []Unit
	what := "unit"
	if len(names) > 1 {
		what = "units"
	}
	what += " " + strings.Join(names, ", ")
	err := d.call(ctx, func(bus *busConn) error {
		st, err := listUnits(ctx, bus, names)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		out = make([]Unit, len(names))
		var gets propGets[*Unit]
		for i, s := range st {
			u := &out[i]
			*u = Unit{Name: names[i], LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState, Job: s.JobID, JobType: s.JobType}
			add := func(iface, prop string) { gets.add(u, s.Path, iface, prop) }
			if u.LoadState != "not-found" || u.ActiveState != "inactive" {
				// Its last invocation, whatever its unit file says now
				// (masked, bad-setting, removed while it runs).
				add("Unit", "InvocationID")
			}
			if !isService(u.Name) {
				continue
			}
			if u.LoadState != "loaded" {
				if u.ActiveState == "failed" {
					// Why it failed, which systemd keeps for a unit
					// masked or whose file was removed since.
					add("Service", "Result")
				}
				continue
			}
			for _, p := range []string{"Result", "NRestarts", "ExecMainStartTimestamp", "ExecMainStartTimestampMonotonic"} {
				add("Service", p)
			}
			if u.ActiveState != "active" {
				add("Unit", "ActiveExitTimestampMonotonic")
				add("Service", "ExecMainExitTimestampMonotonic")
				add("Service", "NotifyAccess")
				add("Service", "RuntimeMaxUSec")
				// Whether its last start was skipped (a Condition…= not
				// met) or failed on an Assert…=, and which: each result
				// read before its list (set takes the list with it).
				add("Unit", "ConditionResult")
				add("Unit", "Conditions")
				add("Unit", "AssertResult")
				add("Unit", "Asserts")
			}
		}
		if len(gets.calls) == 0 {
			return nil
		}
		var answerErr error
		err = bus.exchange(ctx, gets.calls, func(i int, m message) error {
			g := gets.gets[i]
			if v, err := propValue(m); err != nil {
				answerErr = fmt.Errorf("unit %s: %s: %w", g.of.Name, g.prop, err)
			} else {
				g.of.set(g.prop, v)
			}
			return answerErr
		})
		if err != nil && err != answerErr {
			return fmt.Errorf("%s: %w", what, err)
		}
		return err
	})
	for i := range out {
		// What set took the lists with is no part of the unit read: a
		// Unit compares equal to another read of the same state.
		out[i].condResult, out[i].assertResult = 0, 0
	}
	return out, err
}

// sdService is systemd's bus name and the prefix of its interfaces.
const sdService = "org.freedesktop.systemd1"

// propCall is a Properties.Get of the property prop of systemd's interface
// iface ("Unit", "Service", "Manager") of the object at path.
func propCall(path, iface, prop string) busCall {
	return busCall{dest: sdService, path: path, iface: "org.freedesktop.DBus.Properties", member: "Get",
		args: []string{sdService + "." + iface, prop}}
}

// propValue is the value a Properties.Get was answered with, or the error
// it was answered with, or the error of reading the answer.
func propValue(m message) (variant, error) {
	if m.typ == msgError {
		return variant{}, errorOf(m)
	}
	return parseVariant(m)
}

// propGets is a batch of Properties.Get calls of units' properties, for one
// exchange: the answer to calls[i] is gets[i]'s, its property of its unit.
type propGets[T any] struct {
	calls []busCall
	gets  []propGet[T]
}

// propGet is what one call of a propGets asks for: prop of the unit of.
type propGet[T any] struct {
	of   T
	prop string
}

// add asks for iface's property prop of the unit at path, the answer of.
func (g *propGets[T]) add(of T, path, iface, prop string) {
	g.gets = append(g.gets, propGet[T]{of, prop})
	g.calls = append(g.calls, propCall(path, iface, prop))
}

// set records one property read by Units; a value of another type than
// systemd's is left out.
func (u *Unit) set(prop string, v variant) {
	switch {
	case prop == "InvocationID" && v.sig == "ay":
		if len(v.bytes) > 0 {
			u.Invocation = hex.EncodeToString(v.bytes)
		}
	case prop == "Result" && v.sig == "s":
		u.Result = v.str
	case prop == "NRestarts" && v.sig == "u":
		u.NRestarts = uint32(v.num)
	case prop == "ExecMainStartTimestamp" && v.sig == "t":
		if v.num > 0 {
			u.MainStart = time.UnixMicro(int64(v.num))
		}
	case prop == "ExecMainStartTimestampMonotonic" && v.sig == "t":
		u.MainStartMono = time.Duration(v.num) * time.Microsecond
	case prop == "ActiveExitTimestampMonotonic" && v.sig == "t":
		u.ActiveExitMono = time.Duration(v.num) * time.Microsecond
	case prop == "ExecMainExitTimestampMonotonic" && v.sig == "t":
		u.MainExitMono = time.Duration(v.num) * time.Microsecond
	case prop == "NotifyAccess" && v.sig == "s":
		u.NotifyAccess = v.str
	case prop == "RuntimeMaxUSec" && v.sig == "t":
		if v.num != math.MaxUint64 {
			u.RuntimeMax = time.Duration(v.num) * time.Microsecond
		}
	case prop == "ConditionResult" && v.sig == "b":
		u.condResult = 1 + uint8(1-min(v.num, 1))
	case prop == "AssertResult" && v.sig == "b":
		u.assertResult = 1 + uint8(1-min(v.num, 1))
	case prop == "Conditions" && v.sig == "a(sbbsi)":
		if u.condResult == 2 {
			u.Skipped = Unmet(v.conds)
		}
	case prop == "Asserts" && v.sig == "a(sbbsi)":
		if u.assertResult == 2 {
			u.AssertFailed = Unmet(v.conds)
		}
	}
}

// Condition is one Condition…= or Assert…= of a unit as systemd last
// checked it: an entry of its Conditions or Asserts property, a(sbbsi).
type Condition struct {
	Type      string // "ConditionPathExists", "AssertPathIsMountPoint", ...
	Trigger   bool   // "|": one of the triggering ones must be met
	Negate    bool   // "!"
	Parameter string
	// State: 0 not checked (at the last start), 1 met, -1 not met (or
	// its check failed).
	State int32
}

// String is the condition as its unit file writes it, as systemd's own
// messages name it: "ConditionPathExists=|!/run/x".
func (c Condition) String() string {
	p := c.Parameter
	if c.Negate {
		p = "!" + p
	}
	if c.Trigger {
		p = "|" + p
	}
	return c.Type + "=" + p
}

// Unmet names what failed a check of a unit's conditions (or asserts)
// that failed, list as systemd keeps it (in the order it checks them):
// the first one not triggering that was not met, where systemd stops (the
// ones after it keep the state of an earlier check); else, every one of
// them having been met, the triggering ones, none of which was, joined by
// " or ". "" where the list shows none (an older check's states).
func Unmet(list []Condition) string {
	var trig []string
	for _, c := range list {
		switch {
		case !c.Trigger && c.State < 0:
			return c.String()
		case !c.Trigger && c.State == 0:
			// Not checked at the last check: it stopped before this one
			// at a failure the list does not show.
			return ""
		case c.Trigger && c.State < 0:
			trig = append(trig, c.String())
		}
	}
	return strings.Join(trig, " or ")
}

// LoadState reads a unit's LoadState alone ("loaded", "not-found", ...):
// its ListUnitsByNames entry, where Unit reads more (BenchmarkUnitLoadState
// in tests/).
func (d *DBus) LoadState(ctx context.Context, name string) (string, error) {
	var state string
	err := d.call(ctx, func(c *busConn) error {
		st, err := listUnits(ctx, c, []string{name})
		if err != nil {
			return fmt.Errorf("unit %s: %w", name, err)
		}
		state = st[0].LoadState
		return nil
	})
	return state, err
}

// ServiceMain reads a service's state (its ListUnitsByNames entry:
// LoadState, ActiveState, SubState, its job) and, where it is loaded, its
// main process (the Service interface's MainPID; 0: none). Both calls are
// open to any user by systemd's bus policy (org.freedesktop.systemd1.conf:
// ListUnitsByNames and Properties.Get): the daemon's clients ask it where
// they may not read the daemon's own files (`autopilot-health status` as
// another user than root, its state directory 0750), where Unit reads
// more.
func (d *DBus) ServiceMain(ctx context.Context, name string) (Unit, uint32, error) {
	u := Unit{Name: name}
	var pid uint32
	err := d.call(ctx, func(c *busConn) error {
		st, err := listUnits(ctx, c, []string{name})
		if err != nil {
			return fmt.Errorf("unit %s: %w", name, err)
		}
		s := st[0]
		u.LoadState, u.ActiveState, u.SubState, u.Job, u.JobType = s.LoadState, s.ActiveState, s.SubState, s.JobID, s.JobType
		if s.LoadState != "loaded" {
			return nil
		}
		err = c.exchange(ctx, []busCall{propCall(s.Path, "Service", "MainPID")}, func(_ int, m message) error {
			v, err := propValue(m)
			if err != nil {
				return err
			}
			if v.sig != "u" {
				return fmt.Errorf("%w: MainPID of signature %q, want u", errBadMessage, v.sig)
			}
			pid = uint32(v.num)
			return nil
		})
		if err != nil {
			return fmt.Errorf("unit %s: MainPID: %w", name, err)
		}
		return nil
	})
	return u, pid, err
}

// SystemState implements Manager: a Properties.Get of the manager's
// SystemState, on the connection the reads share.
func (d *DBus) SystemState(ctx context.Context) (string, error) {
	var state string
	err := d.call(ctx, func(c *busConn) error {
		get := propCall("/org/freedesktop/systemd1", "Manager", "SystemState")
		err := c.exchange(ctx, []busCall{get}, func(_ int, m message) error {
			v, err := propValue(m)
			if err != nil {
				return err
			}
			if v.sig != "s" {
				return fmt.Errorf("%w: SystemState of signature %q, want s", errBadMessage, v.sig)
			}
			state = v.str
			return nil
		})
		if err != nil {
			return fmt.Errorf("systemd's SystemState: %w", err)
		}
		return nil
	})
	return state, err
}

// Bound is a unit that another BindsTo=, as much of it as tells a stop
// systemd made of the other because this one went down (BindsTo= stops the
// unit bound to it when it leaves the active state, a crash that its
// Restart= brings back included, and nothing starts that unit again).
type Bound struct {
	Name        string
	ActiveState string
	// ActiveEnterMono and ActiveExitMono (CLOCK_MONOTONIC; 0: never):
	// when it last entered and last left the active state.
	ActiveEnterMono, ActiveExitMono time.Duration
	// NRestarts is a loaded service's count of its Restart= restarts
	// (0 for any other unit): with what the daemon read of it before,
	// how many times it went down and came back since.
	NRestarts uint32
}

// BindsToReader is a Manager that reads the units a unit BindsTo= (DBus).
type BindsToReader interface {
	BindsTo(ctx context.Context, name string) ([]Bound, error)
}

// BindsTo implements BindsToReader: the unit's BindsTo= (its BindsTo
// property), then each of those units' state,
// Active{Enter,Exit}TimestampMonotonic and, for a loaded service,
// NRestarts, read only where the repairer finds a unit inactive and not
// its own doing.
func (d *DBus) BindsTo(ctx context.Context, name string) ([]Bound, error) {
	var names []string
	err := d.call(ctx, func(c *busConn) error {
		st, err := listUnits(ctx, c, []string{name})
		if err != nil {
			return fmt.Errorf("unit %s: %w", name, err)
		}
		get := propCall(st[0].Path, "Unit", "BindsTo")
		return c.exchange(ctx, []busCall{get}, func(_ int, m message) error {
			v, err := propValue(m)
			if err != nil {
				return fmt.Errorf("unit %s: BindsTo: %w", name, err)
			}
			if v.sig != "as" {
				return fmt.Errorf("unit %s: %w: BindsTo of signature %q, want as", name, errBadMessage, v.sig)
			}
			names = v.strs
			return nil
		})
	})
	if err != nil || len(names) == 0 {
		return nil, err
	}
	var out []Bound
	err = d.call(ctx, func(c *busConn) error {
		st, err := listUnits(ctx, c, names)
		if err != nil {
			return fmt.Errorf("units %s: %w", strings.Join(names, ", "), err)
		}
		out = make([]Bound, len(names))
		var gets propGets[*Bound]
		for i, s := range st {
			b := &out[i]
			*b = Bound{Name: names[i], ActiveState: s.ActiveState}
			gets.add(b, s.Path, "Unit", "ActiveEnterTimestampMonotonic")
			gets.add(b, s.Path, "Unit", "ActiveExitTimestampMonotonic")
			if s.LoadState == "loaded" && isService(b.Name) {
				gets.add(b, s.Path, "Service", "NRestarts")
			}
		}
		return c.exchange(ctx, gets.calls, func(i int, m message) error {
			g := gets.gets[i]
			v, err := propValue(m)
			if err != nil {
				return fmt.Errorf("unit %s: %s: %w", g.of.Name, g.prop, err)
			}
			switch {
			case g.prop == "ActiveEnterTimestampMonotonic" && v.sig == "t":
				g.of.ActiveEnterMono = time.Duration(v.num) * time.Microsecond
			case g.prop == "ActiveExitTimestampMonotonic" && v.sig == "t":
				g.of.ActiveExitMono = time.Duration(v.num) * time.Microsecond
			case g.prop == "NRestarts" && v.sig == "u":
				g.of.NRestarts = uint32(v.num)
			}
			return nil
		})
	})
	return out, err
}

// StoppedWithBound reports whether u, inactive, was stopped by systemd
// because b, a unit it BindsTo=, went down, and b runs again since (its
// Restart=, or someone's start): u left the active state (ActiveExitMono)
// at or after b last left it, and before b last entered it. Nothing starts
// u again (BindsTo= starts nothing), and no one stopped u: someone's stop
// of u leaves it before b goes down, or after b came back; someone's stop
// of b stops u first, where u is ordered after b (After=, as kubelet is
// after containerd), so that u leaves the active state before b does.
func StoppedWithBound(u Unit, b Bound) bool {
	return u.ActiveState == "inactive" && u.ActiveExitMono > 0 && b.ActiveState == "active" &&
		b.ActiveExitMono > 0 && b.ActiveExitMono <= u.ActiveExitMono && u.ActiveExitMono <= b.ActiveEnterMono
}

// BoundSeen is a unit another BindsTo= as the daemon read it while the
// other ran: its NRestarts, and when it was read (CLOCK_MONOTONIC).
type BoundSeen struct {
	NRestarts uint32
	At        time.Duration
}

// StoppedWithBoundCrashes reports whether u, inactive, was stopped by
// systemd because b, a unit it BindsTo=, went down, where b went down more
// than once since: systemd keeps the times of b's last stop only, which
// came after u's (StoppedWithBound cannot tell). seen is b as the daemon
// read it during u's last run (at or after u's main process started,
// before u left the active state), with u running then: b's Restart= has
// brought it back at least twice since (NRestarts), it runs again, and u
// left the active state no later than b last did. u ran from before seen
// until it left; BindsTo= stops u at b's first stop after seen, so u left
// at that stop or before it. Before it is someone's stop (of u, or of b,
// which stops u first, and a start of b by hand) followed by b's crashes,
// which this cannot tell apart: the caller rules that out where it read u
// stopped while b ran (then b's later stops cannot be why u stopped).
func StoppedWithBoundCrashes(u Unit, b Bound, seen BoundSeen) bool {
	return u.ActiveState == "inactive" && u.MainStartMono > 0 && u.ActiveExitMono > 0 &&
		seen.At >= u.MainStartMono && seen.At < u.ActiveExitMono &&
		b.ActiveState == "active" && b.NRestarts > seen.NRestarts && b.NRestarts-seen.NRestarts >= 2 &&
		b.ActiveExitMono >= u.ActiveExitMono && u.ActiveExitMono <= b.ActiveEnterMono
}

// StoppedBeforeBound reports whether u, stopped, left the active state
// before every stop of b, a unit it BindsTo=, since seen (b as the daemon
// read it during u's last run): b last left the active state after u did,
// and b's Restart= has not brought it back since seen (NRestarts no
// higher), so that last stop is b's only one since, or b was started by
// hand, which resets NRestarts and is no crash. b may be down (waiting
// for its Restart=, or stopped by hand after u: systemd stops u first, it
// is ordered after b) or running again. No stop of b stopped u: u's stop
// is someone's, whatever b does after (StoppedWithBoundCrashes must not
// count b's later crashes).
func StoppedBeforeBound(u Unit, b Bound, seen BoundSeen) bool {
	return u.ActiveExitMono > 0 && b.ActiveExitMono > u.ActiveExitMono && b.NRestarts <= seen.NRestarts
}

// UnitsReader is a Manager that reads several units in one exchange (DBus).
type UnitsReader interface {
	Units(ctx context.Context, names ...string) ([]Unit, error)
}

// UnitsOf reads units with m: all at once where m can, else one by one.
func UnitsOf(ctx context.Context, m Manager, names ...string) ([]Unit, error) {
	if r, ok := m.(UnitsReader); ok {
		return r.Units(ctx, names...)
	}
	out := make([]Unit, 0, len(names))
	for _, n := range names {
		u, err := m.Unit(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// LoadStater is a Manager that reads a unit's LoadState alone (DBus).
type LoadStater interface {
	LoadState(ctx context.Context, name string) (string, error)
}

// LoadStateOf reads a unit's LoadState with m: alone where m can, else
// with the rest of the unit.
func LoadStateOf(ctx context.Context, m Manager, name string) (string, error) {
	if l, ok := m.(LoadStater); ok {
		return l.LoadState(ctx, name)
	}
	u, err := m.Unit(ctx, name)
	return u.LoadState, err
}

func isService(name string) bool {
	return len(name) > 8 && name[len(name)-8:] == ".service"
}

// ErrJobFailed means systemd ran the job and it did not succeed.
var ErrJobFailed = errors.New("systemd job did not succeed")

// JobError is a job that ended with a result other than "done" ("failed",
// "dependency", "timeout", "canceled", ...); it wraps ErrJobFailed.
type JobError struct {
	Unit, Result string
}

func (e *JobError) Error() string {
	return fmt.Sprintf("%s: job result %q: %v", e.Unit, e.Result, ErrJobFailed)
}

func (e *JobError) Unwrap() error { return ErrJobFailed }

// JobCanceled reports whether err is a job that another job replaced
// (result "canceled": someone's stop while it ran).
func JobCanceled(err error) bool {
	var je *JobError
	return errors.As(err, &je) && je.Result == "canceled"
}

// Restart implements Manager. A RestartUnit that systemd left without an
// answer (NoReply: it re-executed, `systemctl daemon-reexec`, with the call
// on its way) is sent once more when systemd did not take it: the unit,
// read once systemd is back, is as it was before the call (its invocation
// and state) with no job. One it took (a job on the unit, or the unit
// moved on) is not sent again, which would run the restart twice (a
// restart merged into a running job runs it again): the restart ends with
// ErrJobReplyLost.
func (d *DBus) Restart(ctx context.Context, name string) error {
	if err := d.ResetFailed(ctx, name); err != nil {
		return notRequested{err}
	}
	// Read for a NoReply only: a read that fails leaves the restart as it
	// was, not retried.
	before, berr := d.Unit(ctx, name)
	restart := func(c *sd.Conn, ctx context.Context, name, _ string, ch chan<- string) (int, error) {
		// Mode "fail", not RunJob's "replace": a stop someone queued
		// between the repairer's read of the unit and this request
		// (`systemctl stop kubelet`, `systemctl stop containerd
		// kubelet`) is theirs; "replace" would cancel it (its result
		// "canceled") and start the unit against it. systemd refuses
		// the request instead ("Transaction ... is destructive").
		const mode = "fail"
		mark := writesFailed(ctx)
		id, err := c.RestartUnitContext(ctx, name, mode, ch)
		if refused(err) {
			return id, fmt.Errorf("%w: %w", ErrJobRefused, err)
		}
		if unsent(err) || err != nil && writesFailed(ctx) > mark {
			return id, notRequested{err}
		}
		if err == nil {
			tookIt(ctx)
		}
		if !isNoReply(err) || berr != nil || ctx.Err() != nil {
			return id, err
		}
		after, aerr := d.Unit(ctx, name)
		if aerr != nil {
			return id, err
		}
		if after.Job != 0 || after.Invocation != before.Invocation || after.ActiveState != before.ActiveState || after.SubState != before.SubState {
			tookIt(ctx)
			return id, ErrJobReplyLost
		}
		mark = writesFailed(ctx)
		id, err = c.RestartUnitContext(ctx, name, mode, ch)
		if refused(err) {
			err = fmt.Errorf("%w: %w", ErrJobRefused, err)
		} else if unsent(err) || err != nil && writesFailed(ctx) > mark {
			err = notRequested{err}
		} else if err == nil {
			tookIt(ctx)
		}
		return id, err
	}
	if err := d.job(ctx, name, restart); err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	return nil
}

// tookKey is the context key of WithTook's func.
type tookKey struct{}

// WithTook returns ctx carrying took, which Restart calls once systemd took
// its request (made the job, or took it before a re-exec left the call
// unanswered): a request systemd refuses (ErrJobRefused) made no job, and is
// no restart started.
func WithTook(ctx context.Context, took func()) context.Context {
	return context.WithValue(ctx, tookKey{}, took)
}

// tookIt calls ctx's WithTook func, if any.
func tookIt(ctx context.Context) {
	if f, ok := ctx.Value(tookKey{}).(func()); ok {
		f()
	}
}

// ErrJobRefused means that systemd answered a job's request with an error
// (a stop job queued that the job would cancel, StopQueued; a unit it needs
// masked since it was read): no job was made, and the unit was not touched
// by it.
var ErrJobRefused = errors.New("systemd refused the job")

// ErrNotRequested means that a job was never asked of systemd: the bus
// could not be reached for it (its connection not made, or its call's
// write failed or found the connection closed), or, for Restart, the
// reset-failed before it failed. No job was made. Its errors read as
// the cause's (errors.Is(err, ErrNotRequested) tells them).
var ErrNotRequested = errors.New("the job was not requested")

// notRequested is an error that kept a job from being requested
// (ErrNotRequested).
type notRequested struct{ error }

func (e notRequested) Unwrap() error { return e.error }

func (notRequested) Is(target error) bool { return target == ErrNotRequested }

// unsent reports whether err, a job call's error, kept the call from
// reaching the bus whole: its connection was closed before it was sent
// (godbus.ErrClosed), or its write failed (the bus's socket closed or
// reset under it: a message cut short is dropped, no call). An error
// after the write (the connection read to its end before the answer) is
// not: systemd may have taken the call.
func unsent(err error) bool {
	var op *net.OpError
	return errors.Is(err, godbus.ErrClosed) || errors.As(err, &op) && op.Op == "write"
}

// StopQueued reports whether err is a job's request that systemd refused
// because it would cancel a stop job queued (someone's `systemctl stop`,
// or a shutdown's): "Transaction ... is destructive". Any other refusal (a
// unit it needs masked or not loadable for a while) is no one's stop.
func StopQueued(err error) bool {
	var ge godbus.Error
	return errors.Is(err, ErrJobRefused) && errors.As(err, &ge) && ge.Name == "org.freedesktop.systemd1.TransactionIsDestructive"
}

// refused reports whether err is systemd's error answer to a job's
// request (a godbus.Error but NoReply, which leaves it unknown whether
// systemd took the job).
func refused(err error) bool {
	var ge godbus.Error
	return errors.As(err, &ge) && !isNoReply(err)
}

// ErrJobReplyLost means that systemd re-executed before it answered a
// job's call, and took the job: its result is unknown, and it may still run.
var ErrJobReplyLost = errors.New("systemd re-executed before it answered, and took the job: its result is unknown (the job may still be running)")

// ResetFailed implements Manager.
func (d *DBus) ResetFailed(ctx context.Context, name string) error {
	return d.call(ctx, func(c *busConn) error {
		err := c.exchange(ctx, []busCall{managerCall("ResetFailedUnit", false, name)}, func(_ int, m message) error {
			if m.typ == msgError {
				return errorOf(m)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("reset-failed %s: %w", name, err)
		}
		return nil
	})
}

// job runs a job on a go-systemd connection made for it (its JobRemoved
// match tells the job's end) and closed after it. The wait for the job's
// end also ends when that connection does (see RunJob).
func (d *DBus) job(ctx context.Context, name string, f JobFunc) error {
	var gone <-chan struct{}
	// The job's connections' failed writes (newBusConn's): a call whose
	// write failed was not sent whole, whatever error godbus gives it.
	writes := new(writeCount)
	c, end, err := dialFor(ctx, func(life context.Context) (*sd.Conn, error) {
		var dial func() (*godbus.Conn, error)
		dial, gone = watchConns(func() (*godbus.Conn, error) {
			c, err := d.dial(life)
			if err == nil {
				writes.add(c)
			}
			return c, err
		})
		return sd.NewConnection(dial)
	}, (*sd.Conn).Close)
	if err != nil {
		return notRequested{fmt.Errorf("connecting to systemd over D-Bus: %w", err)}
	}
	defer end()
	defer c.Close()
	return RunJob(context.WithValue(ctx, writesKey{}, writes), c, gone, name, f)
}

// watchConns returns dial, which also watches the connections it makes,
// and gone, closed once one of them is: by its peer (godbus closes a
// connection on a read error: dbus-daemon stopped or restarted, the socket
// broke) or by Close. go-systemd's connection is two (calls and signals),
// and never dials again.
func watchConns(dial func() (*godbus.Conn, error)) (func() (*godbus.Conn, error), <-chan struct{}) {
	gone := make(chan struct{})
	var once sync.Once
	return func() (*godbus.Conn, error) {
		c, err := dial()
		if err == nil {
			go func() {
				<-c.Context().Done()
				once.Do(func() { close(gone) })
			}()
		}
		return c, err
	}, gone
}

// JobFunc is one of go-systemd's job methods (StartUnitContext,
// RestartUnitContext, ...).
type JobFunc func(*sd.Conn, context.Context, string, string, chan<- string) (int, error)

// ErrJobConnLost means that the connection a job's end was to be told on
// closed before it was (dbus-daemon restarted, the socket broke): the
// job's result is unknown, and the job may still run. go-systemd does not
// dial again, so its JobRemoved would never come.
var ErrJobConnLost = errors.New("D-Bus connection lost while waiting for the job's result (the job may still be running)")

// RunJob starts a job for unit name with mode "replace" and waits for its
// result; a result other than "done" is a *JobError (wrapping ErrJobFailed).
// It also ends when gone is closed (the job's connection closed, see
// watchConns; nil: not watched), with ErrJobConnLost unless the result came
// first.
func RunJob(ctx context.Context, c *sd.Conn, gone <-chan struct{}, name string, f JobFunc) error {
	ch := make(chan string, 1)
	if _, err := f(c, ctx, name, "replace", ch); err != nil {
		return err
	}
	result := func(res string) error {
		if res != "done" {
			return &JobError{Unit: name, Result: res}
		}
		return nil
	}
	select {
	case res := <-ch:
		return result(res)
	case <-gone:
		select {
		case res := <-ch:
			return result(res)
		default:
			return ErrJobConnLost
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}
