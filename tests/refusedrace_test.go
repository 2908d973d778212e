//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// TestRefusedFileFixedAsTheDaemonExitsIsStarted: under the shipped units in
// a real systemd 252, a configuration file fixed after the refusing
// daemon's last look at it and before systemd has taken its exit (here: by
// the unit's own ExecStopPost=, a rename onto the file, as an editor's save
// or dpkg does, after the main process exited and before the unit is
// failed) starts the daemon, without anyone's systemctl: the path unit
// that started the refusing daemon (refuseThenWriteAgain) watches nothing
// until the unit is failed, and its PathChanged= is not a level the
// re-watch would see.
func TestRefusedFileFixedAsTheDaemonExitsIsStarted(t *testing.T) {
	const unit = "autopilot-health.service"
	s := fixedAsItExitsNamespace(t, "refusedrace")
	fixed := fixedAsItExits
	ctx := context.Background()
	refuseThenWriteAgain(t, s)
	eventually(t, 30*time.Second, "the fixed file in place", func() (bool, string) {
		_, err := os.Stat(s.Root(fixed))
		return os.IsNotExist(err), fmt.Sprint(err)
	})
	eventually(t, 10*time.Second, "the daemon started on the file fixed as it exited", func() (bool, string) {
		j := s.Journal(unit)
		return strings.Contains(j, `msg=starting`), lastBytes(j, 600)
	})
	waitUnitFor(t, s, unit, 2*time.Minute, "active on the fixed file", active)
	if j := s.Journal("autopilot-health-refused.service"); !strings.Contains(j, "/etc/autopilot-health/config.toml: changed since it was refused") {
		t.Errorf("autopilot-health-refused.service did not find the change:\n%s", lastBytes(j, 2000))
	}
	if n := strings.Count(s.Journal(unit), "refusing to start"); n != 2 {
		t.Errorf("%d refusals, want 2", n)
	}
	// The fixed daemon's exit (a stop) starts nothing: the record of the
	// refusal went with its start.
	if err := s.StopUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // nothing is to happen: a window of time is the measure
	if u, err := s.Bus.Unit(ctx, unit); err != nil || u.ActiveState != "inactive" {
		t.Errorf("the daemon stopped by hand: %+v %v, want inactive", u, err)
	}
}

// TestRefusedRecordOfAnotherStartStartsNothing: a record that is not the
// failed start's own (as one a start could not remove, left from an
// earlier refusal: here the unit's ExecStopPost= rewrites the record's
// start after the refusing process wrote it) starts nothing, though the
// file it names changed: the record names another start than the daemon
// unit's last (its InvocationID; systemd 252 gives an OnFailure= unit's
// ExecCondition= no $MONITOR_INVOCATION_ID, so refused-changed asks
// systemd). Before, a stale record started the daemon on any
// later failure of its unit (a stop that timed out), against the
// operator's stop.
//
// The rename is made on a refusal the path unit started
// (refuseThenWriteAgain), so that nothing but
// autopilot-health-refused.service can start the daemon on the change. On
// a systemctl start's refusal the path unit watched as the daemon exited,
// and on a loaded node (PID 1 reading the exit before the rename) started
// the daemon on the rename itself (CI: the daemon `activating` on job 116):
// the path unit's work on a changed file, not a start on the record.
func TestRefusedRecordOfAnotherStartStartsNothing(t *testing.T) {
	const unit, refused = "autopilot-health.service", "autopilot-health-refused.service"
	const stale = "00000000000000000000000000000000"
	fixed := fixedAsItExits
	rec := "/var/lib/autopilot-health/refused-config.json"
	// The unit file says \\1, which systemd unescapes to the sed's \1.
	dropIn := fmt.Sprintf("[Service]\nExecStopPost=+/bin/sh -c 'if [ -e %[3]s ]; then sed -E -i \"s/(invocation.:.)[0-9a-f]+/\\\\1%[1]s/\" %[2]s && mv %[3]s /etc/autopilot-health/config.toml; fi'\n", stale, rec, fixed)
	s := daemonNamespace(t, "refusedstale", map[string]string{unit + ".d/50-stale-record.conf": dropIn},
		badConfigs[0], unit, "autopilot-health.path", refused)
	ctx := context.Background()
	// The second refusal's ExecStopPost= makes the record another start's
	// and renames the fixed file onto the refused one.
	refuseThenWriteAgain(t, s)
	eventually(t, 30*time.Second, "autopilot-health-refused.service refusing the record of another start", func() (bool, string) {
		j := s.Journal(refused)
		return strings.Contains(j, "another start of the daemon (invocation "+stale+"), not by its last start (invocation ") ||
			strings.Contains(j, ": changed since it was refused"), lastBytes(j, 1000)
	})
	if _, err := os.Stat(s.Root(fixed)); !os.IsNotExist(err) {
		t.Errorf("the fixed file was not renamed onto the refused one: %v", err)
	}
	if j := s.Journal(refused); strings.Contains(j, ": changed since it was refused") {
		t.Errorf("the record of another start was read as a change:\n%s", lastBytes(j, 2000))
	}
	if u, err := s.Bus.Unit(ctx, unit); err != nil || u.ActiveState != "failed" {
		t.Errorf("the daemon after a record of another start: %+v %v, want failed", u, err)
	}
	j := s.Journal(unit)
	if n := strings.Count(j, "refusing to start"); n != 2 {
		t.Errorf("%d refusals, want 2 (a systemctl start, the path unit's start on the file written again)", n)
	}
	if n := strings.Count(j, "msg=starting"); n != 0 {
		t.Errorf("the daemon started %d times on a record of another start", n)
	}
}

// TestRefusedUnitHasNoStartLimit: six refusals of the daemon within 10 s
// (an operator's or a tool's writes of a bad file, each started by the
// path unit or a systemctl start) run autopilot-health-refused.service six
// times. With systemd's default start limit (5 in 10 s) the sixth was
// refused ("Start request repeated too quickly"; in systemd 252 a unit
// whose last run was a skipped condition stays inactive, one whose last
// run started the daemon is left `failed (Result: start-limit-hit)` in
// `systemctl --failed`), and a fix written as the daemon exited then was
// seen by no one. After the burst, a file fixed as the refusing daemon
// exits still starts it.
func TestRefusedUnitHasNoStartLimit(t *testing.T) {
	const unit, refused = "autopilot-health.service", "autopilot-health-refused.service"
	s := fixedAsItExitsNamespace(t, "refusedlimit")
	ctx := context.Background()
	// systemd logs the limit on its console, not in the unit's journal.
	limited := func() bool {
		return strings.Contains(s.Console(1<<20), refused+": Start request repeated too quickly")
	}
	result := func() string {
		sp, _ := s.Properties(ctx, refused, "Service")
		r, _ := sp["Result"].Value().(string)
		return r
	}
	start := time.Now()
	for i := 1; i <= 6; i++ {
		if err := s.StartUnit(ctx, unit); err == nil {
			t.Fatalf("start %d: the start job of a refused configuration succeeded", i)
		}
		eventually(t, 30*time.Second, fmt.Sprintf("autopilot-health-refused.service's run %d (or its start limit)", i), func() (bool, string) {
			j := s.Journal(refused)
			n := strings.Count(j, "unchanged since it was refused")
			return n >= i || limited() || result() == "start-limit-hit", fmt.Sprintf("%d runs, result %s:\n%s", n, result(), lastBytes(j, 600))
		})
	}
	if d := time.Since(start); d >= 10*time.Second {
		t.Errorf("six refusals took %s, not within the default start limit's 10 s: no test of it", d)
	}
	u, err := s.Bus.Unit(ctx, refused)
	if err != nil {
		t.Fatal(err)
	}
	if j := s.Journal(refused); u.ActiveState == "failed" || result() == "start-limit-hit" || limited() {
		t.Errorf("after six refusals within 10 s %s is %s/%s, result %s; want not failed, no start limit:\n%s", refused, u.ActiveState, u.SubState, result(), lastBytes(j, 1000))
	}
	if n := strings.Count(s.Journal(refused), "unchanged since it was refused"); n != 6 {
		t.Errorf("%s ran its condition %d times for 6 refusals", refused, n)
	}
	// A seventh, the file written again and fixed as the refusing daemon
	// exits, is started.
	writeFixedConfig(t, s)
	writeAgain(t, s)
	waitUnitFor(t, s, unit, 2*time.Minute, "active on the file fixed as it exited after the burst", active)
	if j := s.Journal(refused); !strings.Contains(j, "/etc/autopilot-health/config.toml: changed since it was refused") {
		t.Errorf("%s did not find the change after the burst:\n%s", refused, lastBytes(j, 2000))
	}
}

// fixedAsItExits is where these tests write a good configuration for the
// unit's ExecStopPost= to rename onto the refused one.
const fixedAsItExits = "/etc/autopilot-health/fixed.toml"

// fixedAsItExitsNamespace starts a real systemd with the shipped units, a
// refused configuration, and a drop-in whose ExecStopPost= renames
// fixedAsItExits, if it exists, onto the configuration file (as an editor's
// save or dpkg does) after the refusing daemon exited and before systemd
// has taken its exit.
func fixedAsItExitsNamespace(t *testing.T, name string) *harness.Systemd {
	t.Helper()
	const unit = "autopilot-health.service"
	dropIn := fmt.Sprintf("[Service]\nExecStopPost=+/bin/sh -c 'if [ -e %[1]s ]; then mv %[1]s /etc/autopilot-health/config.toml; fi'\n", fixedAsItExits)
	return daemonNamespace(t, name, map[string]string{unit + ".d/50-fix-as-it-exits.conf": dropIn},
		badConfigs[0], unit, "autopilot-health.path", "autopilot-health-refused.service")
}

// refuseThenWriteAgain refuses the configuration once (systemctl start),
// then writes a good one at fixedAsItExits and writes the refused file
// again: the path unit starts the daemon, which refuses it, and its
// ExecStopPost= renames the good one onto it. Only a refusal the path unit
// started is one where it watches nothing as the daemon exits: a systemctl
// start starts the path unit with the daemon and before it (the daemon
// waits for the helper's socket), and that path unit sees the rename,
// a start of its own (merged into the failing start job, or, where PID 1
// reads the exit first on a loaded node, a new one that removes the
// record as autopilot-health-refused.service reads it).
func refuseThenWriteAgain(t *testing.T, s *harness.Systemd) {
	t.Helper()
	if err := s.StartUnit(context.Background(), "autopilot-health.service"); err == nil {
		t.Errorf("the start job of a refused configuration succeeded")
	}
	eventually(t, 30*time.Second, "autopilot-health-refused.service after the first refusal", func() (bool, string) {
		j := s.Journal("autopilot-health-refused.service")
		return strings.Contains(j, "unchanged since it was refused"), lastBytes(j, 1000)
	})
	writeFixedConfig(t, s)
	writeAgain(t, s)
}

// writeAgain writes the refused configuration file again, another bad one.
func writeAgain(t *testing.T, s *harness.Systemd) {
	t.Helper()
	if err := os.WriteFile(s.Root("/etc/autopilot-health/config.toml"), []byte(badConfigs[1]), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeFixedConfig writes a good configuration at fixedAsItExits.
func writeFixedConfig(t *testing.T, s *harness.Systemd) {
	t.Helper()
	if err := os.WriteFile(s.Root(fixedAsItExits), fmt.Appendf(nil, goodConfig, freeTCPPort(t)), 0o644); err != nil {
		t.Fatal(err)
	}
}
