package checks

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/systemd"
)

// unsentRestart is a manager whose unit reads are a test's but whose
// restart is the real D-Bus client's, on a bus that is gone by the time
// the restart goes out (dbus-daemon restarted between the repairer's read
// of the unit and its request): no request reaches systemd.
type unsentRestart struct {
	*fakeManager
	bus *systemd.DBus
}

func (m unsentRestart) Restart(ctx context.Context, name string) error {
	return m.bus.Restart(ctx, name)
}

// A restart whose request never left (the bus could not be reached for its
// reset-failed or its job) started no job: it counts under failed only, as
// a request systemd refused does, never under restarted (README: "a restart
// job started"). Before, every error but a refusal counted restarted too.
func TestRepairWhoseRequestNeverLeftIsNoRestart(t *testing.T) {
	u := running("kubelet.service")
	u.ActiveState, u.SubState, u.Result = "failed", "failed", "exit-code"
	bus := systemd.NewDBusAt(filepath.Join(t.TempDir(), "gone.sock"))
	defer bus.Close()
	r := NewRepairer(unsentRestart{newFakeManager(u), bus}, quietLog(), time.Now, nil)
	if res, msg := r.Repair(context.Background(), "kubelet.service", 0, "healthz failed"); res != RepairRestarted {
		t.Fatalf("repair: %s (%s), want %s (the request is made on its own)", res, msg, RepairRestarted)
	}
	r.Wait()
	restarted := testutil.ToFloat64(r.repairs.WithLabelValues("kubelet.service", RepairRestarted))
	failed := testutil.ToFloat64(r.repairs.WithLabelValues("kubelet.service", RepairFailed))
	if restarted != 0 || failed != 1 {
		t.Errorf("a restart whose request never reached systemd (%s): restarted %v, failed %v; want 0 and 1",
			r.Status("kubelet.service").LastResult, restarted, failed)
	}
}
