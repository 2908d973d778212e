package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runChildEnv marks the re-executed test binary that runs the daemon.
const runChildEnv = "AUTOPILOT_HEALTH_TEST_RUN_CHILD"

// A stop (SIGTERM) while the state directory cannot be written (here its
// parent is a file, as a read-only /var refuses it) exits 0: the failed
// save is logged with the directory and the cause, and the unit is not left
// failed on every stop and restart. The daemon runs as its own process (the
// test binary, re-executed), so the signal and the exit status are real.
//
// The metrics port does not matter here: the same holds with the port of
// metrics.listen_address held by another program (as one can take the free
// port freeMetricsAddress found before the daemon binds it). Before, the
// test waited for "serving metrics", which a daemon that cannot bind the
// port does not log (it starts without the listener, retrying with
// backoff): it failed after 30 s.
func TestStopWithUnwritableStateDirExitsZero(t *testing.T) {
	if cfg := os.Getenv(runChildEnv); cfg != "" {
		os.Exit(Main([]string{"run", "--config", cfg}, os.Stdout, os.Stderr))
	}
	t.Run("metrics served", func(t *testing.T) {
		// A port another program took after freeMetricsAddress found it
		// free is the other subtest's case: tried again on another port.
		var all string
		for try := 1; try <= 3; try++ {
			all = stopWithUnwritableStateDir(t, freeMetricsAddress(t))
			if !strings.Contains(all, "cannot bind metrics.listen_address") {
				break
			}
			t.Logf("try %d: the free port was taken before the daemon bound it; another port", try)
		}
		if !strings.Contains(all, `msg="serving metrics"`) {
			t.Errorf("the metrics are not served on a free port (3 tries):\n%s", all)
		}
	})
	t.Run("metrics port held by another program", func(t *testing.T) {
		held, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		all := stopWithUnwritableStateDir(t, held.Addr().String())
		if !strings.Contains(all, "cannot bind metrics.listen_address") {
			t.Errorf("the held port was bound:\n%s", all)
		}
	})
}

// stopWithUnwritableStateDir runs the daemon with its metrics on addr and
// an unwritable state directory, stops it by SIGTERM once it runs, checks
// the exit and the log, and returns its stderr.
func stopWithUnwritableStateDir(t *testing.T, addr string) string {
	t.Helper()
	dir := t.TempDir()
	blocker := filepath.Join(dir, "var")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(blocker, "lib", "autopilot-health")
	cfg := fakeHost(t, fmt.Sprintf("node_name = \"n\"\nrole = \"worker\"\ngpu = \"false\"\ncontrol_socket = %q\n"+
		"[metrics]\nlisten_address = %q\n[status]\nsocket = \"\"\n[kubernetes]\nkubeconfig = \"\"\n"+
		"[kmsg]\nenabled = false\n[runner]\nfirst_run_spread = \"0s\"\n", filepath.Join(dir, "control.sock"), addr))
	// fakeHost's state_dir, replaced by the unwritable one.
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(b), filepath.Join(filepath.Dir(cfg), "state"), stateDir, 1)), 0o644)

	cmd := exec.Command(os.Args[0], "-test.run=^TestStopWithUnwritableStateDirExitsZero$")
	cmd.Env = append(os.Environ(), runChildEnv+"="+cfg)
	// Either line is logged by the daemon's Run, after run catches
	// SIGTERM: "serving metrics" where the port is bound, "starting
	// without the metrics listener" where it is not (another program
	// holds it).
	all, err := signalAfter(t, cmd, syscall.SIGTERM, `msg="serving metrics"`, `msg="starting without the metrics listener"`)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if code := cmd.ProcessState.ExitCode(); code != exitOK {
		t.Errorf("exit status %d after SIGTERM, want %d:\n%s", code, exitOK, all)
	}
	if !strings.Contains(all, "saving state on shutdown failed") || !strings.Contains(all, "dir="+stateDir) || !strings.Contains(all, "not a directory") {
		t.Errorf("the failed save is not logged with its directory and cause:\n%s", all)
	}
	if strings.Contains(all, "stopped with an error") || !strings.Contains(all, "msg=stopped") {
		t.Errorf("the stop is not logged as a clean stop:\n%s", all)
	}
	return all
}

// refusedThenChanged runs `run` on a file holding first, calling change
// between each refusal and the exit (a write to the file there, while the
// unit is still activating, starts nothing: autopilot-health.path's start
// of a unit that runs is a no-op). It returns the exit status, stderr and
// how many times change ran.
func refusedThenChanged(t *testing.T, first string, change func(p string, n int)) (int, string, int) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	n := 0
	old := afterRefusal
	afterRefusal = func() { n++; change(p, n) }
	defer func() { afterRefusal = old }()
	code, out, errs := run(t, "run", "--config", p)
	if out != "" {
		t.Errorf("stdout %q", out)
	}
	return code, errs, n
}

// A file changed between its read and the refused start's exit is read
// again: the path unit, whose start of the still-activating unit was a
// no-op, starts nothing more once it is failed, and the change was lost
// (a fix written then left the node without its daemon).
func TestRunRereadsAFileChangedWhileRefusing(t *testing.T) {
	good := heldSocketConfig(t, t.TempDir())
	// Fixed meanwhile: the good file is started (here as far as the
	// control socket another daemon holds, exit 1).
	code, errs, n := refusedThenChanged(t, "role = \"master\"\n", func(p string, n int) {
		if n == 1 {
			os.WriteFile(p, []byte(good), 0o644)
		}
	})
	if code != exitProblem || n != 1 || !strings.Contains(errs, `key role: must be one of`) ||
		!strings.Contains(errs, "the configuration file changed while it was refused; reading it again") ||
		!strings.Contains(errs, "another daemon is listening") {
		t.Errorf("fixed while refused: exit %d, %d refusals, stderr %q; want the fixed file started (exit 1: the control socket is taken)", code, n, errs)
	}
	// Changed to another refused file: refused again, for what it holds
	// now, exit 2.
	code, errs, n = refusedThenChanged(t, "role = \"master\"\n", func(p string, n int) {
		if n == 1 {
			os.WriteFile(p, []byte("gpu = \"maybe\"\n"), 0o644)
		}
	})
	if code != exitError || n != 2 || !strings.Contains(errs, "key role: must be one of") || !strings.Contains(errs, "key gpu:") {
		t.Errorf("changed to another bad file: exit %d, %d refusals, stderr %q; want 2, both refused", code, n, errs)
	}
	// Unchanged: one refusal, exit 2, nothing more said.
	code, errs, n = refusedThenChanged(t, "role = \"master\"\n", func(string, int) {})
	if code != exitError || n != 1 || strings.Count(errs, "\n") != 1 {
		t.Errorf("unchanged: exit %d, %d refusals, stderr %q; want 2, one refusal", code, n, errs)
	}
	// Changed at every read: read a bounded number of times, then exit 1,
	// which the unit restarts (5 s later) rather than lose the last change.
	code, errs, n = refusedThenChanged(t, "role = \"master\"\n", func(p string, n int) {
		os.WriteFile(p, fmt.Appendf(nil, "role = \"master%d\"\n", n), 0o644)
	})
	if code != exitProblem || n != refusalRereads+1 || !strings.Contains(errs, "kept changing") {
		t.Errorf("changed at every read: exit %d, %d refusals, stderr %q; want 1 after %d refusals", code, n, errs, refusalRereads+1)
	}
}

// signalAfter starts cmd (a daemon in a process of its own), waits up to
// 30 s for a line of its stderr that contains one of markers, sends it
// sig, and returns all it wrote to stderr and its Wait's error.
func signalAfter(t *testing.T, cmd *exec.Cmd, sig syscall.Signal, markers ...string) (string, error) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var log []string
	timeout := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("the daemon ended before %q:\n%s", markers, strings.Join(log, "\n"))
			}
			log = append(log, l)
			seen = slices.ContainsFunc(markers, func(m string) bool { return strings.Contains(l, m) })
		case <-timeout:
			cmd.Process.Kill()
			t.Fatalf("none of %q in 30 s:\n%s", markers, strings.Join(log, "\n"))
		}
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		log = append(log, l)
	}
	err = cmd.Wait()
	return strings.Join(log, "\n"), err
}
