package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
)

const stateWaitChildEnv = "AUTOPILOT_HEALTH_TEST_STATE_WAIT_CHILD"

// `run` under systemd ($INVOCATION_ID) whose state directory another
// daemon holds (a copy of the unit under another name, the unit started
// while a daemon run by hand holds it) does not exit at once, which the
// unit restarts every 5 s for ever: it tries again in the process, and
// starts as soon as the directory is free; still held at the end of its
// waits, it exits 1. The refusal is logged once, not at every try. Run by
// hand (no $INVOCATION_ID) it exits 1 at once, its one line naming the
// holder. The daemon is the test binary re-executed, its waits short.
func TestRunUnderSystemdWaitsForTheStateDir(t *testing.T) {
	if cfg := os.Getenv(stateWaitChildEnv); cfg != "" {
		stateDirWaits = make([]time.Duration, 40)
		for i := range stateDirWaits {
			stateDirWaits[i] = 50 * time.Millisecond
		}
		os.Exit(Main([]string{"run", "--config", cfg}, os.Stdout, os.Stderr))
	}
	dir := t.TempDir()
	cfg := fakeHost(t, fmt.Sprintf("node_name = \"n\"\nrole = \"worker\"\ngpu = \"false\"\ncontrol_socket = %q\n"+
		"[metrics]\nlisten_address = %q\n[status]\nsocket = \"\"\n[kubernetes]\nkubeconfig = \"\"\n"+
		"[kmsg]\nenabled = false\n[runner]\nfirst_run_spread = \"0s\"\n", filepath.Join(dir, "control.sock"), freeMetricsAddress(t)))
	state := filepath.Join(filepath.Dir(cfg), "state")
	// The other daemon: its lock, its PID.
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(filepath.Join(state, daemon.StateLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	held.WriteString(fmt.Sprintf("%d\n", os.Getpid()))
	refusal := fmt.Sprintf("another autopilot-health daemon (pid %d) uses this state directory", os.Getpid())
	child := func(invocation string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRunUnderSystemdWaitsForTheStateDir$")
		cmd.Env = append(os.Environ(), stateWaitChildEnv+"="+cfg, "INVOCATION_ID="+invocation)
		return cmd
	}

	t.Run("by hand", func(t *testing.T) {
		cmd := child("")
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != exitProblem || strings.Count(string(out), refusal) != 1 || strings.Contains(string(out), "trying again") {
			t.Errorf("exit %d, output:\n%s\nwant exit 1 at once, one line saying %q", code, out, refusal)
		}
	})
	t.Run("held throughout", func(t *testing.T) {
		// systemd's notification socket: STATUS= says why the unit is
		// activating, which systemctl status shows.
		sock := filepath.Join(t.TempDir(), "notify")
		ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cmd := child("0123456789abcdef0123456789abcdef")
		cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+sock)
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != exitProblem || strings.Count(string(out), "trying again") != 1 || !strings.Contains(string(out), `msg="could not start"`) {
			t.Errorf("exit %d, output:\n%s\nwant one line trying again, then exit 1", code, out)
		}
		ln.SetReadDeadline(time.Now().Add(time.Second)) // the child is gone: what it sent is queued (a past deadline reads nothing)
		buf := make([]byte, 8192)
		n, err := ln.Read(buf)
		want := "STATUS=waiting for the state directory (exit 1 at "
		if first := string(buf[:n]); err != nil || !strings.HasPrefix(first, want) || !strings.Contains(first, refusal) {
			t.Errorf("first notification %q (%v), want %q... naming %q", first, err, want, refusal)
		}
	})
	t.Run("stopped while it waits", func(t *testing.T) {
		// systemctl stop: a clean stop (exit 0), not a failed unit.
		all, err := signalAfter(t, child("0123456789abcdef0123456789abcdef"), syscall.SIGTERM, "trying again")
		if err != nil || !strings.Contains(all, "stopped before it started") {
			t.Errorf("SIGTERM while it waits: %v:\n%s\nwant exit 0, stopped before it started", err, all)
		}
	})
	t.Run("freed while it waits", func(t *testing.T) {
		cmd := child("0123456789abcdef0123456789abcdef")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		var log []string
		await := func(marker string) {
			t.Helper()
			timeout := time.After(30 * time.Second)
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("the daemon ended before %q:\n%s", marker, strings.Join(log, "\n"))
					}
					log = append(log, l)
					if strings.Contains(l, marker) {
						return
					}
				case <-timeout:
					t.Fatalf("no %q in 30 s:\n%s", marker, strings.Join(log, "\n"))
				}
			}
		}
		await("trying again")
		held.Close() // the other daemon ends: the kernel releases its lock
		await("the state directory is free now; starting")
		await(`msg="serving metrics"`)
		cmd.Process.Signal(syscall.SIGTERM)
		for l := range lines {
			log = append(log, l)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("after SIGTERM: %v:\n%s", err, strings.Join(log, "\n"))
		}
	})
}
