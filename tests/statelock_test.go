//go:build integration

package tests

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
)

// Two `autopilot-health run` (the shipped binary) on one state_dir, each
// with a control socket, a status socket and a metrics port of its own (an
// operator's run by hand beside the unit's, a copy of the unit under
// another name): the second exits 1 with one line naming the state
// directory, its lock file and the first's PID, before it touches the
// first's files, and the first runs on, the only one writing there. The
// one-shot commands that read the state (check, status, tamper status)
// work beside it: they take no lock. Then the first is SIGKILLed, and the
// next start takes the directory at once: the kernel released the lock
// with the process. Before, both ran, each saving state.json and
// tamper.json over the other's.
func TestOneDaemonPerStateDir(t *testing.T) {
	n := newKernelNode(t)
	n.start()
	n.caughtUp()
	first := n.cmd.Process.Pid
	// A temp file of the first's write in flight: a start removes those as
	// a crash's.
	inFlight := filepath.Join(n.state, "state.json.tmp4242")
	if err := os.MkdirAll(n.state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inFlight, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}

	conf := mustRead(t, n.cfgPath)
	control2 := filepath.Join(t.TempDir(), "control.sock")
	status2 := filepath.Join(t.TempDir(), "status.sock")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port2 := l.Addr().(*net.TCPAddr).Port
	l.Close()
	for re, with := range map[string]string{
		`(?m)^control_socket = .*$`: fmt.Sprintf("control_socket = %q", control2),
		`(?m)^socket = .*$`:         fmt.Sprintf("socket = %q", status2),
		`(?m)^listen_address = .*$`: fmt.Sprintf("listen_address = \"127.0.0.1:%d\"", port2),
	} {
		if !regexp.MustCompile(re).MatchString(conf) {
			t.Fatalf("the node's configuration has no %s", re)
		}
		conf = regexp.MustCompile(re).ReplaceAllLiteralString(conf, with)
	}
	cfg2 := filepath.Join(t.TempDir(), "other.toml")
	if err := os.WriteFile(cfg2, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	code, out := runBinary(t, "run", "--config", cfg2)
	lock := filepath.Join(n.state, daemon.StateLockName)
	want := fmt.Sprintf("another autopilot-health daemon (pid %d) uses this state directory", first)
	if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, n.state) || !strings.Contains(out, lock) {
		t.Fatalf("the second daemon on the state_dir: exit %d, output:\n%s\nwant exit 1 and %q, naming %s and %s", code, out, want, n.state, lock)
	}
	var errLines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "level=ERROR") {
			errLines = append(errLines, line)
		}
	}
	if len(errLines) != 1 || !strings.Contains(errLines[0], want) {
		t.Errorf("the refusal's error lines: %q; want one, naming the holder", errLines)
	}
	if strings.Contains(out, "state restored") || strings.Contains(out, "node detected") {
		t.Errorf("the refused daemon went on to read the state or the node:\n%s", out)
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("the refused daemon removed the first's temp file: %v", err)
	}
	if _, err := os.Lstat(control2); err == nil {
		t.Errorf("the refused daemon left its control socket %s", control2)
	}
	if fi, err := os.Stat(lock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the lock file: %v, %v; want a file of mode 0600", fi, err)
	}
	if b, _ := os.ReadFile(lock); strings.TrimSpace(string(b)) != strconv.Itoa(first) {
		t.Errorf("the lock file holds %q; want the first's PID %d", b, first)
	}
	select {
	case <-n.exited:
		t.Fatalf("the first daemon exited:\n%s", n.logs)
	default:
	}
	n.caughtUp() // the first runs on, and reports

	// The one-shot commands: none takes, nor waits for, the lock.
	for _, args := range [][]string{
		{"check", "--config", n.cfgPath},
		{"status", "--config", n.cfgPath},
		{"tamper", "status", "--config", n.cfgPath},
	} {
		code, out := runBinary(t, args...)
		if code > 1 || strings.Contains(out, "uses this state directory") {
			t.Errorf("%s beside the running daemon: exit %d, output:\n%s", args, code, out)
		}
	}

	// SIGKILL: nothing of the shutdown runs, the lock goes with the
	// process, and the next start takes the directory at once.
	n.kill()
	n.start()
	n.caughtUp()
	if strings.Contains(n.logs.String(), "uses this state directory") {
		t.Errorf("a start after SIGKILL found the state directory locked:\n%s", n.logs)
	}
	if b, _ := os.ReadFile(lock); strings.TrimSpace(string(b)) != strconv.Itoa(n.cmd.Process.Pid) {
		t.Errorf("the lock file holds %q; want the new daemon's PID %d", b, n.cmd.Process.Pid)
	}
}

// runBinary runs the shipped binary with args (30 s at most) and returns
// its exit code and its output.
func runBinary(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, daemonBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s did not exit within 30 s:\n%s", args, out)
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}
