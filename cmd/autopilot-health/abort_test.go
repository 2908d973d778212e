package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// abortChildEnv marks the re-executed test binary that runs the daemon to
// be aborted.
const abortChildEnv = "AUTOPILOT_HEALTH_TEST_ABORT_CHILD"

// panicChildEnv marks the re-executed test binary that panics as run's
// process would.
const panicChildEnv = "AUTOPILOT_HEALTH_TEST_PANIC_CHILD"

// systemd's watchdog stops a stuck daemon with SIGABRT (WatchdogSignal=),
// and the unit restarts every exit but status 2, a refused configuration
// file (RestartPreventExitStatus=2). The Go runtime ends a process on
// SIGABRT, and on a fatal error (a panic no one recovers), with a goroutine
// dump and by default exit status 2: the unit was left failed, not
// restarted, until its configuration file changed. `run` ends such a
// process by the signal instead (SIGABRT, the dump kept), which systemd
// restarts. The daemon runs as its own process (the test binary,
// re-executed), so the signal and the way it ends are real.
func TestRunAbortedEndsBySignalNotExitTwo(t *testing.T) {
	if cfg := os.Getenv(abortChildEnv); cfg != "" {
		// No core file of the test binary where it runs.
		unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
		os.Exit(Main([]string{"run", "--config", cfg}, os.Stdout, os.Stderr))
	}
	dir := t.TempDir()
	cfg := fakeHost(t, fmt.Sprintf("node_name = \"n\"\nrole = \"worker\"\ngpu = \"false\"\ncontrol_socket = %q\n"+
		"[metrics]\nlisten_address = %q\n[status]\nsocket = \"\"\n[kubernetes]\nkubeconfig = \"\"\n"+
		"[kmsg]\nenabled = false\n[runner]\nfirst_run_spread = \"0s\"\n", filepath.Join(dir, "control.sock"), freeMetricsAddress(t)))
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunAbortedEndsBySignalNotExitTwo$")
	cmd.Env = append(os.Environ(), abortChildEnv+"="+cfg)
	all, err := signalAfter(t, cmd, syscall.SIGABRT, "first pass complete")
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the aborted daemon ended with %v, want an abort:\n%s", err, lastLines(all, 20))
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
		t.Errorf("the aborted daemon ended with %v (exit status %d), want killed by SIGABRT: exit 2 is a refused configuration, which the unit does not restart:\n%s",
			err, ws.ExitStatus(), lastLines(all, 20))
	}
	if !strings.Contains(all, "SIGABRT: abort") || !strings.Contains(all, "goroutine ") {
		t.Errorf("no goroutine dump of the abort on stderr:\n%s", lastLines(all, 20))
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// A panic no one recovers (outside the checks' runs, which recover theirs)
// in run's process ends it by SIGABRT too, not by exit 2.
func TestRunPanicEndsBySignalNotExitTwo(t *testing.T) {
	if os.Getenv(panicChildEnv) != "" {
		unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
		crashBySignal() // as cmdRun does first
		done := make(chan struct{})
		go func() { panic("a bug in a goroutine of the daemon") }()
		<-done
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunPanicEndsBySignalNotExitTwo$")
	cmd.Env = append(os.Environ(), panicChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the panicking process ended with %v, want an abort:\n%s", err, lastLines(string(out), 20))
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
		t.Errorf("the panicking process ended with %v (exit status %d), want killed by SIGABRT:\n%s", err, ws.ExitStatus(), lastLines(string(out), 20))
	}
	if !strings.Contains(string(out), "panic: a bug in a goroutine of the daemon") {
		t.Errorf("the panic is not on stderr:\n%s", lastLines(string(out), 20))
	}
}
