//go:build integration

package tests

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// A refused reload whose error holds backslashes (a key with a control
// character, which the error writes \u0001; a regular expression's \d)
// shows them in `systemctl status` as in the journal, under the shipped
// unit in a real systemd 252. Before, systemd's split of the notification
// took each backslash as an escape: `checks.DiskUsageHigh."xu0001y"`.
func TestRefusedReloadsBackslashesInSystemctlStatus(t *testing.T) {
	harness.Parallel(t, 1)
	port, tok := freeTCPPort(t), harness.Token()
	good := diskUsageOnly("backslash-"+tok, port, 1)
	s := daemonNamespace(t, "backslash", nil, good, "autopilot-health.service")
	ctx := context.Background()
	const unit = "autopilot-health.service"
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := os.WriteFile(s.Root("/etc/autopilot-health/config.toml"), []byte(good+"\"x\\u0001y\" = 2 # C:\\temp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadUnit(ctx, unit); err == nil {
		t.Errorf("the reload of a file with an unknown key succeeded")
	}
	want := `configuration reload refused (running on the previous one): /etc/autopilot-health/config.toml:`
	key := `key checks.DiskUsageHigh."x\u0001y": unknown key`
	eventually(t, 20*time.Second, "the refusal with its backslash in systemctl status's line", func() (bool, string) {
		sp, err := s.Properties(ctx, unit, "Service")
		if err != nil {
			return false, err.Error()
		}
		st, _ := sp["StatusText"].Value().(string)
		return strings.HasPrefix(st, want) && strings.Contains(st, key), st
	})
	// As ExecReload='s line in the journal has it.
	// ExecReload='s output reaches the journal through journald's stream,
	// which the reload job's end does not wait for: awaited, not read at once.
	eventually(t, 10*time.Second, "ExecReload='s refusal with "+key+" in the journal", func() (bool, string) {
		j := s.Journal(unit)
		return strings.Contains(j, "autopilot-health reload: refused: /etc/autopilot-health/config.toml:") && strings.Contains(j, key), lastBytes(j, 800)
	})
}
