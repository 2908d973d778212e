package checks

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// failingUnit makes reads of one unit fail.
type failingUnit struct {
	*fakeManager
	name string
	fail bool
}

func (f *failingUnit) Unit(ctx context.Context, name string) (systemd.Unit, error) {
	if f.fail && name == f.name {
		return systemd.Unit{}, errors.New("bus gone")
	}
	return f.fakeManager.Unit(ctx, name)
}

// A run that fails half-way (a later unit cannot be read) does not move
// the flapping baseline: the restarts it saw are reported by the next run
// that completes. Before, they were forgotten.
func TestServiceNotRecoveringKeepsRestartsOfAFailedRun(t *testing.T) {
	m := newFakeManager(running("kubelet.service"), running("containerd.service"), running("syself-proxy.service"))
	f := &failingUnit{fakeManager: m, name: "containerd.service"}
	env := testEnv(t, nil)
	env.Systemd = f
	env.Units = NewUnitWatch(nil, nil)
	c, _ := newServiceNotRecovering(env)
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
		t.Fatalf("baseline: %+v %v", r, err)
	}
	m.crash("kubelet.service", 3)
	f.fail = true
	if _, err := c.Probe(context.Background()); err == nil {
		t.Fatal("the run with an unreadable unit did not fail")
	}
	f.fail = false
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonUnitFlapping || !strings.Contains(r.Message, "kubelet.service restarted 3 times") {
		t.Errorf("after the failed run: %+v %v", r, err)
	}
}
