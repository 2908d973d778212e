package systemd

import (
	"context"
	"testing"
	"time"
)

// The daemon's own manager, NewDBus (the system bus, as the daemon and its
// commands make it), dials its job connections so that their failed writes
// are counted (newBusConn), as NewDBusAt's are: the count is what tells a
// RestartUnit whose write the bus cut from one systemd may have taken
// (TestRestartWhoseCallsWriteIsCutIsNotRequested, over NewDBusAt). Before,
// NewDBus dialed with godbus.SystemBusPrivate, whose connections no watch
// counted, so on a node the restart godbus ended with EOF first was still
// counted restarted. A closed connection leaves the registry.
func TestSystemBusJobConnectionsCountTheirFailedWrites(t *testing.T) {
	sock, _ := privateBus(t)
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+sock)
	d := NewDBus()
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := d.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := watches.Load(c); !ok {
		c.Close()
		t.Fatal("a job connection of NewDBus has no writeWatch: its failed writes are not counted")
	}
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, ok := watches.Load(c); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection's writeWatch is still registered after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
