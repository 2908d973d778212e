// Package systemd is the daemon's one place that talks to systemd: unit
// properties, restart and reset-failed over D-Bus (never systemctl). It
// reconnects when the bus drops (systemd re-exec, dbus restart).
package systemd

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
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
	// RestartDelay is the service's RestartSec (0 for other unit types).
	RestartDelay time.Duration `json:"-"`
	// Restart is the service's Restart= setting ("no", "always", ...).
	Restart string `json:"-"`
	// Job is the id of a job queued or running for the unit (0: none), e.g.
	// a start job waiting for the units it is ordered after.
	Job uint32 `json:"job,omitempty"`
}

// Manager is what the daemon needs from systemd.
type Manager interface {
	Unit(ctx context.Context, name string) (Unit, error)
	// Restart restarts a unit (RestartUnit, mode "replace") and waits for
	// the job. The unit is reset first (ResetFailedUnit, which also resets
	// its start rate limit), so our restarts never push it into
	// start-limit-hit.
	Restart(ctx context.Context, name string) error
	ResetFailed(ctx context.Context, name string) error
}

// DBus is a Manager over the system bus.
type DBus struct {
	mu   sync.Mutex
	conn *sd.Conn
	// end ends the connection's context (dialFor), after it is closed.
	end  context.CancelFunc
	dial func(ctx context.Context) (*sd.Conn, error)
	// Reconnects counts new connections after the first.
	Reconnects int
}

// NewDBus returns a Manager that connects on first use to the system bus
// (DBUS_SYSTEM_BUS_ADDRESS, default /run/dbus/system_bus_socket).
func NewDBus() *DBus {
	return &DBus{dial: sd.NewSystemConnectionContext}
}

// NewDBusAt connects to the system bus at a unix socket path (tests reach
// a systemd in another mount namespace this way).
func NewDBusAt(socket string) *DBus {
	return &DBus{dial: func(ctx context.Context) (*sd.Conn, error) {
		return sd.NewConnection(func() (*godbus.Conn, error) { return DialBus(ctx, socket) })
	}}
}

// DialBus opens an authenticated connection to the bus at a unix socket.
func DialBus(ctx context.Context, socket string) (*godbus.Conn, error) {
	c, err := godbus.Dial("unix:path="+socket, godbus.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	if err := c.Auth(nil); err != nil {
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
func (d *DBus) get(ctx context.Context) (*sd.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil && d.conn.Connected() {
		return d.conn, nil
	}
	if d.conn != nil {
		d.closeLocked()
		d.Reconnects++
	}
	c, end, err := dialFor(ctx, d.dial)
	if err != nil {
		return nil, fmt.Errorf("connecting to systemd over D-Bus: %w", err)
	}
	d.conn, d.end = c, end
	return c, nil
}

// dialFor dials a connection that outlives the call that needs it: godbus
// closes a connection when the context it was dialed with is done, and a
// check's run has a context of its own, so a connection dialed with it
// lived for one run (every unit read dialed the bus twice, authenticated
// and said Hello again). The connection gets a context of its own, ended
// only to abandon a dial that ctx stopped waiting for (which closes what
// was half made; one that completes anyway is closed), or by end, which
// the caller calls once it closed the connection.
func dialFor(ctx context.Context, dial func(ctx context.Context) (*sd.Conn, error)) (c *sd.Conn, end context.CancelFunc, err error) {
	type result struct {
		c   *sd.Conn
		err error
	}
	life, abandon := context.WithCancel(context.WithoutCancel(ctx))
	ch := make(chan result, 1)
	go func() {
		c, err := dial(life)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			abandon()
			return nil, nil, r.err
		}
		return r.c, abandon, nil
	case <-ctx.Done():
		abandon()
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, nil, ctx.Err()
	}
}

// drop forgets a connection that failed, so the next call dials again.
func (d *DBus) drop(c *sd.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == c && !c.Connected() {
		d.closeLocked()
		d.Reconnects++
	}
}

// call runs f on a live connection; when the connection turns out to be
// dead it reconnects and tries once more.
func (d *DBus) call(ctx context.Context, f func(c *sd.Conn) error) error {
	for attempt := 0; ; attempt++ {
		c, err := d.get(ctx)
		if err != nil {
			return err
		}
		err = f(c)
		if err == nil || c.Connected() || attempt > 0 {
			return err
		}
		d.drop(c)
	}
}

// Close closes the connection.
func (d *DBus) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closeLocked()
}

// closeLocked closes the connection, if any, and ends its context.
func (d *DBus) closeLocked() {
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
	if d.end != nil {
		d.end()
		d.end = nil
	}
}

// Unit reads a unit's properties. A unit that does not exist is not an
// error: systemd reports LoadState "not-found".
func (d *DBus) Unit(ctx context.Context, name string) (Unit, error) {
	u := Unit{Name: name}
	err := d.call(ctx, func(c *sd.Conn) error {
		p, err := c.GetUnitPropertiesContext(ctx, name)
		if err != nil {
			return fmt.Errorf("unit %s: %w", name, err)
		}
		u.LoadState, _ = p["LoadState"].(string)
		u.ActiveState, _ = p["ActiveState"].(string)
		u.SubState, _ = p["SubState"].(string)
		if j, ok := p["Job"].([]any); ok && len(j) == 2 {
			u.Job, _ = j[0].(uint32)
		}
		if id, ok := p["InvocationID"].([]byte); ok && len(id) > 0 {
			u.Invocation = hex.EncodeToString(id)
		}
		if u.LoadState != "loaded" || !isService(name) {
			return nil
		}
		s, err := c.GetUnitTypePropertiesContext(ctx, name, "Service")
		if err != nil {
			return fmt.Errorf("unit %s: %w", name, err)
		}
		u.Result, _ = s["Result"].(string)
		u.NRestarts, _ = s["NRestarts"].(uint32)
		u.Restart, _ = s["Restart"].(string)
		if us, ok := s["RestartUSec"].(uint64); ok {
			u.RestartDelay = time.Duration(us) * time.Microsecond
		}
		if us, ok := s["ExecMainStartTimestamp"].(uint64); ok && us > 0 {
			u.MainStart = time.UnixMicro(int64(us))
		}
		return nil
	})
	return u, err
}

// LoadState reads a unit's LoadState alone ("loaded", "not-found", ...):
// one property, where Unit reads them all (BenchmarkUnitRead in tests/).
func (d *DBus) LoadState(ctx context.Context, name string) (string, error) {
	var state string
	err := d.call(ctx, func(c *sd.Conn) error {
		p, err := c.GetUnitPropertyContext(ctx, name, "LoadState")
		if err != nil {
			return fmt.Errorf("unit %s: %w", name, err)
		}
		state, _ = p.Value.Value().(string)
		return nil
	})
	return state, err
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

// Restart implements Manager.
func (d *DBus) Restart(ctx context.Context, name string) error {
	if err := d.ResetFailed(ctx, name); err != nil {
		return err
	}
	if err := d.job(ctx, name, (*sd.Conn).RestartUnitContext); err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	return nil
}

// ResetFailed implements Manager.
func (d *DBus) ResetFailed(ctx context.Context, name string) error {
	return d.call(ctx, func(c *sd.Conn) error {
		if err := c.ResetFailedUnitContext(ctx, name); err != nil {
			return fmt.Errorf("reset-failed %s: %w", name, err)
		}
		return nil
	})
}

func (d *DBus) job(ctx context.Context, name string, f JobFunc) error {
	return d.call(ctx, func(c *sd.Conn) error { return RunJob(ctx, c, name, f) })
}

// JobFunc is one of go-systemd's job methods (StartUnitContext,
// RestartUnitContext, ...).
type JobFunc func(*sd.Conn, context.Context, string, string, chan<- string) (int, error)

// RunJob starts a job for unit name with mode "replace" and waits for its
// result; a result other than "done" is an error wrapping ErrJobFailed.
func RunJob(ctx context.Context, c *sd.Conn, name string, f JobFunc) error {
	ch := make(chan string, 1)
	if _, err := f(c, ctx, name, "replace", ch); err != nil {
		return err
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("%s: job result %q: %w", name, res, ErrJobFailed)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
