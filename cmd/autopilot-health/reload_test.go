package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"

	"github.com/syself/autopilot-health/internal/testenv"
)

// fakeControl answers each connection on sock with answer and records the
// requests.
func fakeControl(t *testing.T, sock string, answer daemon.ControlAnswer) <-chan daemon.ControlRequest {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	reqs := make(chan daemon.ControlRequest, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req daemon.ControlRequest
			json.NewDecoder(c).Decode(&req)
			reqs <- req
			json.NewEncoder(c).Encode(answer)
			c.Close()
		}
	}()
	return reqs
}

// reload's exit codes are what systemctl reload reports: 0 applied (what
// changed on stdout), 1 refused by the daemon (its reason on stderr, for
// the journal), 2 the daemon could not be asked.
func TestReloadCommand(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := run(t, "reload", "--socket", filepath.Join(dir, "none.sock"))
	if code != exitError || !strings.Contains(stderr, "the daemon is not running, or still starting or stopping (no control socket at "+filepath.Join(dir, "none.sock")) {
		t.Errorf("without a daemon: %d %q", code, stderr)
	}

	ok := filepath.Join(dir, "ok.sock")
	reqs := fakeControl(t, ok, daemon.ControlAnswer{Reloaded: "1 key checks.DiskUsageHigh.space_percent changed; checks changed: DiskUsageHigh"})
	code, stdout, stderr := run(t, "reload", "--socket", ok)
	if code != exitOK || stdout != "reloaded: 1 key checks.DiskUsageHigh.space_percent changed; checks changed: DiskUsageHigh\n" || stderr != "" {
		t.Errorf("applied: %d %q %q", code, stdout, stderr)
	}
	if r := <-reqs; r.Op != daemon.OpReload {
		t.Errorf("request %+v", r)
	}

	bad := filepath.Join(dir, "bad.sock")
	why := "/etc/autopilot-health/config.toml:12: key checks.DiskUsageHigh.space_percnt: unknown key"
	fakeControl(t, bad, daemon.ControlAnswer{Error: why, Refused: true})
	code, stdout, stderr = run(t, "reload", "--socket", bad)
	if code != exitProblem || stdout != "" || stderr != "autopilot-health reload: refused: "+why+"\n" {
		t.Errorf("refused: %d %q %q", code, stdout, stderr)
	}
	// A request the daemon does not allow (not root, an older daemon) is
	// not a refused file: exit 2.
	old := filepath.Join(dir, "old.sock")
	fakeControl(t, old, daemon.ControlAnswer{Error: `unknown operation "reload"`})
	if code, _, stderr := run(t, "reload", "--socket", old); code != exitError || stderr != "autopilot-health reload: unknown operation \"reload\"\n" {
		t.Errorf("an older daemon: %d %q", code, stderr)
	}
}

// Without --socket, reload asks the control socket the file names, even
// when the daemon would refuse the file (its refusal is the answer the
// operator needs), then the default one: the file may name another socket
// than the running daemon's (control_socket needs a restart to change). A
// file that is not TOML at all gives the default.
func TestReloadFindsTheControlSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "control.sock")
	def := config.Default().ControlSocket
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	control := func(c *config.Config) string { return c.ControlSocket }
	good := write("good.toml", "control_socket = \""+sock+"\"\n")
	refused := write("refused.toml", "control_socket = \""+sock+"\"\n[checks.DiskUsageHigh]\nspace_percnt = 3\nspace_percent = \"x\"\n")
	garbage := write("garbage.toml", "control_socket = \n[[[")
	plain := write("plain.toml", "[checks.DiskUsageHigh]\nspace_percent = 50\n")
	// A syntax error and a duplicate key: the key's line is read.
	syntax := write("syntax.toml", "control_socket = \""+sock+"\"  # ours\n[status]\nsocket = \"/x/s.sock\"\nx = [\n")
	dup := write("dup.toml", "[checks.DiskUsageHigh]\ncontrol_socket = \"/not/top/level.sock\"\n[status]\ncontrol_socket = \"/x/y.sock\"\n")
	for path, want := range map[string][]string{good: {sock, def}, refused: {sock, def}, garbage: {def}, plain: {def}, syntax: {sock, def}, dup: {def}} {
		if got := socketCandidates(path, true, control); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", filepath.Base(path), got, want)
		}
	}
	fakeControl(t, sock, daemon.ControlAnswer{Error: "refused.toml:3: key checks.DiskUsageHigh.space_percnt: unknown key", Refused: true})
	if code, _, stderr := run(t, "reload", "--config", refused); code != exitProblem || !strings.Contains(stderr, "refused: refused.toml:3") {
		t.Errorf("reload --config refused.toml: %d %q", code, stderr)
	}
	// A file that names a socket nothing listens on: the default is
	// asked too, and the error names both.
	other := write("other.toml", "control_socket = \""+filepath.Join(dir, "other.sock")+"\"\n")
	code, _, stderr := run(t, "reload", "--config", other)
	if answers(def) {
		testenv.Skip(t, fmt.Sprintf("a daemon listens on %s on this host", def))
	}
	if code != exitError || !strings.Contains(stderr, "no control socket at "+def) || !strings.Contains(stderr, "nor on "+filepath.Join(dir, "other.sock")+", which "+other+" names") {
		t.Errorf("reload --config other.toml: %d %q", code, stderr)
	}
}

// status asks the daemon even when the configuration file does not load
// (after a refused reload) or names another status socket than the
// running daemon's, and says why when nothing answers on either.
func TestStatusFindsTheSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "status.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte("[status]\nsocket = \""+sock+"\"\n[checks.DiskUsageHigh]\nspace_percnt = 3\n"), 0o644)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "n1", PID: 42, Now: time.Now(), Summary: "0 conditions: 0 ok, 0 problems"})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) })}
	go srv.Serve(ln)
	defer srv.Close()
	if code, out, errs := run(t, "status", "--config", cfg); code != exitOK || !strings.Contains(out, "autopilot-health v1 on node n1") {
		t.Errorf("status with a file the daemon would refuse: %d %q %q", code, out, errs)
	}
	other := filepath.Join(dir, "other.toml")
	os.WriteFile(other, []byte("[status]\nsocket = \""+filepath.Join(dir, "new.sock")+"\"\n"), 0o644)
	if answers(config.Default().Status.Socket) {
		testenv.Skip(t, "a daemon serves the default status socket on this host")
	}
	if code, _, errs := run(t, "status", "--config", other); code != exitError || !strings.Contains(errs, "nor on "+filepath.Join(dir, "new.sock")+", which "+other+" names (status.socket needs a restart to change)") {
		t.Errorf("status with a socket nothing serves: %d %q", code, errs)
	}
}

// answers reports whether something accepts connections on the Unix socket
// at p: a socket file left by a daemon that is gone (SIGKILL) answers
// nothing, and the commands say so as when there is no file.
func answers(p string) bool {
	c, err := net.Dial("unix", p)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// status and reload read the file for its socket keys as the configuration
// is read (README: a FIFO is never opened to wait for a writer): a FIFO
// given as --config is refused at once, and the default socket asked,
// instead of waiting for a writer that never comes.
func TestSocketCandidatesDoNotWaitOnAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "config.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []string, 1)
	go func() { got <- socketCandidates(fifo, true, func(c *config.Config) string { return c.ControlSocket }) }()
	select {
	case g := <-got:
		if want := []string{config.Default().ControlSocket}; !slices.Equal(g, want) {
			t.Errorf("%q, want %q", g, want)
		}
	case <-time.After(10 * time.Second):
		// Let the stuck open return, so the test ends.
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("socketCandidates waits for a writer of the FIFO")
	}
}

// A file of odd shape (10,000 nested inline tables: the decoder's cost is
// the square of the depth, 12 GB and most of a minute) is refused by
// config.CheckBounds before decoding; the socket keys are then read from
// their own lines, not by decoding the file anyway: `reload` and `status`
// answer at once.
func TestSocketCandidatesOfAnOddFileAreCheap(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	body := "control_socket = \"" + sock + "\"\nx = " + strings.Repeat("{a=", 10000) + "1" + strings.Repeat("}", 10000) + "\n"
	path := filepath.Join(dir, "odd.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got := socketCandidates(path, true, func(c *config.Config) string { return c.ControlSocket })
	runtime.ReadMemStats(&after)
	if want := []string{sock, config.Default().ControlSocket}; !slices.Equal(got, want) {
		t.Errorf("socketCandidates: %q, want %q", got, want)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 8<<20 {
		t.Errorf("socketCandidates of a 40 KB file of 10,000 nested inline tables allocated %d MiB, want it read by lines after config.CheckBounds refused it", n>>20)
	}
}

// A file, a directory or a symlink (one that loops too) at the socket the
// configuration names is named by reload, as by tamper clear and status:
// a daemon whose control_socket names it leaves it there and does not
// start, so nothing answers on the default socket either, and "not
// running, or still starting" would send the operator to wait. Fails
// before: reload went on to the default socket and said only its
// "no control socket at", and "nor on <path>".
func TestReloadNamesWhatIsThereInsteadOfTheNamedSocket(t *testing.T) {
	def := config.Default().ControlSocket
	if answers(def) {
		testenv.Skip(t, fmt.Sprintf("a daemon listens on %s on this host", def))
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	for p, what := range map[string]string{file: "a regular file", sub: "a directory", loop: "a symlink"} {
		cfg := filepath.Join(dir, filepath.Base(p)+".toml")
		if err := os.WriteFile(cfg, []byte("control_socket = \""+p+"\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := run(t, "reload", "--config", cfg)
		if want := p + " is not a socket but " + what; code != exitError || !strings.Contains(stderr, want) {
			t.Errorf("reload --config %s: %d %q, want exit 2 naming %q", filepath.Base(cfg), code, stderr, want)
		}
	}
}

// A file at the default control socket is named by reload only with what
// the configuration's own socket is: the daemon started on that file binds
// its control_socket (a stale socket there is removed; nothing there is
// no hindrance), so a file at the default socket keeps only a daemon
// started before control_socket changed from starting, and the socket the
// file names is not running, not "not a socket". Both not sockets: the
// configuration's is named, which keeps its daemon from starting. tamper
// clear asks only the configured socket and says that. The default socket
// is the real path (/run/autopilot-health/control.sock): the test binary
// re-executes itself under unshare(1) and uses a tmpfs over /run of its
// own mount namespace, never the host's. Fails before: reload named the
// default's file alone, as if it kept the configuration's daemon from
// starting, and said nothing of the configured socket.
func TestReloadNamesTheDefaultsFileWithTheConfiguredSocket(t *testing.T) {
	if !testenv.InMountNamespace(t, "mounting a tmpfs over /run") {
		return
	}
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs over /run: %v", err)
	}
	def := config.Default().ControlSocket
	if err := os.MkdirAll(filepath.Dir(def), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(def, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	named := filepath.Join(dir, "control.sock")
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("control_socket = \""+named+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defFile := def + " is not a socket but a regular file"
	nor := "; nor on " + named + ", which " + cfg + " names (control_socket needs a restart to change: systemctl restart autopilot-health)\n"
	notRunning := "the daemon is not running, or still starting or stopping (no control socket at " + named
	for _, c := range []struct {
		name string
		make func()
	}{
		{"nothing at the configured socket", func() {}},
		{"a stale socket at the configured socket", func() {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: named, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			ln.Close()
		}},
	} {
		os.Remove(named)
		c.make()
		if code, out, errs := run(t, "reload", "--config", cfg); code != exitError || out != "" || !strings.Contains(errs, defFile) || !strings.HasSuffix(errs, nor) {
			t.Errorf("reload, %s, a file at the default: exit %d %q %q, want exit 2 naming %q and ending %q", c.name, code, out, errs, defFile, nor)
		}
		if code, out, errs := run(t, "tamper", "clear", "--reason", "r", "--config", cfg); code != exitError || out != "" || !strings.Contains(errs, notRunning) {
			t.Errorf("tamper clear, %s, a file at the default: exit %d %q %q, want exit 2 %q", c.name, code, out, errs, notRunning)
		}
	}
	// Both not sockets: the configured one is named, alone.
	os.Remove(named)
	if err := os.Mkdir(named, 0o755); err != nil {
		t.Fatal(err)
	}
	want := "the daemon is not running: " + named + " is not a socket but a directory"
	for _, args := range [][]string{{"reload", "--config", cfg}, {"tamper", "clear", "--reason", "r", "--config", cfg}} {
		if code, out, errs := run(t, args...); code != exitError || out != "" || !strings.Contains(errs, want) || strings.Contains(errs, def) {
			t.Errorf("%s, a directory at the configured socket and a file at the default: exit %d %q %q, want exit 2 naming %q alone", args[0], code, out, errs, want)
		}
	}
}

// A file an editor saved as "Unicode" (UTF-16 with its byte order mark, as
// Windows Notepad does) or in UTF-32, which the daemon refuses (a refused
// reload: it runs on with the socket it had), is still read for its socket
// keys, as a file with a mistake elsewhere is: before, none was found in
// it, and status and reload asked the default socket alone, saying that
// nothing answers there ("not running") while the daemon served the
// file's socket.
func TestSocketCandidatesOfAFileInUTF16(t *testing.T) {
	dir := t.TempDir()
	sock, ssock := filepath.Join(dir, "control.sock"), filepath.Join(dir, "status.sock")
	text := "# saved by an editor\r\ncontrol_socket = \"" + sock + "\"\r\n[status]\r\nsocket = \"" + ssock + "\"\r\n"
	u16 := utf16.Encode([]rune(text))
	le, be := []byte{0xff, 0xfe}, []byte{0xfe, 0xff}
	for _, u := range u16 {
		le = append(le, byte(u), byte(u>>8))
		be = append(be, byte(u>>8), byte(u))
	}
	le32 := []byte{0xff, 0xfe, 0, 0}
	be32 := []byte{0, 0, 0xfe, 0xff}
	for _, r := range text {
		le32 = append(le32, byte(r), byte(r>>8), byte(r>>16), byte(r>>24))
		be32 = append(be32, byte(r>>24), byte(r>>16), byte(r>>8), byte(r))
	}
	for name, b := range map[string][]byte{"UTF-16LE": le, "UTF-16BE": be, "UTF-32LE": le32, "UTF-32BE": be32,
		"UTF-16's mark before UTF-8": append([]byte{0xff, 0xfe}, text...)} {
		p := filepath.Join(dir, "config.toml")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := loadConfig(p, true); err == nil {
			t.Fatalf("%s: the file loads; want it refused", name)
		}
		if got, want := socketCandidates(p, true, func(c *config.Config) string { return c.ControlSocket }), []string{sock, config.Default().ControlSocket}; !slices.Equal(got, want) {
			t.Errorf("%s: control sockets %q, want %q", name, got, want)
		}
		if got, want := socketCandidates(p, true, func(c *config.Config) string { return c.Status.Socket }), []string{ssock, config.Default().Status.Socket}; !slices.Equal(got, want) {
			t.Errorf("%s: status sockets %q, want %q", name, got, want)
		}
	}
}

// reload given the status socket (which answers HTTP) for the control
// socket: the answer is named as not the daemon's control answer, with its
// first bytes, exit 2 (the daemon could not be asked). Before, it was
// `reading the daemon's answer: invalid character 'H' looking for beginning
// of value`, found against the shipped unit in a real systemd 252.
func TestReloadOfAnAnswerThatIsNotAControlAnswer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	code, stdout, stderr := run(t, "reload", "--socket", sock)
	want := "autopilot-health reload: the answer on " + sock + " is not the daemon's control answer (is it the daemon's control socket, control_socket?): invalid character 'H' looking for beginning of value: HTTP/1.1 400 Bad Request"
	if code != exitError || stdout != "" || !strings.HasPrefix(stderr, want) {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, stdout, stderr, want)
	}
}
