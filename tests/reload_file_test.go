//go:build integration

package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// The configuration file as an operator's tools leave it, reloaded under
// the shipped unit (README: "Reloading the configuration"):
//   - replaced by an editor's rename (a new inode): `systemctl reload`
//     reads the new file and applies it;
//   - made unreadable (mode 0000: the unit holds no capability, so root
//     cannot read it): the reload job fails, the journal names the file and
//     why, the daemon runs on the same process with what it had, and
//     systemctl status says so;
//   - readable again as it was: the reload applies (no changes) and the
//     refusal leaves the status line.
func TestReloadOfARenamedAndAnUnreadableFileUnderSystemd(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	s, _ := shippedUnitSystemd(t, "autopilot-health-reloadfile-", nil, false)
	ctx := context.Background()
	etc := s.Root("/etc/autopilot-health")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	off := checksOffBut("DiskUsageHigh")
	port := freeTCPPort(t)
	cfgPath := filepath.Join(etc, "config.toml")
	text := func(percent int) string {
		return fmt.Sprintf("node_name = \"reloadfile\"\nrole = \"worker\"\ngpu = \"false\"\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n"+
			"[runner]\nfirst_run_spread = \"0s\"\n[kubernetes]\nkubeconfig = \"\"\n[kmsg]\nenabled = false\n%s[checks.DiskUsageHigh]\nspace_percent = %d\n", port, off, percent)
	}
	if err := os.WriteFile(cfgPath, []byte(text(90)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("start: %v", err)
	}
	mainPID := func() uint32 {
		pid, err := s.MainPID(ctx, "autopilot-health.service")
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	statusText := func() string {
		p, _ := s.Properties(ctx, "autopilot-health.service", "Service")
		v, _ := p["StatusText"].Value().(string)
		return v
	}
	pid := mainPID()

	// An editor's save: written aside, renamed over the file.
	tmp := cfgPath + ".swp"
	if err := os.WriteFile(tmp, []byte(text(91)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cfgPath); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("reload of the renamed file: %v", err)
	}
	eventually(t, 10*time.Second, "the renamed file applied", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return strings.Contains(j, "config reloaded from /etc/autopilot-health/config.toml: checks changed: DiskUsageHigh") &&
			strings.Contains(j, "checks.DiskUsageHigh.space_percent"), lastBytes(j, 800)
	})
	if v, last := metricOf(t, port, `autopilot_health_config_reloads_total{result="ok"}`); v != 1 {
		t.Errorf("the reload of the renamed file: %s", last)
	}

	// Unreadable: refused, naming the file and why.
	if err := os.Chmod(cfgPath, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); !errors.Is(err, systemd.ErrJobFailed) {
		t.Errorf("reload of the unreadable file: %v, want the job failed", err)
	}
	eventually(t, 10*time.Second, "the refusal of the unreadable file in the journal", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return strings.Contains(j, "configuration reload refused; running on the previous configuration") &&
			strings.Contains(j, "/etc/autopilot-health/config.toml: permission denied") &&
			strings.Contains(j, "autopilot-health reload: refused:"), lastBytes(j, 800)
	})
	if v, last := metricOf(t, port, "autopilot_health_config_last_reload_successful"); v != 0 {
		t.Errorf("after the refusal of the unreadable file: %s", last)
	}
	if st := statusText(); !strings.HasPrefix(st, "configuration reload refused (running on the previous one): ") || !strings.Contains(st, "permission denied") {
		t.Errorf("status line after the refusal: %q", st)
	}
	if p := mainPID(); p != pid {
		t.Errorf("main PID %d, was %d: the daemon restarted", p, pid)
	}

	// Readable again, as it was: nothing to change, the refusal ends.
	if err := os.Chmod(cfgPath, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("reload of the file readable again: %v", err)
	}
	eventually(t, 10*time.Second, "the refusal gone from systemctl status", func() (bool, string) {
		st := statusText()
		return hasSummary(st) && !strings.Contains(st, "refused"), st
	})
	// Logged before the reload's answer, but through journald's stream,
	// which the answer does not wait for: awaited, not read at once.
	eventually(t, 10*time.Second, "the reload of the file readable again logged as no changes", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return strings.Contains(j, "config reloaded, no changes"), lastBytes(j, 800)
	})
	if p := mainPID(); p != pid {
		t.Errorf("main PID %d, was %d: the daemon restarted", p, pid)
	}
}
