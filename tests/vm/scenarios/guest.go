package scenarios

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Protocol lines on the serial console (read by tests/vm/vmhost):
//
//	VMTEST RESULT <name> PASS|FAIL <ms>ms <detail on one line>
//	VMTEST DONE <passed> passed, <failed> failed
//	DAEMON| <a line of the daemon's log>
//	KMSG|<scenario>| <a kernel record logged while a failed scenario ran>
const (
	DaemonPrefix = "DAEMON| "
	KmsgPrefix   = "KMSG|"
)

// Guest is what a scenario uses inside the VM.
type Guest struct {
	daemon *exec.Cmd
	exited chan error
	// scenarios replaces All and openKmsg OpenKmsg in the unit tests.
	scenarios []Scenario
	openKmsg  func() (*Kmsg, error)
	// started is when the daemon was started (just before its exec);
	// before holds the errors of the scenarios' BeforeDaemon.
	started time.Time
	before  map[string]error
}

// Logf prints a line on the console (shown with the console tail when a
// scenario fails).
func (g *Guest) Logf(format string, a ...any) { fmt.Printf("  "+format+"\n", a...) }

// Main is the guest's /init: it mounts the API filesystems, loads the base
// modules, starts the daemon, runs the scenarios the kernel command line
// names (vmtest.run=a,b,c) until the guest's deadline (vmtest.deadline=N,
// seconds after boot; see Deadline), prints their results and the daemon's
// log, and powers the machine off.
func Main() {
	if len(os.Args) > 1 && os.Args[1] == hungWriterArg {
		hungWriter(os.Args[2:])
		return
	}
	t0 := time.Now()
	fmt.Printf("VMTEST init at %.3fs of boot\n", boottime())
	g := &Guest{}
	names, deadline, err := setup()
	if err == nil {
		fmt.Printf("VMTEST modules loaded in %dms\n", time.Since(t0).Milliseconds())
		g.beforeDaemon(names)
		err = g.startDaemon()
	}
	passed, failed, abandoned := 0, 0, false
	if err != nil {
		fmt.Printf("VMTEST setup failed: %v\n", err)
	} else {
		fmt.Printf("VMTEST setup done in %dms\n", time.Since(t0).Milliseconds())
		// The deadline counts from boot (CLOCK_BOOTTIME), as QEMU's run
		// does on the host.
		at := time.Now().Add(deadline - time.Duration(boottime()*float64(time.Second)))
		passed, failed, abandoned = g.runAll(os.Stdout, names, at, deadline)
	}
	g.stopDaemon()
	if b, err := os.ReadFile(DaemonLog); err == nil {
		for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			fmt.Println(DaemonPrefix + l)
		}
	}
	fmt.Printf("VMTEST DONE %d passed, %d failed\n", passed, failed)
	// A scenario left running may hold a filesystem frozen: sync would
	// wait for it, and there is nothing to keep in an initramfs.
	if !abandoned {
		unix.Sync()
	}
	if os.Getpid() == 1 {
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
}

// runAll runs the named scenarios in order and prints a result line for
// each on w. At the deadline (after is how it reads: "300s after boot") a
// scenario still running fails and is left running (abandoned), and the
// scenarios after it fail without starting: the guest then still prints the
// daemon's log before the host's timeout (Deadline) ends QEMU.
func (g *Guest) runAll(w io.Writer, names []string, deadline time.Time, after time.Duration) (passed, failed int, abandoned bool) {
	byName := map[string]Scenario{}
	for _, s := range g.all() {
		byName[s.Name] = s
	}
	for _, n := range names {
		s, known := byName[n]
		ok := false
		switch {
		case !known:
			fmt.Fprintf(w, "VMTEST RESULT %s FAIL 0ms no such scenario in this guest\n", n)
		case abandoned || !time.Now().Before(deadline):
			fmt.Fprintf(w, "VMTEST RESULT %s FAIL 0ms not run: the guest's deadline (%v after boot) had passed\n", n, after)
		default:
			var left bool
			ok, left = g.runScenario(w, s, deadline, after)
			abandoned = abandoned || left
		}
		if ok {
			passed++
		} else {
			failed++
		}
	}
	return passed, failed, abandoned
}

// beforeDaemon runs the BeforeDaemon of the named scenarios, in order, and
// keeps their errors for their turn.
func (g *Guest) beforeDaemon(names []string) {
	for _, s := range g.all() {
		if s.BeforeDaemon == nil || !slices.Contains(names, s.Name) {
			continue
		}
		fmt.Printf("VMTEST BEFORE-DAEMON %s\n", s.Name)
		if err := runBeforeDaemon(g, s); err != nil {
			if g.before == nil {
				g.before = map[string]error{}
			}
			g.before[s.Name] = err
		}
	}
}

// runBeforeDaemon runs s's BeforeDaemon; a panic is its error, as a Run's
// is (runScenario), not the end of the guest's setup and of every scenario
// of the boot.
func runBeforeDaemon(g *Guest, s Scenario) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return s.BeforeDaemon(g)
}

func (g *Guest) all() []Scenario {
	if g.scenarios != nil {
		return g.scenarios
	}
	return append(slices.Clone(All), Scenario{Name: DeadlineProbe, Run: func(*Guest) error { select {} }})
}

// DeadlineProbe is a scenario outside All that never ends: TestVM boots it
// with a short deadline to see the guest stop at its deadline and still
// print the daemon's log.
const DeadlineProbe = "vmtest_deadline_probe"

// runScenario runs one scenario and prints its result; at the deadline it
// stops waiting for it, fails it and reports it left running.
func (g *Guest) runScenario(w io.Writer, s Scenario, deadline time.Time, after time.Duration) (ok, abandoned bool) {
	fmt.Fprintf(w, "VMTEST START %s\n", s.Name)
	openKmsg := g.openKmsg
	if openKmsg == nil {
		openKmsg = OpenKmsg
	}
	k, kerr := openKmsg()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("panic: %v", p)
			}
		}()
		if err := g.before[s.Name]; err != nil {
			done <- fmt.Errorf("before the daemon started: %w", err)
			return
		}
		done <- s.Run(g)
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var err error
	select {
	case err = <-done:
	case <-timer.C:
		abandoned = true
		err = fmt.Errorf("still running at the guest's deadline (%v after boot); the scenarios after it are not run", after)
	}
	ms := time.Since(start).Milliseconds()
	if err == nil && g.daemonExited() != nil {
		err = fmt.Errorf("the daemon exited: %v", g.daemonExited())
	}
	if err != nil {
		if kerr == nil {
			for _, r := range k.Drain() {
				fmt.Fprintf(w, "%s%s| %s\n", KmsgPrefix, s.Name, r.Raw)
			}
		}
		fmt.Fprintf(w, "VMTEST RESULT %s FAIL %dms %s\n", s.Name, ms, oneLine(err.Error()))
	} else {
		fmt.Fprintf(w, "VMTEST RESULT %s PASS %dms\n", s.Name, ms)
	}
	if kerr == nil {
		k.Close()
	}
	return err == nil, abandoned
}

func boottime() float64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " | ") }

func setup() (names []string, deadline time.Duration, err error) {
	for _, m := range []struct{ src, dst, typ, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return nil, 0, fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	// /run/autopilot-health: the status socket's directory, as the unit's
	// RuntimeDirectory= makes it.
	for _, d := range []string{"/run/lvm", "/run/lock/lvm", "/run/cryptsetup", "/mnt", StateDir, "/etc/autopilot-health", "/run/autopilot-health"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, 0, err
		}
	}
	os.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	os.Setenv("DM_DISABLE_UDEV", "1") // libdevmapper makes the /dev/mapper nodes itself
	os.Setenv("LVM_SUPPRESS_FD_WARNINGS", "1")
	// Kernel messages stay in /dev/kmsg, off the console, so they do not
	// cut into the protocol lines.
	_ = os.WriteFile("/proc/sys/kernel/printk", []byte("1"), 0)
	if err := loopbackUp(); err != nil {
		return nil, 0, err
	}
	for p, c := range map[string]string{ConfigPath: DaemonConfig, CheckConfigPath: CheckConfig} {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			return nil, 0, err
		}
	}
	for _, m := range BaseModules {
		if err := Modprobe(m, ""); err != nil {
			return nil, 0, err
		}
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil, 0, err
	}
	names, deadline, err = ParseCmdline(string(cmdline))
	return names, deadline, err
}

// ParseCmdline reads the guest's parameters from the kernel command line:
// vmtest.run=a,b (the scenarios, in order) and vmtest.deadline=N (seconds
// after boot; without it, Deadline of the scenarios named).
func ParseCmdline(cmdline string) (names []string, deadline time.Duration, err error) {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, "vmtest.run="); ok && v != "" {
			names = strings.Split(v, ",")
		}
		if v, ok := strings.CutPrefix(f, "vmtest.deadline="); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return nil, 0, fmt.Errorf("vmtest.deadline=%s: not a positive number of seconds", v)
			}
			deadline = time.Duration(n) * time.Second
		}
	}
	if deadline == 0 {
		deadline, _ = Deadline(len(names))
	}
	return names, deadline, nil
}

// loopbackUp brings lo up (the kernel gives it 127.0.0.1): the daemon's
// metrics listener is on it.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// Modprobe loads a module packed in the initramfs after its dependencies
// (from /etc/vmtest/modules), with params for the named module only.
func Modprobe(name, params string) error {
	b, err := os.ReadFile("/etc/vmtest/modules")
	if err != nil {
		return err
	}
	type mod struct {
		path string
		deps []string
	}
	mods := map[string]mod{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		m := mod{path: f[1]}
		if len(f) > 2 {
			m.deps = strings.Split(f[2], ",")
		}
		mods[f[0]] = m
	}
	var load func(n, params string) error
	load = func(n, params string) error {
		m, ok := mods[n]
		if !ok {
			return fmt.Errorf("module %s is not in the initramfs (add it to the scenario's Modules)", n)
		}
		for _, d := range m.deps {
			if err := load(d, ""); err != nil {
				return err
			}
		}
		fd, err := unix.Open(m.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.FinitModule(fd, params, 0); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("loading %s: %w", n, err)
		}
		return nil
	}
	return load(strings.ReplaceAll(name, "-", "_"), params)
}

func (g *Guest) startDaemon() error {
	log, err := os.Create(DaemonLog)
	if err != nil {
		return err
	}
	cmd := exec.Command(DaemonPath, "run", "--config", ConfigPath)
	cmd.Stdout, cmd.Stderr = log, log
	g.started = time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	log.Close()
	g.daemon, g.exited = cmd, make(chan error, 1)
	go func() { g.exited <- cmd.Wait() }()
	// Up once it serves its metrics.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := g.Metrics(); err == nil {
			return nil
		}
		if err := g.daemonExited(); err != nil {
			return fmt.Errorf("the daemon exited at start: %v", err)
		}
		if time.Now().After(deadline) {
			return errors.New("the daemon did not serve /metrics within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// daemonExited returns nil while the daemon runs.
func (g *Guest) daemonExited() error {
	select {
	case err := <-g.exited:
		if err == nil {
			err = errors.New("exit status 0")
		}
		g.exited <- err
		return err
	default:
		return nil
	}
}

func (g *Guest) stopDaemon() {
	if g.daemon == nil || g.daemonExited() != nil {
		return
	}
	_ = g.daemon.Process.Signal(unix.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(5 * time.Second):
		_ = g.daemon.Process.Kill()
	}
}

// Condition is a condition as the daemon's state file holds it.
type Condition struct {
	Type               string    `json:"type"`
	Status             string    `json:"status"`
	Reason             string    `json:"reason"`
	Message            string    `json:"message"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
}

func (c Condition) String() string {
	return fmt.Sprintf("%s=%s %s: %q", c.Type, c.Status, c.Reason, c.Message)
}

// State reads the daemon's state file (written within a second of a
// change).
func (g *Guest) State() (map[string]Condition, error) {
	b, err := os.ReadFile(StateFile)
	if err != nil {
		return nil, err
	}
	var sf struct {
		Conditions []Condition `json:"conditions"`
	}
	if err := json.Unmarshal(b, &sf); err != nil {
		return nil, fmt.Errorf("%s: %w", StateFile, err)
	}
	out := map[string]Condition{}
	for _, c := range sf.Conditions {
		out[c.Type] = c
	}
	return out, nil
}

// Await waits until the daemon's state file shows the condition with this
// status and reason, and returns it; after d it fails with what it saw.
func (g *Guest) Await(typ, status, reason string, d time.Duration) (Condition, error) {
	deadline := time.Now().Add(d)
	var last Condition
	var lastErr error
	for {
		st, err := g.State()
		if err == nil {
			last, lastErr = st[typ], nil
			if last.Status == status && last.Reason == reason {
				return last, nil
			}
		} else {
			lastErr = err
		}
		if err := g.daemonExited(); err != nil {
			return last, fmt.Errorf("the daemon exited: %v", err)
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return last, fmt.Errorf("waiting %v for %s=%s %s: %v", d, typ, status, reason, lastErr)
			}
			return last, fmt.Errorf("waiting %v for %s=%s %s: the state file shows %s", d, typ, status, reason, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AwaitLog waits until the daemon's log has a match of re and returns it.
func (g *Guest) AwaitLog(re *regexp.Regexp, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		b, err := os.ReadFile(DaemonLog)
		if m := re.Find(b); err == nil && m != nil {
			return string(m), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("waiting %v for a line of the daemon's log matching %s (%v)", d, re, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MessageHas fails unless the condition's message contains every part.
func MessageHas(c Condition, parts ...string) error {
	for _, p := range parts {
		if !strings.Contains(c.Message, p) {
			return fmt.Errorf("%s: message lacks %q", c, p)
		}
	}
	return nil
}

// Metrics returns the daemon's /metrics page.
func (g *Guest) Metrics() (string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(MetricsURL)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", MetricsURL, resp.Status)
	}
	return string(b), nil
}

// Metric finds the sample of name whose labels include every k="v" pair
// in labels (given as "k", "v", ...); ok is false when there is none.
func Metric(page, name string, labels ...string) (v float64, ok bool) {
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		series, val, found := strings.Cut(l, " ")
		if !found {
			continue
		}
		n, lbl, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(lbl, labels[i]+"="+strconv.Quote(labels[i+1])) {
				match = false
			}
		}
		if match {
			f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// AwaitMetric waits until the sample reaches at least min and returns the
// whole page it saw then.
func (g *Guest) AwaitMetric(min float64, d time.Duration, name string, labels ...string) (string, error) {
	deadline := time.Now().Add(d)
	var v float64
	for {
		page, err := g.Metrics()
		if err == nil {
			if v, _ = Metric(page, name, labels...); v >= min {
				return page, nil
			}
		}
		if time.Now().After(deadline) {
			return page, fmt.Errorf("waiting %v for %s%v >= %v: %v (err %v)", d, name, labels, min, v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ConditionStatus is the status /metrics shows for a condition.
func ConditionStatus(page, typ string) string {
	for _, s := range []string{"True", "False", "Unknown"} {
		if v, ok := Metric(page, "autopilot_health_condition_status", "condition", typ, "status", s); ok && v == 1 {
			return s
		}
	}
	return ""
}

// CheckOutput is `autopilot-health check --json`.
type CheckOutput struct {
	Conditions []Condition                `json:"conditions"`
	Report     map[string]json.RawMessage `json:"report"`
}

// Check runs `autopilot-health check --json --only ...` with the guest's
// configuration for it (CheckConfig).
func (g *Guest) Check(only ...string) (CheckOutput, error) {
	var out CheckOutput
	b, err := exec.Command(DaemonPath, "check", "--json", "--config", CheckConfigPath, "--only", strings.Join(only, ",")).Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		msg := ""
		if ee != nil {
			msg = string(ee.Stderr)
		}
		return out, fmt.Errorf("autopilot-health check: %v %s", err, msg)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fmt.Errorf("check --json: %w: %s", err, b)
	}
	return out, nil
}

// Run runs a command, logs it and its output, and returns the output.
func (g *Guest) Run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	s := strings.TrimRight(string(out), "\n")
	g.Logf("$ %s %s", name, strings.Join(args, " "))
	for _, l := range strings.Split(s, "\n") {
		if l != "" {
			g.Logf("  %s", l)
		}
	}
	if err != nil {
		return s, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, oneLine(s))
	}
	return s, nil
}
