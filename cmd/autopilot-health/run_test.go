package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
func TestStopWithUnwritableStateDirExitsZero(t *testing.T) {
	if cfg := os.Getenv(runChildEnv); cfg != "" {
		os.Exit(Main([]string{"run", "--config", cfg}, os.Stdout, os.Stderr))
	}
	dir := t.TempDir()
	blocker := filepath.Join(dir, "var")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(blocker, "lib", "autopilot-health")
	cfg := fakeHost(t, fmt.Sprintf("node_name = \"n\"\nrole = \"worker\"\ngpu = \"false\"\ncontrol_socket = %q\n"+
		"[metrics]\nlisten_address = \"127.0.0.1:0\"\n[status]\nsocket = \"\"\n[kubernetes]\nkubeconfig = \"\"\n"+
		"[kmsg]\nenabled = false\n[runner]\nfirst_run_spread = \"0s\"\n", filepath.Join(dir, "control.sock")))
	// fakeHost's state_dir, replaced by the unwritable one.
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(b), filepath.Join(filepath.Dir(cfg), "state"), stateDir, 1)), 0o644)

	cmd := exec.Command(os.Args[0], "-test.run=^TestStopWithUnwritableStateDirExitsZero$")
	cmd.Env = append(os.Environ(), runChildEnv+"="+cfg)
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
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var log []string
	timeout := time.After(30 * time.Second)
	// "serving metrics" is logged after the daemon catches SIGTERM.
	for serving := false; !serving; {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("the daemon ended before serving:\n%s", strings.Join(log, "\n"))
			}
			log = append(log, l)
			serving = strings.Contains(l, "serving metrics")
		case <-timeout:
			cmd.Process.Kill()
			t.Fatalf("no 'serving metrics' in 30 s:\n%s", strings.Join(log, "\n"))
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		log = append(log, l)
	}
	err = cmd.Wait()
	all := strings.Join(log, "\n")
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
}
