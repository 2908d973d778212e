package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	godbus "github.com/godbus/dbus/v5"

	"github.com/syself/autopilot-health/internal/systemd"
)

// Systemd is a real systemd running as PID 1 in fresh namespaces, with its
// own D-Bus system bus, reached from the test over that bus (the same code
// path as production).
type Systemd struct {
	Dir   string
	Units string // its /etc/systemd/system
	PID   int    // host PID of its PID 1
	Bus   *systemd.DBus
	cmd   *exec.Cmd
	cg    string
	done  chan struct{}
}

// Root returns a path inside the container's root, as the host sees it.
func (s *Systemd) Root(p string) string {
	return filepath.Join("/proc", strconv.Itoa(s.PID), "root", p)
}

// BusSocket is the container's system bus socket as the host sees it.
func (s *Systemd) BusSocket() string { return s.Root("/run/dbus/system_bus_socket") }

// baseUnits: dbus from the host's packages, without default dependencies,
// and a default target that starts it.
var baseUnits = map[string]string{
	"dbus.service.d/10-nodeps.conf": "[Unit]\nDefaultDependencies=no\n",
	"dbus.socket.d/10-nodeps.conf":  "[Unit]\nDefaultDependencies=no\n",
	"test.target":                   "[Unit]\nDescription=autopilot-health test target\nWants=dbus.socket dbus.service %s\n",
	"default.target":                "",
}

// SystemdAvailable says why a namespaced systemd cannot run here, or "".
func SystemdAvailable() string {
	for _, p := range []string{"/usr/lib/systemd/systemd", "/usr/bin/dbus-daemon", "/usr/bin/unshare", "/usr/bin/script", "/usr/bin/setpriv"} {
		if _, err := os.Stat(p); err != nil {
			return p + " missing (apt install systemd dbus util-linux bsdutils)"
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err != nil {
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.procs"); err != nil {
			return "no cgroup2 mount"
		}
	}
	if os.Geteuid() != 0 {
		return "not root"
	}
	return ""
}

func cgroup2Root() string {
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err == nil {
		return "/sys/fs/cgroup/unified"
	}
	return "/sys/fs/cgroup"
}

// Options change how a namespaced systemd is set up.
type Options struct {
	// KeepSyslog leaves CAP_SYSLOG in PID 1's bounding set (dropped by
	// default). A unit never regains a capability PID 1 lacks, so a unit
	// reading /dev/kmsg (dmesg_restrict=1) needs it.
	KeepSyslog bool
	// Data, a host directory, is bound read-write at /data, the first mount
	// after the (tmpfs) root.
	Data string
	// Usr, a directory, is laid over the host's /usr (a read-only overlay):
	// Usr/bin/x is /usr/bin/x inside.
	Usr string
	// SharedMounts makes every mount inside shared, as on a booted host:
	// a mount a unit makes in its own mount namespace (systemd-sysext's
	// merge) propagates to PID 1's.
	SharedMounts bool
	// LoopDevices makes /dev/loop-control and /dev/loop0..63 inside (the
	// namespace's /dev is a tmpfs), so a disk image can be attached.
	LoopDevices bool
	// UsrWritable, a directory, makes /usr writable (Usr is then ignored):
	// an overlay of the host's /usr whose writes land in UsrWritable/upper,
	// so dpkg can install a package inside.
	UsrWritable string
}

// StartSystemd starts a systemd with the given units (file name -> content)
// plus dbus, all wanted by its default target. It returns once systemd's
// SystemState is running or degraded.
func StartSystemd(dir string, units map[string]string) (*Systemd, error) {
	return StartSystemdWith(dir, units, Options{})
}

// cgroupName is the name of the cgroup a systemd started in dir runs in: its
// own for each dir, though many tests name theirs ".../ns". One name for two
// systemds running at once had each remove the other's unit cgroups
// (TestRefusedConfigurationDoesNotSpin's two cases failed in CI with
// "Failed at step CGROUP", status 219).
func cgroupName(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	sum := sha256.Sum256([]byte(dir))
	return "autopilot-health-test-" + filepath.Base(dir) + "-" + hex.EncodeToString(sum[:6])
}

// StartSystemdWith is StartSystemd with options.
func StartSystemdWith(dir string, units map[string]string, o Options) (*Systemd, error) {
	s := &Systemd{Dir: dir, Units: filepath.Join(dir, "units"), done: make(chan struct{})}
	s.cg = filepath.Join(cgroup2Root(), cgroupName(dir))
	var names []string
	for name := range units {
		if strings.HasSuffix(name, ".service") {
			names = append(names, name)
		}
	}
	for name, content := range baseUnits {
		if name == "test.target" {
			content = fmt.Sprintf(content, strings.Join(names, " "))
		}
		if err := writeFileAll(filepath.Join(s.Units, name), content); err != nil {
			return nil, err
		}
	}
	os.Remove(filepath.Join(s.Units, "default.target"))
	if err := os.Symlink("test.target", filepath.Join(s.Units, "default.target")); err != nil {
		return nil, err
	}
	for name, content := range units {
		if err := writeFileAll(filepath.Join(s.Units, name), content); err != nil {
			return nil, err
		}
	}
	s.cmd = exec.Command("bash", filepath.Join(repoRoot(), "tests", "harness", "systemd-ns.sh"), "start")
	s.cmd.Env = append(os.Environ(), "NS_DIR="+dir, "NS_UNITS="+s.Units, "NS_CGROUP="+s.cg, "NS_DATA="+o.Data, "NS_USR="+o.Usr, "NS_USR_RW="+o.UsrWritable)
	if o.SharedMounts {
		s.cmd.Env = append(s.cmd.Env, "NS_SHARED=1")
	}
	if o.LoopDevices {
		s.cmd.Env = append(s.cmd.Env, "NS_LOOP=1")
	}
	if o.KeepSyslog {
		s.cmd.Env = append(s.cmd.Env, "NS_KEEP_SYSLOG=1")
	}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pidFile := filepath.Join(dir, "logs", "ctr.pid")
	for s.PID == 0 {
		if b, err := os.ReadFile(pidFile); err == nil {
			s.PID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if err := s.wait(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	for {
		if _, err := os.Stat(s.BusSocket()); err == nil {
			break
		}
		if err := s.wait(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	s.Bus = systemd.NewDBusAt(s.BusSocket())
	for {
		st, err := s.SystemState(ctx)
		if err == nil && (st == "running" || st == "degraded") {
			return s, nil
		}
		if err := s.wait(ctx, 20*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%w (last state %q, %v)", err, st, err)
		}
	}
}

func (s *Systemd) wait(ctx context.Context, d time.Duration) error {
	select {
	case <-s.done:
		log, _ := os.ReadFile(filepath.Join(s.Dir, "logs", "console.log"))
		return fmt.Errorf("namespaced systemd exited while starting; console:\n%s", tail(string(log), 3000))
	case <-ctx.Done():
		s.Stop()
		log, _ := os.ReadFile(filepath.Join(s.Dir, "logs", "console.log"))
		return fmt.Errorf("namespaced systemd did not come up; console:\n%s", tail(string(log), 3000))
	case <-time.After(d):
		return nil
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func writeFileAll(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(content), 0o644)
}

// AddUnit writes a unit file and reloads systemd.
func (s *Systemd) AddUnit(ctx context.Context, name, content string) error {
	if err := writeFileAll(filepath.Join(s.Units, name), content); err != nil {
		return err
	}
	return s.Reload(ctx)
}

// Stop asks systemd to exit over D-Bus (Manager.Exit), waits, and removes
// its cgroups.
func (s *Systemd) Stop() {
	if s.Bus != nil {
		if c, err := godbus.Dial("unix:path=" + s.BusSocket()); err == nil {
			if c.Auth(nil) == nil && c.Hello() == nil {
				c.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").Call("org.freedesktop.systemd1.Manager.Exit", 0)
			}
			c.Close()
		}
		s.Bus.Close()
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		if s.PID > 0 {
			syscall.Kill(s.PID, syscall.SIGKILL)
		}
		<-s.done
	}
	cleanup := exec.Command("bash", filepath.Join(repoRoot(), "tests", "harness", "systemd-ns.sh"), "cleanup")
	cleanup.Env = append(os.Environ(), "NS_DIR="+s.Dir, "NS_UNITS="+s.Units, "NS_CGROUP="+s.cg)
	cleanup.Run()
}

// BuildStandin builds tests/standin into dir and returns its path.
func BuildStandin(dir string) (string, error) {
	out := filepath.Join(dir, "standin")
	return out, build(out, "./tests/standin")
}

// BuildDaemon builds the daemon (./cmd/autopilot-health, static, as the
// package ships it) to the path out, and its privileged helper
// (./cmd/autopilot-health-privileged) beside it, as the packaging scripts
// find it.
func BuildDaemon(out string) error {
	if err := build(out, "./cmd/autopilot-health"); err != nil {
		return err
	}
	return build(filepath.Join(filepath.Dir(out), "autopilot-health-privileged"), "./cmd/autopilot-health-privileged")
}

// ShippedUnits are the unit files the package installs in
// /usr/lib/systemd/system, from units/.
var ShippedUnits = []string{"autopilot-health.service", "autopilot-health.path", "autopilot-health-refused.service", "autopilot-health-privileged.socket", "autopilot-health-privileged.service"}

// InstallDaemon lays the daemon out under usr (a directory laid over /usr:
// Options.Usr) as the package installs it: bin/autopilot-health,
// lib/autopilot-health/autopilot-health-privileged and the shipped units
// in lib/systemd/system.
func InstallDaemon(usr string) error {
	if err := build(filepath.Join(usr, "bin", "autopilot-health"), "./cmd/autopilot-health"); err != nil {
		return err
	}
	if err := build(filepath.Join(usr, "lib", "autopilot-health", "autopilot-health-privileged"), "./cmd/autopilot-health-privileged"); err != nil {
		return err
	}
	dir := filepath.Join(usr, "lib", "systemd", "system")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, u := range ShippedUnits {
		b, err := RepoFile("units/" + u)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, u), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// build puts the package pkg, built as it ships (CGO_ENABLED=0), at out.
// Each package is built once per test process (go build's cache keeps the
// compiled packages, but links each binary anew: some 2 to 9 s a binary on a
// loaded 2-core machine, for some 20 namespaces a run) and copied to out
// after that: every out is a file of its own, so a test may change its
// copy.
func build(out, pkg string) error {
	bin, err := built(pkg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return copyFile(bin, out)
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*cachedBuild{}
	// buildCache holds the binaries built by this process;
	// RemoveBuildCache removes it.
	buildCache string
)

type cachedBuild struct {
	once sync.Once
	path string
	err  error
}

// built builds pkg once per process and returns the binary's path.
func built(pkg string) (string, error) {
	buildsMu.Lock()
	if buildCache == "" {
		d, err := os.MkdirTemp("", "autopilot-health-builds-")
		if err != nil {
			buildsMu.Unlock()
			return "", err
		}
		buildCache = d
	}
	b := builds[pkg]
	if b == nil {
		b = &cachedBuild{path: filepath.Join(buildCache, strconv.Itoa(len(builds)), filepath.Base(pkg))}
		builds[pkg] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() {
		cmd := exec.Command("go", "build", "-o", b.path, pkg)
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
	})
	return b.path, b.err
}

// RemoveBuildCache removes the binaries built by this process (TestMain,
// after the tests).
func RemoveBuildCache() {
	buildsMu.Lock()
	defer buildsMu.Unlock()
	if buildCache != "" {
		os.RemoveAll(buildCache)
	}
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// RepoFile reads a file of the repository (e.g. the shipped unit file).
func RepoFile(rel string) ([]byte, error) { return os.ReadFile(filepath.Join(repoRoot(), rel)) }

// Properties reads every property of one D-Bus interface of a unit
// (iface "Unit", "Service", ...) over the container's bus, e.g. the
// Service interface's WatchdogTimestampMonotonic or StatusText.
func (s *Systemd) Properties(ctx context.Context, unit, iface string) (map[string]godbus.Variant, error) {
	c, err := s.dialBus(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var path godbus.ObjectPath
	if err := c.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").CallWithContext(ctx, "org.freedesktop.systemd1.Manager.LoadUnit", 0, unit).Store(&path); err != nil {
		return nil, fmt.Errorf("LoadUnit %s: %w", unit, err)
	}
	var props map[string]godbus.Variant
	if err := c.Object("org.freedesktop.systemd1", path).CallWithContext(ctx, "org.freedesktop.DBus.Properties.GetAll", 0, "org.freedesktop.systemd1."+iface).Store(&props); err != nil {
		return nil, fmt.Errorf("%s properties of %s: %w", iface, unit, err)
	}
	return props, nil
}

// MainPID is the unit's main process (0: none), its Service interface's
// MainPID.
func (s *Systemd) MainPID(ctx context.Context, unit string) (uint32, error) {
	sp, err := s.Properties(ctx, unit, "Service")
	if err != nil {
		return 0, err
	}
	pid, _ := sp["MainPID"].Value().(uint32)
	return pid, nil
}

// Journal returns what the journald inside (if one runs) holds for the
// given units, for failure output; call it before Stop.
func (s *Systemd) Journal(units ...string) string {
	args := []string{"-D", s.Root("/run/log/journal"), "--no-pager", "-o", "short-precise"}
	for _, u := range units {
		args = append(args, "-u", u)
	}
	out, err := exec.Command("journalctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("journalctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Cgroup is the host's directory of the cgroup that PID 1 in s calls rel
// (a unit's ControlGroup, "/system.slice/x.service").
func (s *Systemd) Cgroup(rel string) string {
	return filepath.Join(s.cg, "payload", rel)
}

// Console returns the tail of PID 1's console output.
func (s *Systemd) Console(n int) string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "logs", "console.log"))
	return tail(string(b), n)
}
