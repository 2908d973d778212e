package checks

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
)

// bindsToManager answers BindsTo with err (nil: none bound).
type bindsToManager struct {
	*fakeManager
	err error
}

func (m *bindsToManager) BindsTo(context.Context, string) ([]systemd.Bound, error) { return nil, m.err }

var _ systemd.BindsToReader = (*bindsToManager)(nil)

// A stopped kubelet is probed every 10 s; while systemd does not answer
// the read of the units it BindsTo=, the warning is logged once per
// change of the error, not at every probe (360 lines an hour).
func TestStoppedWithBoundReadFailureLoggedOncePerChange(t *testing.T) {
	var logs bytes.Buffer
	m := &bindsToManager{fakeManager: newFakeManager(), err: errors.New("dbus: NoReply")}
	r := NewRepairer(m, slog.New(slog.NewTextHandler(&logs, nil)), time.Now, nil)
	u := systemd.Unit{Name: "kubelet.service", ActiveState: "inactive", SubState: "dead"}
	count := func() int { return strings.Count(logs.String(), "reading the units a stopped unit BindsTo= failed") }
	for range 3 {
		if r.stoppedWithBound(t.Context(), u) {
			t.Fatal("a failed read taken for a stop with its bound unit")
		}
	}
	if n := count(); n != 1 {
		t.Errorf("the same failed read logged %d times over 3 probes, want once:\n%s", n, logs.String())
	}
	m.err = errors.New("dbus: connection closed")
	r.stoppedWithBound(t.Context(), u)
	if n := count(); n != 2 {
		t.Errorf("a new error logged %d times in all, want 2", n)
	}
	m.err = nil
	r.stoppedWithBound(t.Context(), u)
	m.err = errors.New("dbus: connection closed")
	r.stoppedWithBound(t.Context(), u)
	if n := count(); n != 3 {
		t.Errorf("the error again after a read that worked logged %d times in all, want 3", n)
	}
}
