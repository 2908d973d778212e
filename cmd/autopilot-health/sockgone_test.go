package main

import (
	"encoding/json"
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

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// holdStateLock takes the state directory's lock as a running daemon
// holds it (daemon.StateLockName, an exclusive flock) until the test ends:
// the kernel lists this process as its holder in /proc/locks.
func holdStateLock(t *testing.T, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, daemon.StateLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
}

func fakeUnitState(t *testing.T, state string) {
	saved := unitState
	t.Cleanup(func() { unitState = saved })
	unitState = func() (string, uint32) {
		switch state {
		case "", "inactive", "failed":
			return state, 0
		}
		return state, 4242
	}
}

// Nothing answers on the sockets, but a daemon holds the state directory
// (its files removed while it ran): status, reload and tamper clear say
// the daemon runs, with its pid, what the unit is doing (systemd over
// D-Bus, faked here) and what makes the socket again, never "not
// running". Before, all three said "the daemon is not running, or still
// starting". Without a holder, the words are as before.
func TestSocketGoneWhileTheDaemonRuns(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o750)
	control, status := filepath.Join(dir, "control.sock"), filepath.Join(dir, "status.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n[status]\nsocket = %q\n", state, control, status), 0o644)
	commands := []struct {
		args    []string
		control bool
	}{
		{[]string{"status", "--config", cfg}, false},
		{[]string{"status", "--config", cfg, "--socket", status}, false},
		{[]string{"reload", "--config", cfg}, true},
		{[]string{"tamper", "clear", "--config", cfg, "--reason", "x"}, true},
		{[]string{"tamper", "clear", "--config", cfg, "--socket", control, "--reason", "x"}, true},
	}
	fakeUnitState(t, "active")
	for _, c := range commands {
		code, _, errs := run(t, c.args...)
		if code != exitError || !strings.Contains(errs, "the daemon is not running") {
			t.Errorf("%q with no lock holder: exit %d, stderr %q; want 2, not running", c.args, code, errs)
		}
	}

	holdStateLock(t, state)
	holder := fmt.Sprintf("pid %d holds the lock of its state directory %s", os.Getpid(), state)
	for _, unit := range []string{"active", "activating", "deactivating", "", "inactive", "failed"} {
		fakeUnitState(t, unit)
		for _, c := range commands {
			sock, name, def := status, "status socket", config.Default().Status.Socket
			if c.control {
				sock, name, def = control, "control socket", config.Default().ControlSocket
			}
			if !slices.Contains(c.args, "--socket") && c.args[0] != "tamper" {
				// status and reload ask the default too.
				sock += " (nor the default " + def + ")"
			}
			var want string
			switch {
			case unit == "active", unit == "activating" && c.control:
				want = fmt.Sprintf("autopilot-health.service is %s and its daemon runs (%s), but its %s %s is gone: its file was removed while the daemon ran, and the daemon has not bound it again (it does once it sees the file go; journalctl -u autopilot-health says why not); `systemctl restart autopilot-health` makes it again", unit, holder, name, sock)
			case unit == "activating":
				want = fmt.Sprintf("autopilot-health.service is still starting (%s): its status socket %s is bound once its start is done", holder, sock)
			case unit == "deactivating" && c.control:
				want = fmt.Sprintf("autopilot-health.service is stopping (%s): its control socket %s is removed as the stop begins", holder, sock)
			case unit == "deactivating":
				want = fmt.Sprintf("autopilot-health.service is stopping (%s), and its status socket %s is gone: its file was removed while the daemon ran", holder, sock)
			case (unit == "inactive" || unit == "failed") && c.control:
				// Not the unit's daemon: one run by hand. Neither the
				// unit's journal nor its restart is about it.
				want = fmt.Sprintf("a daemon runs (%s), not autopilot-health.service's (the unit is %s: one run by hand?), but nothing answers on its control socket %s: it is stopping (the socket goes as the stop begins), or its file was removed while it ran, and it has not bound it again (it does once it sees the file go; its own log says why not); stopping it (kill %d) and starting it again makes it again", holder, unit, sock, os.Getpid())
			case unit == "inactive" || unit == "failed":
				want = fmt.Sprintf("a daemon runs (%s), not autopilot-health.service's (the unit is %s: one run by hand?), but nothing answers on its status socket %s: it is still starting (the socket is bound once its start is done), or its file was removed while it ran, and it has not bound it again (it does once it sees the file go; its own log says why not); stopping it (kill %d) and starting it again makes it again", holder, unit, sock, os.Getpid())
			case c.control:
				want = fmt.Sprintf("a daemon runs (%s), but nothing answers on its control socket %s: it is stopping (the socket goes as the stop begins), or its file was removed while the daemon ran", holder, sock)
			default:
				want = fmt.Sprintf("a daemon runs (%s), but nothing answers on its status socket %s: it is still starting (the socket is bound once its start is done), or its file was removed while the daemon ran", holder, sock)
			}
			code, out, errs := run(t, c.args...)
			if code != exitError || out != "" || !strings.Contains(errs, want) || strings.Contains(errs, "not running") || strings.Count(errs, "\n") != 1 {
				t.Errorf("unit %q, %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", unit, c.args, code, out, errs, want)
			}
		}
	}

	// What is at the path, not a socket, is still named as such.
	os.WriteFile(status, nil, 0o644)
	os.WriteFile(control, nil, 0o644)
	for _, c := range commands {
		if code, _, errs := run(t, c.args...); code != exitError || !strings.Contains(errs, "is not a socket but a regular file") {
			t.Errorf("%q with a file at the socket's path: exit %d, stderr %q", c.args, code, errs)
		}
	}
}

// tamper clear takes --socket as reload does: the socket given is asked,
// the configuration file not read (it may not load, or name another
// socket); an empty one is bad usage; what is at the path instead of a
// socket is named; --help shows it.
func TestTamperClearSocketFlag(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("control_socket = 7\n"), 0o644)
	named := filepath.Join(dir, "named.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n", dir, named), 0o644)
	sock := filepath.Join(dir, "given.sock")
	conds := []report.Condition{{Type: "NodeTampered", Status: report.StatusFalse, Reason: "NoChanges", Message: "no change"}}
	reqs := fakeControl(t, sock, daemon.ControlAnswer{Conditions: conds})
	for _, args := range [][]string{
		{"tamper", "clear", "--socket", sock, "--reason", "reviewed"},
		{"tamper", "clear", "--config", bad, "--socket", sock, "--reason", "reviewed"},
		{"tamper", "clear", "--config", cfg, "--socket=" + sock, "--reason", "reviewed"},
	} {
		code, out, errs := run(t, args...)
		if code != exitOK || out != "NodeTampered\tFalse\tNoChanges\tno change\ncleared\n" || errs != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
		select {
		case r := <-reqs:
			if r.Op != daemon.OpTamperClear || r.Reason != "reviewed" {
				t.Errorf("%q: request %+v", args, r)
			}
		default:
			t.Errorf("%q: no request on the socket given", args)
		}
	}
	none := filepath.Join(dir, "none.sock")
	file := filepath.Join(dir, "file.sock")
	os.WriteFile(file, nil, 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tamper", "clear", "--socket", "", "--reason", "x"}, "autopilot-health tamper clear: --socket is empty: give it a value, or leave the flag out for its default\n"},
		{[]string{"tamper", "clear", "--socket", none, "--reason", "x"}, "autopilot-health tamper clear: the daemon is not running, or still starting or stopping (no control socket at " + none + ";"},
		{[]string{"tamper", "clear", "--config", bad, "--socket", none, "--reason", "x"}, "(no control socket at " + none + ";"},
		{[]string{"tamper", "clear", "--socket", file, "--reason", "x"}, "autopilot-health tamper clear: the daemon is not running: " + file + " is not a socket but a regular file"},
		{[]string{"tamper", "clear", "--socket", sock}, "--reason is required"},
	} {
		code, out, errs := run(t, tc.args...)
		if code != exitError || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
	select {
	case r := <-reqs:
		t.Errorf("a request was sent on bad usage: %+v", r)
	default:
	}
	code, out, _ := run(t, "tamper", "clear", "--help")
	if code != exitOK || !strings.Contains(out, "Usage: autopilot-health tamper clear --reason TEXT [--config FILE] [--socket PATH]") ||
		!strings.Contains(out, "-socket string\n    \tthe daemon's control socket (default: control_socket of the configuration)") {
		t.Errorf("tamper clear --help: exit %d\n%s", code, out)
	}
	code, out, _ = run(t, "tamper", "--help")
	if code != exitOK || !strings.Contains(out, "tamper clear --reason TEXT [--config FILE] [--socket PATH]") {
		t.Errorf("tamper --help: exit %d\n%s", code, out)
	}
}

// TestSockGoneHelperProcess runs `status --config` as TestSocketGoneAsAnotherUser's
// other user, the unit's state faked as AUTOPILOT_HEALTH_SOCKGONE_UNIT says.
func TestSockGoneHelperProcess(t *testing.T) {
	cfg := os.Getenv("AUTOPILOT_HEALTH_SOCKGONE_CONFIG")
	if cfg == "" {
		t.Skip("run by TestSocketGoneAsAnotherUser")
	}
	fakeUnitState(t, os.Getenv("AUTOPILOT_HEALTH_SOCKGONE_UNIT"))
	code, out, errs := run(t, "status", "--config", cfg)
	fmt.Printf("exit %d: %s%s", code, out, errs)
	os.Exit(0)
}

// A user other than root, nothing answering on the status socket (its
// directory gone), while a daemon holds the state directory: the state
// directory is root's (0750), so who holds its lock cannot be told, and
// the unit's main process (systemd over D-Bus, which tells any user;
// faked here, real in tests/: TestSocketGoneAsAnotherUserUnderSystemd) is
// said as root is told the lock's holder, exit 2; with the unit inactive,
// failed or not known, "not running". Before, that user was told "not
// running" while the unit ran.
func TestSocketGoneAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root to run a process as another user")
	}
	setpriv, dir, bin := binaryForAnotherUser(t, "sockgone-user-")
	needNoDefaultSocketDir(t)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o750); err != nil {
		t.Fatal(err)
	}
	holdStateLock(t, state)
	status := filepath.Join(dir, "run", "status.sock") // its directory gone
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n[status]\nsocket = %q\n", state, filepath.Join(dir, "run", "control.sock"), status), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := status + " (nor the default " + config.Default().Status.Socket + ")"
	holder := "pid 4242 is its main process, as systemd says; the lock of its state directory " + state + " is root's to read"
	removed := "its file was removed while the daemon ran, and the daemon has not bound it again (it does once it sees the file go; journalctl -u autopilot-health says why not); `systemctl restart autopilot-health` makes it again"
	for _, tc := range []struct{ unit, want string }{
		{"active", "autopilot-health.service is active and its daemon runs (" + holder + "), but its status socket " + sock + " is gone: " + removed},
		{"reloading", "autopilot-health.service is reloading and its daemon runs (" + holder + "), but its status socket " + sock + " is gone: " + removed},
		{"activating", "autopilot-health.service is still starting (" + holder + "): its status socket " + sock + " is bound once its start is done"},
		{"deactivating", "autopilot-health.service is stopping (" + holder + "), and its status socket " + sock + " is gone"},
		{"inactive", "the daemon is not running, or still starting: nothing answers on " + config.Default().Status.Socket},
		{"failed", "the daemon is not running, or still starting"},
		{"", "the daemon is not running, or still starting"},
	} {
		cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestSockGoneHelperProcess$")
		cmd.Env = append(os.Environ(), "AUTOPILOT_HEALTH_SOCKGONE_CONFIG="+cfg, "AUTOPILOT_HEALTH_SOCKGONE_UNIT="+tc.unit)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		want := "exit 2: autopilot-health status: " + tc.want
		if !strings.HasPrefix(string(out), want) || strings.Count(string(out), "\n") != 1 || (tc.unit != "inactive" && tc.unit != "failed" && tc.unit != "" && strings.Contains(string(out), "not running")) {
			t.Errorf("as nobody, the unit %q:\n%s\nwant\n%s", tc.unit, out, want)
		}
	}
}

// A file at the control socket's path while a daemon holds the state
// directory's lock came after that daemon's start (a start refuses it):
// one renamed onto the socket's name (`mv x.sock control.sock`), which the
// daemon logs and leaves, its reload and tamper clear "not possible until
// it is (kill -HUP still reloads)". reload and tamper clear say that the
// daemon runs, with its pid, and what to do, never "not running"; reload
// names kill -HUP. Before, both said "the daemon is not running: ... is not
// a socket but a regular file, which a daemon whose control_socket names it
// leaves as it is, and does not start" of a daemon that ran. Without a
// holder, the words are as before.
func TestControlSocketPathTakenWhileTheDaemonRuns(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o750)
	control := filepath.Join(dir, "control.sock")
	os.WriteFile(control, nil, 0o644)
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n", state, control), 0o644)
	commands := [][]string{
		{"reload", "--config", cfg},
		{"tamper", "clear", "--config", cfg, "--reason", "x"},
		{"tamper", "clear", "--config", cfg, "--socket", control, "--reason", "x"},
	}
	for _, args := range commands {
		code, _, errs := run(t, args...)
		if code != exitError || !strings.Contains(errs, "the daemon is not running: "+control+" is not a socket but a regular file") {
			t.Errorf("%q with no lock holder: exit %d, stderr %q; want 2, not running and the file named", args, code, errs)
		}
	}
	holdStateLock(t, state)
	want := fmt.Sprintf("a daemon runs (pid %d holds the lock of its state directory %s), but its control socket %s is not a socket but a regular file, put there while the daemon ran (a start refuses it): the daemon leaves it as it is and binds its socket again once it is removed: move it away", os.Getpid(), state, control)
	for _, args := range commands {
		code, out, errs := run(t, args...)
		hup := strings.Contains(errs, fmt.Sprintf("kill -HUP %d reloads meanwhile", os.Getpid()))
		if code != exitError || out != "" || !strings.Contains(errs, want) || strings.Contains(errs, "not running") ||
			hup != (args[0] == "reload") || strings.Count(errs, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q (kill -HUP for reload)", args, code, out, errs, want)
		}
	}
}

// A socket given with --socket that nothing answers on, while a daemon
// answers on the one the configuration names (a typo, an old path): status,
// reload and tamper clear name the socket that answers, exit 2, also where
// that daemon holds the state directory's lock. Before, that was "a daemon
// runs (pid N holds the lock ...), but nothing answers on its status socket
// <the path given>: ... its file was removed while the daemon ran ...;
// `systemctl restart autopilot-health` makes it again": a restart advised
// for a typo (found against a standalone daemon, opsaudit).
func TestSocketGivenThatNothingAnswersOnNamesTheOneThatDoes(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o750)
	control, status := filepath.Join(dir, "control.sock"), filepath.Join(dir, "status.sock")
	for _, s := range []string{control, status} {
		ln, err := net.Listen("unix", s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n[status]\nsocket = %q\n", state, control, status), 0o644)
	wrong := filepath.Join(dir, "typo.sock")
	fakeUnitState(t, "active")
	for _, locked := range []bool{false, true} {
		if locked {
			holdStateLock(t, state)
		}
		for _, tc := range []struct {
			args  []string
			other string
		}{
			{[]string{"status", "--config", cfg, "--socket", wrong}, status},
			{[]string{"reload", "--config", cfg, "--socket", wrong}, control},
			{[]string{"tamper", "clear", "--config", cfg, "--socket", wrong, "--reason", "x"}, control},
		} {
			name := tc.args[0]
			if tc.args[0] == "tamper" {
				name = "tamper clear"
			}
			want := "autopilot-health " + name + ": nothing answers on " + wrong + ", the socket --socket gives, but a daemon answers on " + tc.other + ": leave --socket out, or give that one\n"
			code, out, errs := run(t, tc.args...)
			if code != exitError || out != "" || errs != want {
				t.Errorf("lock held %v, %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", locked, tc.args, code, out, errs, want)
			}
		}
	}
}

// A daemon started with other sockets than the configuration names now
// (the socket keys need a restart to change; edited since, and nothing
// answers on the new paths nor the default ones) is told by the sockets
// the lock's holder listens on (the kernel's list): status, reload and
// tamper clear name the socket of their kind it serves, the key and
// --socket, exit 2; each kind is told by its answer (HTTP, or the control
// socket's line of JSON). Before, they said its socket (the file's new
// path) was gone, removed while it ran, and that a restart made it again
// (found against a standalone daemon, opsaudit).
func TestDaemonStartedWithOtherSocketsIsNamed(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o750)
	served := filepath.Join(dir, "served")
	os.Mkdir(served, 0o700)
	servedStatus, servedControl := filepath.Join(served, "status.sock"), filepath.Join(served, "control.sock")
	now := time.Now()
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Started: now, Now: now, Ready: true})
	serveStatusBody(t, servedStatus, body)
	serveControlLines(t, servedControl, "{\"error\":\"bad request: invalid character 'G' looking for beginning of value\"}\n")
	control, status := filepath.Join(dir, "control.sock"), filepath.Join(dir, "status.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n[status]\nsocket = %q\n", state, control, status), 0o644)
	holdStateLock(t, state)
	holder := fmt.Sprintf("pid %d holds the lock of its state directory %s", os.Getpid(), state)
	fakeUnitState(t, "active")
	for _, tc := range []struct {
		args          []string
		name, at, key string
		not           string
	}{
		{[]string{"status", "--config", cfg}, "status socket", servedStatus, "status.socket", status + " (nor the default " + config.Default().Status.Socket + ")"},
		{[]string{"reload", "--config", cfg}, "control socket", servedControl, "control_socket", control + " (nor the default " + config.Default().ControlSocket + ")"},
		{[]string{"tamper", "clear", "--config", cfg, "--reason", "x"}, "control socket", servedControl, "control_socket", control},
	} {
		cmd := tc.args[0]
		if cmd == "tamper" {
			cmd = "tamper clear"
		}
		want := fmt.Sprintf("autopilot-health %s: a daemon runs (%s) and serves its %s at %s, not at %s: it was started with another %s, which needs a restart to change (systemctl restart autopilot-health); --socket %s asks it meanwhile\n", cmd, holder, tc.name, tc.at, tc.not, tc.key, tc.at)
		code, out, errs := run(t, tc.args...)
		if code != exitError || out != "" || errs != want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errs, want)
		}
	}
}
