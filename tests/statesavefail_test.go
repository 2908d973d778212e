//go:build integration

package tests

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// The shipped daemon under its unit in a real systemd 252, its state file's
// saves failing at once (a directory in state.json's place: the rename
// fails, as on a full or read-only state_dir the temp file's write does):
// `systemctl status`'s line and `autopilot-health status` say the state is
// not saved, with the file and the error, the unit stays active, and once a
// save works again both notes go. Before, only one journal line said so.
func TestFailingStateSavesShowInSystemctlStatus(t *testing.T) {
	harness.Parallel(t, 1)
	port, tok := freeTCPPort(t), harness.Token()
	cfgText := func(percent int) string { return diskUsageOnly("savefail-"+tok, port, percent) }
	s := daemonNamespace(t, "savefail", nil, cfgText(1), "autopilot-health.service")
	ctx := context.Background()
	const unit = "autopilot-health.service"
	statusText := func() string {
		sp, err := s.Properties(ctx, unit, "Service")
		if err != nil {
			return err.Error()
		}
		v, _ := sp["StatusText"].Value().(string)
		return v
	}
	screen := func() string {
		out, _ := exec.Command(s.Root("/usr/bin/autopilot-health"), "status", "--socket", s.Root("/run/autopilot-health/status.sock")).CombinedOutput()
		return string(out)
	}
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatalf("start: %v", err)
	}
	eventually(t, 30*time.Second, "DiskUsageHigh True", func() (bool, string) {
		st := statusText()
		return strings.Contains(st, "1 problem (DiskUsageHigh)"), st
	})
	state := s.Root("/var/lib/autopilot-health/state.json")
	if err := os.Remove(state); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	// A new status (False at 99%) wants a save within a second.
	if err := os.WriteFile(s.Root("/etc/autopilot-health/config.toml"), []byte(cfgText(99)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadUnit(ctx, unit); err != nil {
		t.Fatalf("reload: %v", err)
	}
	want := "state not saved: the saves of /var/lib/autopilot-health/state.json have failed since "
	eventually(t, 30*time.Second, "the failing saves in systemctl status's line", func() (bool, string) {
		st := statusText()
		return strings.HasPrefix(st, want) && strings.Contains(st, "1 condition: 1 ok"), st
	})
	if sc := screen(); !strings.Contains(sc, "STATE NOT SAVED: the saves of /var/lib/autopilot-health/state.json have failed since") {
		t.Errorf("autopilot-health status:\n%s", sc)
	}
	if u, err := s.Bus.Unit(ctx, unit); err != nil || !active(u) {
		t.Errorf("the unit while its saves fail: %+v %v", u, err)
	}
	// Room again: a retry (1 s doubling) saves, and the notes go.
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the note gone once a save works", func() (bool, string) {
		st := statusText()
		return !strings.Contains(st, "state not saved") && strings.Contains(st, "1 condition: 1 ok"), st
	})
	if sc := screen(); strings.Contains(sc, "STATE NOT SAVED") {
		t.Errorf("autopilot-health status after a save worked:\n%s", sc)
	}
	if fi, err := os.Stat(state); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("state.json after the saves work again: %v %v", fi, err)
	}
}
