package main

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
)

// TestStatusHelperProcess is `autopilot-health status` run by
// TestStatusAsAnotherUser in a process of its own.
func TestStatusHelperProcess(t *testing.T) {
	sock := os.Getenv("AUTOPILOT_HEALTH_STATUS_HELPER_SOCKET")
	if sock == "" {
		t.Skip("run by TestStatusAsAnotherUser")
	}
	// The command: status, or reload (TestReloadAsAnotherUser).
	name := cmp.Or(os.Getenv("AUTOPILOT_HEALTH_STATUS_HELPER_COMMAND"), "status")
	args := []string{name, "--socket", sock}
	if cfg := os.Getenv("AUTOPILOT_HEALTH_STATUS_HELPER_CONFIG"); cfg != "" {
		args = []string{name, "--config", cfg}
	}
	code, out, errs := run(t, args...)
	fmt.Printf("exit %d: %s%s", code, out, errs)
	os.Exit(0)
}

// reload as a user other than root: the control socket is root's, and a
// configuration file root's alone (0600) does not tell the socket it
// names, where nothing answers on the default one, as status says it
// (TestStatusAsAnotherUser). Before, reload said "the daemon is not
// running" then, while it ran on the file's socket.
func TestReloadAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to run a process as another user")
	}
	setpriv, dir, bin := binaryForAnotherUser(t, "reload-user-")
	needNoDefaultSocketDir(t)
	sock := filepath.Join(dir, "control.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chmod(sock, 0o600)
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "control_socket = %q\n", sock), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ socket, config, want string }{
		{sock, "", "exit 2: autopilot-health reload: " + sock + ": permission denied: the control socket is root's (run with sudo)"},
		{"-", cfg, "exit 2: autopilot-health reload: " + cfg + ": permission denied: the control socket it names is not known (run with sudo); nothing answers on " + config.Default().ControlSocket},
	} {
		cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestStatusHelperProcess$")
		cmd.Env = append(os.Environ(), "AUTOPILOT_HEALTH_STATUS_HELPER_COMMAND=reload", "AUTOPILOT_HEALTH_STATUS_HELPER_SOCKET="+tc.socket, "AUTOPILOT_HEALTH_STATUS_HELPER_CONFIG="+tc.config)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if !strings.HasPrefix(string(out), tc.want) || strings.Contains(string(out), "not running") {
			t.Errorf("as nobody, --socket %s, --config %q:\n%s\nwant %s", tc.socket, tc.config, out, tc.want)
		}
	}
}

// A socket file left by a daemon that is gone: not running, exit 2.
func TestStatusStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run(t, "status", "--socket", sock); code != exitError || !strings.Contains(errs, "the daemon is not running, or still starting: nothing answers on "+sock) {
		t.Errorf("stale socket: exit %d, %q", code, errs)
	}
}

// A user other than root, asking the daemon's socket (mode 0600 in a
// 0750 directory, as the unit makes them): told to use sudo, exit 2; not
// told that the daemon is not running.
func TestStatusAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to run a process as another user")
	}
	setpriv, dir, bin := binaryForAnotherUser(t, "status-user-")
	needNoDefaultSocketDir(t)
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o750); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(run, "status.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chmod(sock, 0o600)
	for _, s := range []string{sock, filepath.Join(dir, "status.sock")} {
		if s != sock {
			// The socket itself 0600 in a directory anyone reads.
			l2, err := net.Listen("unix", s)
			if err != nil {
				t.Fatal(err)
			}
			defer l2.Close()
			os.Chmod(s, 0o600)
		}
		cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestStatusHelperProcess$")
		cmd.Env = append(os.Environ(), "AUTOPILOT_HEALTH_STATUS_HELPER_SOCKET="+s)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if want := "exit 2: autopilot-health status: " + s + ": permission denied: the status socket is root's (run with sudo)"; !strings.HasPrefix(string(out), want) {
			t.Errorf("as nobody, %s:\n%s\nwant %s", s, out, want)
		}
	}
	// The configuration file naming the socket, root's alone (0600): the
	// user cannot learn the socket; nothing answers on the default one.
	// Before, that was "the daemon is not running, or still starting" while
	// it ran on the file's socket.
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "[status]\nsocket = %q\n", filepath.Join(dir, "status.sock")), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestStatusHelperProcess$")
	cmd.Env = append(os.Environ(), "AUTOPILOT_HEALTH_STATUS_HELPER_SOCKET=-", "AUTOPILOT_HEALTH_STATUS_HELPER_CONFIG="+cfg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if want := "exit 2: autopilot-health status: " + cfg + ": permission denied: the status socket it names is not known (run with sudo)"; !strings.HasPrefix(string(out), want) || strings.Contains(string(out), "not running") {
		t.Errorf("as nobody, --config %s (0600):\n%s\nwant %s", cfg, out, want)
	}
}

// A daemon whose status socket accepts but never answers (hung): status
// says the daemon is there and does not answer, and what to look at, exit
// 2; it is not "not running", nor an HTTP client's error text.
func TestStatusOfAHungDaemon(t *testing.T) {
	defer func(d time.Duration) { statusTimeout = d }(statusTimeout)
	statusTimeout = 200 * time.Millisecond
	sock := filepath.Join(t.TempDir(), "status.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	want := "autopilot-health status: the daemon on " + sock + " accepts but does not answer within 200ms: it may be hung (systemctl status autopilot-health; journalctl -u autopilot-health)\n"
	for _, args := range [][]string{{"status", "--socket", sock}, {"status", "--json", "--socket", sock}} {
		code, out, errs := run(t, args...)
		if code != exitError || out != "" || errs != want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", args, code, out, errs, want)
		}
	}
}

// TestCLIHelperProcess runs the command line in
// AUTOPILOT_HEALTH_CLI_HELPER_ARGS (one argument a line) in a process of
// its own, for tests that run it as another user.
func TestCLIHelperProcess(t *testing.T) {
	args := os.Getenv("AUTOPILOT_HEALTH_CLI_HELPER_ARGS")
	if args == "" {
		t.Skip("run by the tests that run a command as another user")
	}
	code, _, errs := run(t, strings.Split(args, "\n")...)
	fmt.Printf("exit %d: %s", code, errs)
	os.Exit(0)
}

// asNobody runs the command line as uid 65534 (the test binary copied to
// dir, which that user can read) and returns "exit N: <stderr>".
func asNobody(t *testing.T, dir string, args ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to run a process as another user")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Skip(t, "no setpriv (util-linux)")
	}
	bin := filepath.Join(dir, "test.bin")
	if _, err := os.Stat(bin); err != nil {
		b, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestCLIHelperProcess$")
	cmd.Env = append(os.Environ(), "AUTOPILOT_HEALTH_CLI_HELPER_ARGS="+strings.Join(args, "\n"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return string(out)
}

// tamper status and tamper layers run by a user other than root, on a node
// laid out as the unit makes it (state_dir 0750, tamper.json 0600, the
// device-mapper control node root's): told to use sudo, exit 2, as status,
// reload and tamper clear tell them.
func TestTamperCommandsAsAnotherUser(t *testing.T) {
	dir, err := os.MkdirTemp("", "tamper-user-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "tamper.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\n[status]\nsocket = %q\n[checks.SealedOSTampered]\ndm_control = %q\n",
		state, filepath.Join(dir, "status.sock"), control)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tamper", "status", "--config", cfg},
			"exit 2: autopilot-health tamper status: open " + filepath.Join(state, "tamper.json") + ": permission denied: the daemon's state_dir is root's (run with sudo)\n"},
		{[]string{"tamper", "layers", "--config", cfg},
			"exit 2: autopilot-health tamper layers: open " + control + ": permission denied: reading the kernel's verity tables needs root (run with sudo)\n"},
	} {
		if got := asNobody(t, dir, tc.args...); got != tc.want {
			t.Errorf("as nobody, %q:\n%s\nwant\n%s", tc.args, got, tc.want)
		}
	}
}

// TestStatusOfASocketPathThatIsNotASocket: a file, a directory or a
// symlink at the status socket's path is left there by the daemon, which
// runs on without serving its status ("status" in README); status then
// names what is there, never "the daemon is not running", which would be
// false. Exit 2, as the command could not run.
func TestStatusOfASocketPathThatIsNotASocket(t *testing.T) {
	dir := t.TempDir()
	file, sub, link := filepath.Join(dir, "file.sock"), filepath.Join(dir, "dir.sock"), filepath.Join(dir, "link.sock")
	os.WriteFile(file, nil, 0o600)
	os.Mkdir(sub, 0o700)
	os.Symlink(filepath.Join(dir, "gone"), link)
	// A symlink that loops (connect: ELOOP) or runs through a file
	// (ENOTDIR): the daemon leaves these too and runs on without a status
	// socket (TestSocketPathThatIsNotASocketIsKept); before, status said
	// "asking the daemon on ...: connect: too many levels of symbolic
	// links", naming nothing.
	loop, through := filepath.Join(dir, "loop.sock"), filepath.Join(dir, "through.sock")
	os.Symlink(loop, loop)
	os.Symlink(filepath.Join(file, "x.sock"), through)
	for path, what := range map[string]string{file: "a regular file", sub: "a directory", link: "a symlink", loop: "a symlink", through: "a symlink"} {
		code, out, errs := run(t, "status", "--socket", path)
		want := "autopilot-health status: " + path + " is not a socket but " + what + ": the daemon serves no status there"
		if code != exitError || out != "" || !strings.HasPrefix(errs, want) || strings.Contains(errs, "not running") {
			t.Errorf("status --socket %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", path, code, out, errs, want)
		}
	}
	// Nothing there: not running, as before.
	gone := filepath.Join(dir, "gone.sock")
	if code, _, errs := run(t, "status", "--socket", gone); code != exitError || !strings.Contains(errs, "the daemon is not running, or still starting: nothing answers on "+gone) {
		t.Errorf("status --socket %s: exit %d, stderr %q", gone, code, errs)
	}
	// A path under a file, no symlink at it: nothing is there to name; the
	// connect's own error, not "not running" either.
	under := filepath.Join(file, "x.sock")
	if code, out, errs := run(t, "status", "--socket", under); code != exitError || out != "" || !strings.Contains(errs, "not a directory") || strings.Contains(errs, "not running") {
		t.Errorf("status --socket %s: exit %d, stdout %q, stderr %q", under, code, out, errs)
	}
}

// binaryForAnotherUser is setpriv's path and a directory anyone may enter
// (removed at the test's end) holding a copy of the test binary, bin,
// which another user (setpriv --reuid) can run; skipped where setpriv is
// missing (testenv.Skip). The caller checks it runs as root.
func binaryForAnotherUser(t *testing.T, prefix string) (setpriv, dir, bin string) {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Skip(t, "no setpriv (util-linux)")
	}
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "test.bin")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return setpriv, dir, bin
}

// needNoDefaultSocketDir fails the test at once, saying why, where the
// machine has the default sockets' directory of its own: the CLI asks the
// default socket too, and another user refused by a root-only directory
// there is rightly told to use sudo, not what the test means to show
// (seen when a daemon run by hand with the default configuration left it).
func needNoDefaultSocketDir(t *testing.T) {
	t.Helper()
	d := filepath.Dir(config.Default().Status.Socket)
	if _, err := os.Stat(d); err == nil {
		t.Fatalf("%s exists on this machine (a daemon of its own, or one run by hand with the default configuration, made it): this test's user would be refused by it; remove it (rmdir) and run the test again", d)
	}
}
