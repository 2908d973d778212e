package harness

import (
	"context"
	"fmt"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/syself/autopilot-health/internal/systemd"
)

// What the tests do to the namespaced systemd besides what the daemon does
// (internal/systemd reads units, restarts and resets them): start, stop and
// kill units, reload, read the manager's state. Each call has a connection
// of its own to the container's bus.

// dialBus opens an authenticated connection to the container's system bus.
func (s *Systemd) dialBus(ctx context.Context) (*godbus.Conn, error) {
	return systemd.DialBus(ctx, s.BusSocket())
}

// manager runs f on a new go-systemd connection to the container's bus.
func (s *Systemd) manager(ctx context.Context, f func(*sd.Conn) error) error {
	c, err := sd.NewConnection(func() (*godbus.Conn, error) { return s.dialBus(ctx) })
	if err != nil {
		return fmt.Errorf("connecting to the namespaced systemd: %w", err)
	}
	defer c.Close()
	return f(c)
}

// SystemState returns the manager's SystemState ("running", "degraded", ...).
func (s *Systemd) SystemState(ctx context.Context) (string, error) {
	var st string
	err := s.manager(ctx, func(c *sd.Conn) error {
		p, err := c.SystemStateContext(ctx)
		if err != nil {
			return err
		}
		st, _ = p.Value.Value().(string)
		return nil
	})
	return st, err
}

// Reload makes systemd reload its unit files.
func (s *Systemd) Reload(ctx context.Context) error {
	return s.manager(ctx, func(c *sd.Conn) error { return c.ReloadContext(ctx) })
}

// StartUnit starts a unit and waits for the job.
func (s *Systemd) StartUnit(ctx context.Context, name string) error {
	return s.job(ctx, name, (*sd.Conn).StartUnitContext)
}

// StopUnit stops a unit and waits for the job.
func (s *Systemd) StopUnit(ctx context.Context, name string) error {
	return s.job(ctx, name, (*sd.Conn).StopUnitContext)
}

// RestartUnit restarts a unit (systemctl restart; the units PartOf= it
// are restarted with it) and waits for the job.
func (s *Systemd) RestartUnit(ctx context.Context, name string) error {
	return s.job(ctx, name, (*sd.Conn).RestartUnitContext)
}

// ReloadUnit reloads a unit (systemctl reload: its ExecReload=) and waits
// for the job.
func (s *Systemd) ReloadUnit(ctx context.Context, name string) error {
	return s.job(ctx, name, (*sd.Conn).ReloadUnitContext)
}

// KillMain sends a signal to the unit's main process (a crash, a hang).
func (s *Systemd) KillMain(ctx context.Context, name string, sig int32) error {
	return s.manager(ctx, func(c *sd.Conn) error {
		return c.KillUnitWithTarget(ctx, name, sd.Main, sig)
	})
}

func (s *Systemd) job(ctx context.Context, name string, f systemd.JobFunc) error {
	return s.manager(ctx, func(c *sd.Conn) error { return systemd.RunJob(ctx, c, nil, name, f) })
}
