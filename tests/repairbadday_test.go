//go:build integration

package tests

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
)

// lockedBuf is a log sink safe for the repairer's restart goroutine.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A bad day for the repairer, against systemd 252 over D-Bus: a unit whose
// restart systemd refuses (RefuseManualStart=yes), a unit activating for a
// long time (its ExecStartPre= hangs), and a unit this node does not have.
// Each probe that fails asks for a repair, as KubeletUnhealthy does every
// 10 s: the refused restart is requested once, its error logged once and
// counted failed once, and the probes after it within the cooldown ask
// systemd for nothing more; the starting unit is left to systemd (no
// restart mid-start), and the missing one is not repaired, with no log.
func TestRepairOnABadDayOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const refuse, slow, node, missing = "bd-refuse.service", "bd-slow.service", "bd-node.target", "bd-not-installed.service"
	if err := s.AddUnit(ctx, refuse, "[Unit]\nDefaultDependencies=no\nRefuseManualStart=yes\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, slow, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStartPre=/bin/sleep infinity\nExecStart=/bin/sleep infinity\nTimeoutStartSec=infinity\n"); err != nil {
		t.Fatal(err)
	}
	// Started as a dependency (RefuseManualStart= refuses only a start
	// asked for by name); the target does not wait for either.
	if err := s.AddUnit(ctx, node, "[Unit]\nDefaultDependencies=no\nWants="+refuse+" "+slow+"\n"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, slow)
	defer s.StopUnit(ctx, refuse)
	defer s.StopUnit(ctx, node)
	if err := s.StartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	before := waitUnit(t, s, refuse, "the unit that refuses a manual start up", active)
	waitUnit(t, s, slow, "the slow unit in its ExecStartPre=", func(u systemd.Unit) bool { return u.ActiveState == "activating" })

	var logs lockedBuf
	reg := prometheus.NewRegistry()
	r := checks.NewRepairer(s.Bus, slog.New(slog.NewTextHandler(&logs, nil)), time.Now, reg)
	repairs := func(unit, result string) float64 {
		return repairsCounted(t, reg, unit, result)
	}

	t.Run("refused restart", func(t *testing.T) {
		// A cooldown the unit's start a moment ago has passed; the probes
		// after it hold a minute's, counted from the refused request.
		if res, msg := r.Repair(ctx, refuse, time.Millisecond, "healthz failed"); res != checks.RepairRestarted {
			t.Fatalf("the first failed probe: %s %q, want %s (requested)", res, msg, checks.RepairRestarted)
		}
		r.Wait()
		st := r.Status(refuse)
		if !strings.Contains(st.LastResult, systemd.ErrJobRefused.Error()) || !strings.Contains(st.LastResult, "manual") {
			t.Errorf("the restart's result: %q, want systemd's refusal, in its words", st.LastResult)
		}
		// The probes of the next minute: the cooldown, nothing asked of
		// systemd, nothing logged.
		for range 6 {
			if res, msg := r.Repair(ctx, refuse, time.Minute, "healthz failed"); res != checks.RepairCooldown {
				t.Errorf("a probe within the cooldown after a refused restart: %s %q, want %s", res, msg, checks.RepairCooldown)
			}
		}
		r.Wait()
		if got := repairs(refuse, checks.RepairFailed); got != 1 {
			t.Errorf("repairs_total{result=failed}: %v, want 1", got)
		}
		// No job started: not a restart (README: restarted is "a restart
		// job started").
		if got := repairs(refuse, checks.RepairRestarted); got != 0 {
			t.Errorf("repairs_total{result=restarted} for a request systemd refused: %v, want 0", got)
		}
		if got := repairs(refuse, checks.RepairCooldown); got != 6 {
			t.Errorf("repairs_total{result=cooldown}: %v, want 6", got)
		}
		if st := r.Status(refuse); st.Repairs != 1 {
			t.Errorf("restarts requested: %d, want 1", st.Repairs)
		}
		if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
			t.Errorf("%d errors logged, want 1:\n%s", n, logs.String())
		}
		if u := waitUnit(t, s, refuse, "the unit", func(systemd.Unit) bool { return true }); !active(u) || u.Invocation != before.Invocation {
			t.Errorf("the unit after the refused restart: %s/%s at %s (before: %s), want running, untouched", u.ActiveState, u.SubState, u.Invocation, before.Invocation)
		}
	})

	t.Run("activating for long", func(t *testing.T) {
		for range 3 {
			if res, msg := r.Repair(ctx, slow, time.Millisecond, "healthz failed"); res != checks.RepairSystemd {
				t.Errorf("a unit in its ExecStartPre=: %s %q, want %s (left to systemd)", res, msg, checks.RepairSystemd)
			}
		}
		r.Wait()
		if u := waitUnit(t, s, slow, "the slow unit", func(systemd.Unit) bool { return true }); u.ActiveState != "activating" || u.SubState != "start-pre" {
			t.Errorf("the slow unit after the probes: %s/%s, want still activating/start-pre", u.ActiveState, u.SubState)
		}
		if st := r.Status(slow); st.Repairs != 0 {
			t.Errorf("restarts of a starting unit: %d, want 0", st.Repairs)
		}
	})

	t.Run("not installed", func(t *testing.T) {
		logged := logs.String()
		for range 3 {
			if res, msg := r.Repair(ctx, missing, time.Millisecond, "healthz failed"); res != checks.RepairNotLoaded || !strings.Contains(msg, "is not installed (not-found)") {
				t.Errorf("a unit not installed: %s %q, want %s, not installed", res, msg, checks.RepairNotLoaded)
			}
		}
		r.Wait()
		if got := repairs(missing, checks.RepairNotLoaded); got != 3 {
			t.Errorf("repairs_total{result=not-loaded}: %v, want 3", got)
		}
		if more := strings.TrimPrefix(logs.String(), logged); more != "" {
			t.Errorf("logged for a unit not installed:\n%s", more)
		}
	})
}

// repairsCounted is autopilot_health_repairs_total{unit,result} in reg.
func repairsCounted(t *testing.T, reg *prometheus.Registry, unit, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_repairs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["unit"] == unit && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
