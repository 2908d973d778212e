package packaging

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// dpkgRoot is a throwaway root with only a dpkg database, as an image build
// has before it installs packages: dpkg --root installs into it, and the
// maintainer scripts run outside it with DPKG_ROOT set (deb-systemd-helper
// honours it), the way an image builder runs them without systemd.
type dpkgRoot struct {
	t    *testing.T
	Dir  string
	arch string
	// chrooted: dpkg runs the maintainer scripts chrooted into Dir (its
	// default; DPKG_ROOT is empty), not outside it with DPKG_ROOT set.
	chrooted bool
}

// stubStatus stands in for the image's systemd and dbus (Multi-Arch:
// foreign, so they satisfy the Depends of a foreign-architecture package as
// the image's own native ones would).
const stubStatus = `Package: systemd
Status: install ok installed
Priority: optional
Section: admin
Maintainer: test <test@example.invalid>
Architecture: all
Multi-Arch: foreign
Version: 252
Description: stand-in for the host's systemd

Package: dbus
Status: install ok installed
Priority: optional
Section: admin
Maintainer: test <test@example.invalid>
Architecture: all
Multi-Arch: foreign
Version: 1.14
Description: stand-in for the host's dbus

`

func newDpkgRoot(t *testing.T, arch string) *dpkgRoot {
	t.Helper()
	for _, p := range []string{"dpkg", "dpkg-query", "deb-systemd-helper", "systemctl"} {
		if _, err := exec.LookPath(p); err != nil {
			testenv.Skip(t, p+" not installed (apt install dpkg init-system-helpers systemd)")
		}
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "dpkg --root installs files owned by root: needs root")
	}
	r := &dpkgRoot{t: t, Dir: t.TempDir(), arch: arch}
	db := filepath.Join(r.Dir, "var", "lib", "dpkg")
	for _, d := range []string{"info", "updates", "triggers"} {
		if err := os.MkdirAll(filepath.Join(db, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(db, "status"), []byte(stubStatus), 0o644))
	must(t, os.WriteFile(filepath.Join(db, "available"), nil, 0o644))
	for _, p := range []string{"systemd", "dbus"} {
		must(t, os.WriteFile(filepath.Join(db, "info", p+".list"), nil, 0o644))
	}
	if arch != runtime.GOARCH {
		r.dpkg("--add-architecture", arch)
	}
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (r *dpkgRoot) path(p string) string { return filepath.Join(r.Dir, p) }

// dpkg runs dpkg on the root; a failure fails the test.
func (r *dpkgRoot) dpkg(args ...string) string {
	r.t.Helper()
	out, err := r.tryDpkg(args...)
	if err != nil {
		r.t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// tryDpkg runs dpkg on the root and returns what it printed and how it
// ended, for a run that may fail. Stdin is none: a conffile prompt would
// fail, not hang.
func (r *dpkgRoot) tryDpkg(args ...string) (string, error) {
	opts := []string{"--root=" + r.Dir, "--force-script-chrootless", "--log=/dev/null"}
	if r.chrooted {
		opts = []string{"--root=" + r.Dir, "--log=/dev/null"}
	}
	cmd := exec.Command("dpkg", append(opts, args...)...)
	cmd.Stdin = nil
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// status is dpkg-query's status of the package ("" when it is unknown).
func (r *dpkgRoot) status() string {
	out, _ := exec.Command("dpkg-query", "--root="+r.Dir, "-W", "-f=${Status} ${Version}", "autopilot-health").Output()
	return string(out)
}

// systemctl runs systemctl --root on the root and returns its stdout.
func (r *dpkgRoot) systemctl(args ...string) string {
	r.t.Helper()
	out, _ := exec.Command("systemctl", append([]string{"--root=" + r.Dir}, args...)...).Output()
	return strings.TrimSpace(string(out))
}

func (r *dpkgRoot) exists(p string) bool {
	_, err := os.Lstat(r.path(p))
	return err == nil
}

func (r *dpkgRoot) read(p string) string {
	r.t.Helper()
	b, err := os.ReadFile(r.path(p))
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

const (
	cfgPath   = "/etc/autopilot-health/config.toml"
	wantsLink = "/etc/systemd/system/multi-user.target.wants/autopilot-health.service"
	unitPath  = "/usr/lib/systemd/system/autopilot-health.service"
	stateFile = "/var/lib/autopilot-health/state.json"
)

var newer struct {
	sync.Mutex
	deb, config string
}

// newerPackage is deb as version 1.0.1 with a changed default configuration
// (one more comment line), built the way build.sh builds (once per run).
func newerPackage(t *testing.T, deb string) (string, string) {
	t.Helper()
	newer.Lock()
	defer newer.Unlock()
	if newer.deb != "" {
		return newer.deb, newer.config
	}
	x := extract(t, deb)
	cfg := filepath.Join(x, cfgPath)
	old, err := os.ReadFile(cfg)
	must(t, err)
	newDefault := string(old) + "# a default added in 1.0.1\n"
	must(t, os.WriteFile(cfg, []byte(newDefault), 0o644))
	control := filepath.Join(x, "DEBIAN", "control")
	c, err := os.ReadFile(control)
	must(t, err)
	must(t, os.WriteFile(control, bytes.Replace(c, []byte("Version: 1.0.0\n"), []byte("Version: 1.0.1\n"), 1), 0o644))
	out := filepath.Join(binDir, "autopilot-health_1.0.1.deb")
	if b, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", x, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, b)
	}
	newer.deb, newer.config = out, newDefault
	return out, newDefault
}

// TestDebianPackageLifecycle installs, upgrades, removes and purges the
// package in a throwaway root as an image build and a fleet upgrade do:
//   - install: files in place, the configuration a conffile, the unit
//     enabled (deb-systemd-helper, as on a running system), and enabled by
//     the package's preset where the image's policy disables everything else
//     (systemctl preset);
//   - upgrade with an edited configuration (--force-confdef --force-confold,
//     apt's unattended choice): the edit, which the new binary accepts
//     (TestDebianPackageUpgradeRefusedConfiguration: one it refuses), kept,
//     the new default beside it as config.toml.dpkg-dist, still enabled;
//   - remove: program and unit gone, the unit masked, configuration and
//     state kept;
//   - purge: configuration, state and enable state gone.
//
// The running daemon's part (started, restarted, stopped) needs a running
// systemd: tests/ TestDebianPackageUnderSystemd.
func TestDebianPackageLifecycle(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	r := newDpkgRoot(t, runtime.GOARCH)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	v2, v2Default := newerPackage(t, v1)

	// Install.
	r.dpkg("--install", v1)
	if s := r.status(); s != "install ok installed 1.0.0" {
		t.Fatalf("after install: %q", s)
	}
	for _, p := range []string{"/usr/bin/autopilot-health", unitPath, "/usr/share/man/man8/autopilot-health.8.gz", cfgPath} {
		if !r.exists(p) {
			t.Errorf("installed root lacks %s", p)
		}
	}
	conffiles, _ := exec.Command("dpkg-query", "--root="+r.Dir, "-W", "-f=${Conffiles}", "autopilot-health").Output()
	if !strings.Contains(string(conffiles), " "+cfgPath+" ") {
		t.Errorf("dpkg does not hold %s as a conffile: %q", cfgPath, conffiles)
	}
	if dest, err := os.Readlink(r.path(wantsLink)); err != nil || dest != unitPath {
		t.Errorf("after install, %s -> %q (%v), want %s", wantsLink, dest, err, unitPath)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
		t.Errorf("after install: is-enabled %q", s)
	}
	// The path unit that starts the daemon when a refused configuration
	// file changes (README: "Under systemd"): enabled beside it.
	if s := r.systemctl("is-enabled", "autopilot-health.path"); s != "enabled" {
		t.Errorf("after install: autopilot-health.path is-enabled %q", s)
	}
	// The image's preset policy disables every unit but those a preset
	// enables: ours does.
	must(t, os.MkdirAll(r.path("/etc/systemd/system-preset"), 0o755))
	must(t, os.WriteFile(r.path("/etc/systemd/system-preset/99-default.preset"), []byte("disable *\n"), 0o644))
	r.systemctl("disable", "autopilot-health.service")
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "disabled" {
		t.Fatalf("after disable: is-enabled %q", s)
	}
	r.systemctl("preset-all")
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
		t.Errorf("after preset-all: is-enabled %q, want enabled by 80-autopilot-health.preset", s)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.path"); s != "enabled" {
		t.Errorf("after preset-all: autopilot-health.path is-enabled %q, want enabled by 80-autopilot-health.preset", s)
	}
	// Without our preset, the same policy disables it: the preset is what
	// enables it.
	preset := r.path("/usr/lib/systemd/system-preset/80-autopilot-health.preset")
	must(t, os.Rename(preset, preset+".off"))
	r.systemctl("preset-all")
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "disabled" {
		t.Errorf("preset-all without the package's preset: is-enabled %q, want disabled", s)
	}
	must(t, os.Rename(preset+".off", preset))
	r.systemctl("preset-all")
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
		t.Fatalf("after preset-all: is-enabled %q", s)
	}

	// Upgrade with an edited configuration.
	edited := r.read(cfgPath) + "\n# edited by the operator\n[metrics]\nlisten_address = \"127.0.0.1:20257\"\n"
	must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
	must(t, os.MkdirAll(filepath.Dir(r.path(stateFile)), 0o750))
	must(t, os.WriteFile(r.path(stateFile), []byte("{}\n"), 0o640))
	r.dpkg("--force-confdef", "--force-confold", "--install", v2)
	if s := r.status(); s != "install ok installed 1.0.1" {
		t.Fatalf("after upgrade: %q", s)
	}
	if got := r.read(cfgPath); got != edited {
		t.Errorf("the upgrade did not keep the edited configuration:\n%s", got)
	}
	if got := r.read(cfgPath + ".dpkg-dist"); got != v2Default {
		t.Errorf("config.toml.dpkg-dist is not 1.0.1's default:\n%s", got)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
		t.Errorf("after upgrade: is-enabled %q", s)
	}

	// Remove: configuration and state kept.
	r.dpkg("--remove", "autopilot-health")
	if s := r.status(); s != "deinstall ok config-files 1.0.1" {
		t.Errorf("after remove: %q", s)
	}
	for _, p := range []string{"/usr/bin/autopilot-health", unitPath} {
		if r.exists(p) {
			t.Errorf("after remove, %s is still there", p)
		}
	}
	for _, p := range []string{cfgPath, stateFile} {
		if !r.exists(p) {
			t.Errorf("remove deleted %s", p)
		}
	}
	if got := r.read(cfgPath); got != edited {
		t.Errorf("after remove the configuration is not the edited one")
	}
	// Remove masks the unit (dh_installsystemd's postrm), which would keep
	// a system extension's autopilot-health.service from starting: README
	// ("As a system extension") says to purge it; purge unmasks it (below:
	// no /etc/systemd/system/autopilot-health.service left).
	const maskLink = "/etc/systemd/system/autopilot-health.service"
	if dest, err := os.Readlink(r.path(maskLink)); err != nil || dest != "/dev/null" {
		t.Errorf("after remove, %s -> %q (%v), want /dev/null (masked)", maskLink, dest, err)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "masked" {
		t.Errorf("after remove: is-enabled %q, want masked", s)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.path"); s != "masked" {
		t.Errorf("after remove: autopilot-health.path is-enabled %q, want masked", s)
	}

	// Purge: nothing of it left.
	r.dpkg("--purge", "autopilot-health")
	if s := r.status(); s != "" && !strings.HasPrefix(s, "unknown ok not-installed") {
		t.Errorf("after purge: %q", s)
	}
	for _, p := range []string{"/etc/autopilot-health", "/var/lib/autopilot-health", wantsLink, "/etc/systemd/system/autopilot-health.service", "/etc/systemd/system/autopilot-health.path", "/etc/systemd/system/multi-user.target.wants/autopilot-health.path"} {
		if r.exists(p) {
			t.Errorf("after purge, %s is still there", p)
		}
	}
	filepath.WalkDir(r.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), "autopilot-health") {
			t.Errorf("after purge: %s", strings.TrimPrefix(p, r.Dir))
		}
		return nil
	})
}

// TestDebianPackageUpgradeUnedited: an upgrade of an unedited configuration
// installs the new default in its place, silently (no prompt, no
// .dpkg-dist or .dpkg-old beside it).
func TestDebianPackageUpgradeUnedited(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	r := newDpkgRoot(t, runtime.GOARCH)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	v2, v2Default := newerPackage(t, v1)
	r.dpkg("--install", v1)
	r.dpkg("--install", v2)
	if s := r.status(); s != "install ok installed 1.0.1" {
		t.Fatalf("after upgrade: %q", s)
	}
	if got := r.read(cfgPath); got != v2Default {
		t.Errorf("the unedited configuration is not 1.0.1's default:\n%s", got)
	}
	for _, suffix := range []string{".dpkg-dist", ".dpkg-old", ".dpkg-new"} {
		if r.exists(cfgPath + suffix) {
			t.Errorf("%s%s exists", cfgPath, suffix)
		}
	}
}

// refusedEdit appends to base an edit that the package refuses (each
// release adds validation: an older build may have run on it), and returns
// it with the validator's file:line: key: problem for it, file named file.
func refusedEdit(file, base string) (edited, problem string) {
	edited = base + "\n# edited by the operator\n[checks.ServiceNotRecovering]\nrestart_threshold = 1000\n"
	line := strings.Count(edited, "\n") // the key's, the last
	return edited, fmt.Sprintf("%s:%d: key checks.ServiceNotRecovering.restart_threshold: must be between 1 and 100, got 1000", file, line)
}

// TestDebianPackageUpgradeRefusedConfiguration: an upgrade onto an edited
// configuration that the new version refuses fails configure before the
// daemon is restarted (the running one keeps running the previous version,
// rather than the new one failing to start every 5 s): dpkg fails with the
// file, the validator's file:line: key: problem and what to do, the package
// stays half-configured with the edit kept and the unit enabled, and once
// the file is fixed dpkg --configure -a completes it. A first install onto
// a refused file (an image build that wrote it first) fails the same way.
// A valid edit upgrades as before (TestDebianPackageLifecycle).
func TestDebianPackageUpgradeRefusedConfiguration(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	v2, v2Default := newerPackage(t, v1)
	fixed := "[metrics]\nlisten_address = \"127.0.0.1:20257\"\n"

	t.Run("upgrade", func(t *testing.T) {
		r := newDpkgRoot(t, runtime.GOARCH)
		r.dpkg("--install", v1)
		edited, problem := refusedEdit(r.path(cfgPath), r.read(cfgPath))
		must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
		out, err := r.tryDpkg("--force-confdef", "--force-confold", "--install", v2)
		if err == nil {
			t.Fatalf("the upgrade onto a refused configuration succeeded:\n%s", out)
		}
		for _, want := range []string{
			"this version refuses the configuration file " + r.path(cfgPath) + ":\n  " + problem + "\n",
			"The running daemon was not restarted and keeps running the previous version (1.0.0).",
			"'dpkg --root=" + r.Dir + " --configure -a'",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("dpkg's output lacks %q:\n%s", want, out)
			}
		}
		if s := r.status(); s != "install ok half-configured 1.0.1" {
			t.Errorf("after the refused upgrade: %q", s)
		}
		if got := r.read(cfgPath); got != edited {
			t.Errorf("the refused upgrade did not keep the edited configuration:\n%s", got)
		}
		if got := r.read(cfgPath + ".dpkg-dist"); got != v2Default {
			t.Errorf("config.toml.dpkg-dist is not 1.0.1's default:\n%s", got)
		}
		if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
			t.Errorf("after the refused upgrade: is-enabled %q", s)
		}
		// Still refused: still half-configured.
		if out, err := r.tryDpkg("--configure", "-a"); err == nil || !strings.Contains(out, problem) {
			t.Errorf("dpkg --configure -a on the unchanged file: %v\n%s", err, out)
		}
		must(t, os.WriteFile(r.path(cfgPath), []byte(fixed), 0o644))
		r.dpkg("--configure", "-a")
		if s := r.status(); s != "install ok installed 1.0.1" {
			t.Errorf("after the fix and dpkg --configure -a: %q", s)
		}
	})

	// dpkg --root without --force-script-chrootless runs the postinst
	// chrooted, DPKG_ROOT empty: the root's own binary checks the root's
	// own file, named by its path there. The root has a static shell and
	// sed (busybox) and nothing of systemd.
	t.Run("chrooted", func(t *testing.T) {
		r := newDpkgRoot(t, runtime.GOARCH)
		r.chrooted = true
		busybox := staticBusybox(t)
		must(t, os.MkdirAll(r.path("/bin"), 0o755))
		b, err := os.ReadFile(busybox)
		must(t, err)
		must(t, os.WriteFile(r.path("/bin/busybox"), b, 0o755))
		for _, applet := range []string{"sh", "sed"} {
			must(t, os.Symlink("busybox", r.path("/bin/"+applet)))
		}
		r.dpkg("--install", v1)
		edited, problem := refusedEdit(cfgPath, r.read(cfgPath))
		must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
		out, err := r.tryDpkg("--force-confdef", "--force-confold", "--install", v2)
		if err == nil {
			t.Fatalf("the upgrade onto a refused configuration succeeded:\n%s", out)
		}
		for _, want := range []string{
			"this version refuses the configuration file " + cfgPath + ":\n  " + problem + "\n",
			"The running daemon was not restarted and keeps running the previous version (1.0.0).",
			"'dpkg --configure -a'",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("dpkg's output lacks %q:\n%s", want, out)
			}
		}
		if s := r.status(); s != "install ok half-configured 1.0.1" {
			t.Errorf("after the refused upgrade: %q", s)
		}
		must(t, os.WriteFile(r.path(cfgPath), []byte(fixed), 0o644))
		r.dpkg("--configure", "-a")
		if s := r.status(); s != "install ok installed 1.0.1" {
			t.Errorf("after the fix and dpkg --configure -a: %q", s)
		}
	})

	t.Run("first install", func(t *testing.T) {
		r := newDpkgRoot(t, runtime.GOARCH)
		must(t, os.MkdirAll(filepath.Dir(r.path(cfgPath)), 0o755))
		edited, problem := refusedEdit(r.path(cfgPath), "")
		must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
		out, err := r.tryDpkg("--force-confdef", "--force-confold", "--install", v1)
		if err == nil {
			t.Fatalf("the install onto a refused configuration succeeded:\n%s", out)
		}
		for _, want := range []string{"  " + problem + "\n", "The daemon was not started.", "'dpkg --root=" + r.Dir + " --configure -a'"} {
			if !strings.Contains(out, want) {
				t.Errorf("dpkg's output lacks %q:\n%s", want, out)
			}
		}
		if s := r.status(); s != "install ok half-configured 1.0.0" {
			t.Errorf("after the refused install: %q", s)
		}
		if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
			t.Errorf("after the refused install: is-enabled %q", s)
		}
		must(t, os.WriteFile(r.path(cfgPath), []byte(fixed), 0o644))
		r.dpkg("--configure", "-a")
		if s := r.status(); s != "install ok installed 1.0.0" {
			t.Errorf("after the fix and dpkg --configure -a: %q", s)
		}
	})
}

// TestDebianPackageRefusesWhatTheUnitRefuses: the postinst checks the file
// as the unit's run --privileged-helper loads it, which refuses a host_root
// other than "/" (exit 2) where config validate alone took it: an image
// built on such a file installed cleanly, and its daemon never started.
func TestDebianPackageRefusesWhatTheUnitRefuses(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	r := newDpkgRoot(t, runtime.GOARCH)
	must(t, os.MkdirAll(filepath.Dir(r.path(cfgPath)), 0o755))
	must(t, os.WriteFile(r.path(cfgPath), []byte("# edited\nhost_root = \"/host\"\n"), 0o644))
	out, err := r.tryDpkg("--force-confdef", "--force-confold", "--install", v1)
	if err == nil {
		t.Fatalf("the install onto a host_root the unit's run refuses succeeded:\n%s", out)
	}
	want := "  " + r.path(cfgPath) + `:2: key host_root: "/host": the privileged helper reads this host's own root only; run without --privileged-helper` + "\n"
	if !strings.Contains(out, want) {
		t.Errorf("dpkg's output lacks %q:\n%s", want, out)
	}
	if s := r.status(); s != "install ok half-configured 1.0.0" {
		t.Errorf("after the refused install: %q", s)
	}
	must(t, os.WriteFile(r.path(cfgPath), []byte("host_root = \"/\"\n"), 0o644))
	r.dpkg("--configure", "-a")
	if s := r.status(); s != "install ok installed 1.0.0" {
		t.Errorf("after the fix and dpkg --configure -a: %q", s)
	}
}

// staticBusybox is a statically linked busybox of this machine (a shell
// for a chroot with nothing else in it), or skips the test.
func staticBusybox(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("busybox")
	if err != nil {
		testenv.Skip(t, "busybox not installed (apt install busybox-static)")
	}
	f, err := elf.Open(p)
	if err != nil {
		testenv.Skip(t, p+" is not an ELF executable")
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			testenv.Skip(t, p+" is dynamically linked (apt install busybox-static)")
		}
	}
	return p
}

// TestDebianPackageDowngrade: a rollback to the older package (apt install
// autopilot-health=<older>, as a fleet does when a release misbehaves)
// keeps the state the newer daemon wrote (state.json, and tamper.json with
// its findings) and the unit enabled; an edited configuration is kept, the
// older default written beside it; an unedited one becomes the older
// default, silently. The daemon of the older package reads the state
// (tamper's TestStateOfANewerBuildWithNewFields,
// TestStateOfAHigherVersionKeepsItsFindings; report's
// TestLoadStateOfANewerBuild).
func TestDebianPackageDowngrade(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	v2, _ := newerPackage(t, v1)
	v1Default := func() string {
		b, err := os.ReadFile(filepath.Join(extract(t, v1), cfgPath))
		must(t, err)
		return string(b)
	}()
	const tamperFile = "/var/lib/autopilot-health/tamper.json"
	for _, edit := range []bool{false, true} {
		r := newDpkgRoot(t, runtime.GOARCH)
		r.dpkg("--install", v2)
		must(t, os.MkdirAll(filepath.Dir(r.path(stateFile)), 0o750))
		must(t, os.WriteFile(r.path(stateFile), []byte(`{"version":1}`+"\n"), 0o644))
		must(t, os.WriteFile(r.path(tamperFile), []byte(`{"version":1,"findings":[]}`+"\n"), 0o600))
		edited := r.read(cfgPath) + "[metrics]\nlisten_address = \"127.0.0.1:20257\"\n"
		if edit {
			must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
		}
		r.dpkg("--force-confdef", "--force-confold", "--install", v1)
		if s := r.status(); s != "install ok installed 1.0.0" {
			t.Fatalf("edited %v: after the downgrade: %q", edit, s)
		}
		for _, p := range []string{stateFile, tamperFile} {
			if !r.exists(p) {
				t.Errorf("edited %v: the downgrade deleted %s", edit, p)
			}
		}
		if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
			t.Errorf("edited %v: after the downgrade: is-enabled %q", edit, s)
		}
		switch got := r.read(cfgPath); {
		case edit && got != edited:
			t.Errorf("the downgrade did not keep the edited configuration:\n%s", got)
		case edit && (!r.exists(cfgPath+".dpkg-dist") || r.read(cfgPath+".dpkg-dist") != v1Default):
			t.Errorf("config.toml.dpkg-dist is not 1.0.0's default")
		case !edit && got != v1Default:
			t.Errorf("the unedited configuration is not 1.0.0's default:\n%s", got)
		case !edit && r.exists(cfgPath+".dpkg-dist"):
			t.Errorf("an unedited configuration left a .dpkg-dist")
		}
	}
}

// TestDebianPackageForeignArch installs and purges the package of the
// other architecture in a root that has it as a foreign architecture (an
// arm64 image built on an amd64 machine): dpkg accepts it, the unit is
// enabled, and purge leaves nothing. The postinst cannot run the binary to
// check the configuration: it says so and goes on.
func TestDebianPackageForeignArch(t *testing.T) {
	needDpkgDeb(t)
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	if other == "" {
		testenv.Skip(t, "no package for "+runtime.GOARCH)
	}
	r := newDpkgRoot(t, other)
	// Where the binary cannot run (no emulator registered for it), it
	// cannot check the configuration: installed all the same (nothing
	// starts it under dpkg --root), saying so.
	out := r.dpkg("--install", buildDeb(t, other, "1.0.0"))
	runs := exec.Command(binary(t, other), "config", "default").Run() == nil
	if want := "autopilot-health: " + r.path(cfgPath) + " not checked: "; !runs && !strings.Contains(out, want) {
		t.Errorf("dpkg's output lacks %q:\n%s", want, out)
	}
	if s := r.status(); s != "install ok installed 1.0.0" {
		t.Fatalf("after install: %q", s)
	}
	arch, _ := exec.Command("dpkg-query", "--root="+r.Dir, "-W", "-f=${Architecture}", "autopilot-health").Output()
	if string(arch) != other {
		t.Errorf("installed architecture %q, want %s", arch, other)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
		t.Errorf("is-enabled %q", s)
	}
	r.dpkg("--purge", "autopilot-health")
	if _, err := os.Lstat(r.path(wantsLink)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after purge %s: %v", wantsLink, err)
	}
	if r.exists("/etc/autopilot-health") {
		t.Error("after purge /etc/autopilot-health is still there")
	}
}

// runningSystemdRoot is a chrooted dpkg root (scripts run inside it, as
// on a node) that looks like a running systemd to the maintainer scripts:
// /run/systemd/system exists, and stand-ins for systemctl,
// deb-systemd-invoke and deb-systemd-helper log every call to /stubs.log;
// deb-systemd-invoke makes the daemon's runtime directory on start and
// restart and removes it on stop, as systemd does for its unit's
// RuntimeDirectory=.
func runningSystemdRoot(t *testing.T) *dpkgRoot {
	t.Helper()
	r := newDpkgRoot(t, runtime.GOARCH)
	r.chrooted = true
	b, err := os.ReadFile(staticBusybox(t))
	must(t, err)
	for _, d := range []string{"/bin", "/usr/bin", "/run/systemd/system", "/dev"} {
		must(t, os.MkdirAll(r.path(d), 0o755))
	}
	// The scripts send the tools' output to /dev/null.
	must(t, syscall.Mknod(r.path("/dev/null"), syscall.S_IFCHR|0o666, 1<<8|3))
	must(t, os.WriteFile(r.path("/bin/busybox"), b, 0o755))
	for _, applet := range []string{"sh", "sed", "mkdir", "rm"} {
		must(t, os.Symlink("busybox", r.path("/bin/"+applet)))
	}
	stubs := map[string]string{
		"systemctl": `echo "systemctl $*" >> /stubs.log
`,
		"deb-systemd-invoke": `echo "deb-systemd-invoke $*" >> /stubs.log
case $1 in start|restart) mkdir -p /run/autopilot-health ;; stop) rm -rf /run/autopilot-health ;; esac
`,
		"deb-systemd-helper": `echo "deb-systemd-helper $*" >> /stubs.log
`,
	}
	for name, body := range stubs {
		must(t, os.WriteFile(r.path("/usr/bin/"+name), []byte("#!/bin/sh\n"+body), 0o755))
	}
	return r
}

// runs says whether the stand-in systemd runs the daemon.
func (r *dpkgRoot) runs() bool { return r.exists("/run/autopilot-health") }

// TestDebianPackageRefusedConfigurationSaysWhetherADaemonRuns: on a node,
// a configure that the configuration check fails says what runs there. An
// upgrade of a running daemon leaves it running the previous version, and
// says so; a reinstall after a remove (the configuration kept, the daemon
// stopped and its binary gone) starts none, and must not tell the operator
// that a daemon still runs: the node has none until the file is fixed.
func TestDebianPackageRefusedConfigurationSaysWhetherADaemonRuns(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	v2, _ := newerPackage(t, v1)
	const running = "The running daemon was not restarted and keeps running the previous version (1.0.0)."

	t.Run("upgrade of a running daemon", func(t *testing.T) {
		r := runningSystemdRoot(t)
		r.dpkg("--install", v1)
		if !r.runs() {
			t.Fatalf("the install did not start the daemon: %s", r.read("/stubs.log"))
		}
		edited, problem := refusedEdit(cfgPath, r.read(cfgPath))
		must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
		out, err := r.tryDpkg("--force-confdef", "--force-confold", "--install", v2)
		if err == nil {
			t.Fatalf("the upgrade onto a refused configuration succeeded:\n%s", out)
		}
		for _, want := range []string{problem, running} {
			if !strings.Contains(out, want) {
				t.Errorf("dpkg's output lacks %q:\n%s", want, out)
			}
		}
		if !r.runs() || strings.Contains(r.read("/stubs.log"), "deb-systemd-invoke restart") {
			t.Errorf("the refused upgrade restarted or stopped the daemon: %s", r.read("/stubs.log"))
		}
	})

	t.Run("reinstall after a remove", func(t *testing.T) {
		r := runningSystemdRoot(t)
		r.dpkg("--install", v1)
		r.dpkg("--remove", "autopilot-health")
		if r.runs() {
			t.Fatalf("the remove did not stop the daemon: %s", r.read("/stubs.log"))
		}
		if r.exists("/usr/bin/autopilot-health") {
			t.Fatal("the remove left the binary")
		}
		edited, problem := refusedEdit(cfgPath, r.read(cfgPath))
		must(t, os.WriteFile(r.path(cfgPath), []byte(edited), 0o644))
		out, err := r.tryDpkg("--force-confdef", "--force-confold", "--install", v2)
		if err == nil {
			t.Fatalf("the reinstall onto a refused configuration succeeded:\n%s", out)
		}
		if !strings.Contains(out, problem) {
			t.Errorf("dpkg's output lacks %q:\n%s", problem, out)
		}
		if strings.Contains(out, "keeps running") {
			t.Errorf("dpkg says a daemon keeps running where none runs (removed, stopped):\n%s", out)
		}
		if want := "The daemon was not started; none is running on this node."; !strings.Contains(out, want) {
			t.Errorf("dpkg's output lacks %q:\n%s", want, out)
		}
		if r.runs() {
			t.Errorf("the refused reinstall started the daemon: %s", r.read("/stubs.log"))
		}
		if s := r.status(); s != "install ok half-configured 1.0.1" {
			t.Errorf("after the refused reinstall: %q", s)
		}
		must(t, os.WriteFile(r.path(cfgPath), []byte("[metrics]\nlisten_address = \"127.0.0.1:20257\"\n"), 0o644))
		r.dpkg("--configure", "-a")
		if !r.runs() {
			t.Errorf("the fixed file and dpkg --configure -a did not start the daemon: %s", r.read("/stubs.log"))
		}
	})
}
