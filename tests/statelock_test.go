//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/systemd"
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
	// Below the ephemeral range, given once (harness.FreeLoopbackPort): a
	// port 0 gave, closed for the daemon to bind, may be an outgoing
	// connection's by then, at a restart's bind too.
	port2 := freeTCPPort(t)
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

// The shipped unit in a real systemd 252 whose state directory another
// daemon holds (here the test, its PID 4242 in the lock file, as a daemon
// run by hand would; the test is outside the namespace's PID namespace, so
// /proc/locks lists it as pid 0 and the refusal says the PID is the
// file's): the start is not failed and restarted every
// RestartSec= (5 s); it waits in the process, the refusal in the journal
// once, and is active as soon as the other lets the directory go, with no
// restart (NRestarts=0).
func TestUnitWaitsForTheStateDirOfADaemonRunByHand(t *testing.T) {
	s := daemonNamespace(t, "statelock", nil, fmt.Sprintf(goodConfig, freeTCPPort(t)), "autopilot-health.service")
	const unit = "autopilot-health.service"
	state := s.Root("/var/lib/autopilot-health")
	if err := os.MkdirAll(state, 0o750); err != nil {
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
	held.WriteString("4242\n")

	started := make(chan error, 1)
	go func() { started <- s.StartUnit(context.Background(), unit) }()
	const refusal = "another autopilot-health daemon (pid 4242 as its lock file says, maybe stale: /proc/locks names no holder this process can see) uses this state directory"
	eventually(t, 30*time.Second, "the refusal in the journal", func() (bool, string) {
		j := s.Journal(unit)
		return strings.Contains(j, refusal), lastBytes(j, 500)
	})
	u := waitUnitFor(t, s, unit, 5*time.Second, "activating, waiting", func(u systemd.Unit) bool { return u.ActiveState == "activating" })
	if u.NRestarts != 0 {
		t.Errorf("NRestarts=%d while it waits, want 0", u.NRestarts)
	}
	// systemctl status shows why it is activating.
	eventually(t, 10*time.Second, "STATUS= saying the wait", func() (bool, string) {
		p, err := s.Properties(context.Background(), unit, "Service")
		if err != nil {
			return false, err.Error()
		}
		st, _ := p["StatusText"].Value().(string)
		return strings.HasPrefix(st, "waiting for the state directory (exit 1 at ") && strings.Contains(st, refusal), st
	})

	held.Close() // the other daemon stops: the kernel releases its lock
	if err := <-started; err != nil {
		t.Fatalf("the start job: %v", err)
	}
	u = waitUnitFor(t, s, unit, 2*time.Minute, "active once the directory is free", active)
	// The line is logged before READY=1, but reaches the journal through
	// journald's stream, which READY=1 (the notify socket, to PID 1) does
	// not wait for: awaited, not read at once.
	var j string
	eventually(t, 10*time.Second, "the start's line in the journal", func() (bool, string) {
		j = s.Journal(unit)
		return strings.Contains(j, "the state directory is free now; starting"), lastBytes(j, 500)
	})
	if u.NRestarts != 0 || strings.Count(j, refusal) != 1 || !strings.Contains(j, "the state directory is free now; starting") {
		t.Errorf("NRestarts=%d, %d refusals in the journal; want 0 and 1, then the start:\n%s", u.NRestarts, strings.Count(j, refusal), lastBytes(j, 3000))
	}
}

// The shipped unit, its sandbox whole (ProtectProc=invisible, PrivateUsers=,
// ProtectSystem=strict, the @system-service filter), refused by a holder
// that runs on the same node (a service of its own, flock(1) on the lock
// file) while the file still holds a PID left by a daemon that is gone
// (4242): the refusal names the holder's PID as the unit's /proc/locks
// lists it, not the stale one (the unit sets no ProcSubset=pid, which
// would hide /proc/locks). Once the holder stops, the daemon starts and
// writes its own PID in the lock file: StateDirectory= makes it writable
// under ProtectSystem=strict.
func TestUnitRefusalNamesTheHolderUnderTheSandbox(t *testing.T) {
	const unit, holder = "autopilot-health.service", "lockholder.service"
	s := daemonNamespace(t, "lockholder", map[string]string{
		holder: "[Service]\nExecStart=/usr/bin/flock --exclusive /var/lib/autopilot-health/daemon.lock /usr/bin/sleep infinity\n",
	}, fmt.Sprintf(goodConfig, freeTCPPort(t)), unit, holder)
	ctx := context.Background()
	state := s.Root("/var/lib/autopilot-health")
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(state, daemon.StateLockName)
	if err := os.WriteFile(lock, []byte("4242\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, holder); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the holder's flock", func() (bool, string) {
		f, err := os.Open(lock)
		if err != nil {
			return false, err.Error()
		}
		defer f.Close()
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		return err == syscall.EWOULDBLOCK, fmt.Sprint(err)
	})
	p, err := s.Properties(ctx, holder, "Service")
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := p["MainPID"].Value().(uint32)
	if pid == 0 || pid == 4242 {
		t.Fatalf("the holder's MainPID %d", pid)
	}

	started := make(chan error, 1)
	go func() { started <- s.StartUnit(ctx, unit) }()
	refusal := fmt.Sprintf("another autopilot-health daemon (pid %d) uses this state directory", pid)
	eventually(t, 30*time.Second, "the refusal naming the holder in the journal", func() (bool, string) {
		j := s.Journal(unit)
		return strings.Contains(j, refusal), lastBytes(j, 500)
	})
	// "(pid 4242)" or "(pid 4242 as its lock file says, ...": a bare
	// "(pid 4242" is also the start of the holder's own "(pid 42421)".
	if j := s.Journal(unit); regexp.MustCompile(`\(pid 4242[ )]`).MatchString(j) {
		t.Errorf("the refusal named the stale PID 4242:\n%s", lastBytes(j, 2000))
	}

	if err := s.StopUnit(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatalf("the start job: %v", err)
	}
	waitUnitFor(t, s, unit, 2*time.Minute, "active once the directory is free", active)
	p, err = s.Properties(ctx, unit, "Service")
	if err != nil {
		t.Fatal(err)
	}
	main, _ := p["MainPID"].Value().(uint32)
	if b, _ := os.ReadFile(lock); strings.TrimSpace(string(b)) != strconv.Itoa(int(main)) {
		t.Errorf("the lock file holds %q; want the unit's MainPID %d", b, main)
	}
	if j := s.Journal(unit); strings.Contains(j, "cannot be locked") || strings.Contains(j, "PID not written") {
		t.Errorf("the lock under the unit:\n%s", lastBytes(j, 2000))
	}
}
