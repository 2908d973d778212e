//go:build integration

package tests

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// TestRuntimeFatalBeforeMainIsRestarted: a fatal error of the Go runtime
// before main runs (here: no thread for the runtime's monitor, the start of
// a daemon restarted while the node is out of processes; a limit of one
// process stands in for it) ends the process as every other crash does, by
// SIGABRT, and the shipped unit restarts it. debug.SetTraceback("crash")
// (run's crashBySignal) takes effect only once main runs; before it the
// runtime exits 2, the status of a refused configuration file, which the
// unit does not restart (RestartPreventExitStatus=2): the node stayed
// without its health daemon after the shortage was over, `failed` with
// status=2/INVALIDARGUMENT, until someone started it or the configuration
// file changed. GOTRACEBACK=crash in the unit's environment is read by the
// runtime before it starts a thread.
func TestRuntimeFatalBeforeMainIsRestarted(t *testing.T) {
	const unit = "autopilot-health.service"
	// "+": setpriv needs the privileges the unit's sandbox drops; the
	// unit's Environment= applies all the same. A user of its own, so that
	// RLIMIT_NPROC (which spares root) counts.
	dropIn := "[Service]\nExecStart=\nExecStart=+/usr/bin/prlimit --nproc=1:1 /usr/bin/setpriv --reuid=4242 --regid=4242 --clear-groups /usr/bin/autopilot-health run --privileged-helper=/run/autopilot-health-privileged/helper.sock\n"
	s := daemonNamespace(t, "prefatal", map[string]string{unit + ".d/50-no-threads.conf": dropIn},
		fmt.Sprintf(goodConfig, freeTCPPort(t)), unit, "autopilot-health-refused.service")
	ctx := context.Background()
	if err := s.StartUnit(ctx, unit); err == nil {
		t.Errorf("the start job of a daemon that cannot start a thread succeeded")
	}
	awaitRestartedAfterFatal(t, s, unit, "the daemon")
}

// TestHelperRuntimeFatalBeforeMainIsRestarted: the privileged helper's
// runtime failing before main (no thread for it, a limit of one process
// standing in for a node out of processes) ends it by SIGABRT, and its unit
// restarts it as every crash. Before, it exited 2, the status of a refused
// command line, which the helper's unit does not restart
// (RestartPreventExitStatus=2): it stayed failed with
// status=2/INVALIDARGUMENT after the shortage, the request that started it
// left unanswered on its socket.
func TestHelperRuntimeFatalBeforeMainIsRestarted(t *testing.T) {
	const (
		svc  = "autopilot-health-privileged.service"
		sock = "autopilot-health-privileged.socket"
	)
	dropIn := "[Service]\nExecStart=\nExecStart=+/usr/bin/prlimit --nproc=1:1 /usr/bin/setpriv --reuid=4242 --regid=4242 --clear-groups /usr/lib/autopilot-health/autopilot-health-privileged\n"
	s := daemonNamespace(t, "helperprefatal", map[string]string{svc + ".d/50-no-threads.conf": dropIn}, "", svc, sock)
	ctx := context.Background()
	if err := s.StartUnit(ctx, sock); err != nil {
		t.Fatal(err)
	}
	// A request of the daemon starts the helper.
	conn, err := net.Dial("unix", s.Root("/run/autopilot-health-privileged/helper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	awaitRestartedAfterFatal(t, s, svc, "the helper")
}

// awaitRestartedAfterFatal waits for the Go runtime's fatal error before
// main ("fatal error: newosproc") in unit's journal, then for systemd to
// have restarted unit after it ended by SIGABRT; who names the unit in the
// failures.
func awaitRestartedAfterFatal(t *testing.T, s *harness.Systemd, unit, who string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 30*time.Second, who+"'s runtime's fatal error before main in the journal", func() (bool, string) {
		j := s.Journal(unit)
		return strings.Contains(j, "fatal error: newosproc"), lastBytes(j, 600)
	})
	eventually(t, 30*time.Second, who+" restarted after its runtime's fatal error", func() (bool, string) {
		u, err := s.Bus.Unit(ctx, unit)
		if err != nil {
			return false, err.Error()
		}
		code, status := mainExit(ctx, s, unit)
		// CLD_KILLED 2, CLD_DUMPED 3; SIGABRT 6.
		return u.NRestarts >= 1 && code != 1 && status == 6,
			fmt.Sprintf("%s/%s result %s NRestarts=%d, last exit code %d status %d; want restarted, killed by SIGABRT (6)", u.ActiveState, u.SubState, u.Result, u.NRestarts, code, status)
	})
}

// mainExit is how unit's main process last ended, as systemd has it:
// ExecMainCode (CLD_EXITED 1, CLD_KILLED 2, CLD_DUMPED 3) and
// ExecMainStatus (the exit status or the signal); zero when unread.
func mainExit(ctx context.Context, s *harness.Systemd, unit string) (code, status int32) {
	sp, _ := s.Properties(ctx, unit, "Service")
	if sp != nil {
		code, _ = sp["ExecMainCode"].Value().(int32)
		status, _ = sp["ExecMainStatus"].Value().(int32)
	}
	return code, status
}
