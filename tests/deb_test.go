//go:build integration

package tests

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// TestDebianPackageUnderSystemd: the package's life on a running system, a
// real systemd 252 as PID 1 with a writable /usr and a copy of this
// machine's dpkg database, dpkg run inside (packaging/ tests the same in a
// dpkg --root without systemd, as an image build):
//   - install: the postinst enables the unit (deb-systemd-helper) and starts
//     it (deb-systemd-invoke); the daemon runs on the shipped configuration
//     (metrics on :20257);
//   - upgrade with an edited configuration: the daemon is restarted (a new
//     invocation) and runs on the edit (metrics on the port the edit names);
//   - remove: the daemon is stopped; configuration and state kept;
//   - purge: configuration, state and the enable symlink gone;
//   - install where policy-rc.d denies starts (an image build in a
//     container): enabled, not started.
func TestDebianPackageUnderSystemd(t *testing.T) {
	harness.Parallel(t, 1, "port20257")
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	for _, p := range []string{"dpkg", "dpkg-deb", "deb-systemd-helper", "nsenter"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s missing (apt install dpkg init-system-helpers util-linux)", p)
		}
	}
	// The shipped configuration listens on :20257 (this network namespace).
	if l, err := net.Listen("tcp", ":20257"); err != nil {
		t.Fatalf("port 20257, the shipped metrics port, is taken on this machine: %v", err)
	} else {
		l.Close()
	}
	dir, err := os.MkdirTemp("", "autopilot-health-deb-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)

	bin := filepath.Join(dir, "autopilot-health")
	if err := harness.BuildDaemon(bin); err != nil {
		t.Fatal(err)
	}
	// The three packages are built at once: each is xz at one thread (about
	// 20 s of CPU), and one after the other they were most of this test.
	versions := []string{"1.0.0", "1.0.1", "1.0.2"}
	built := make([]string, len(versions))
	errs := make([]error, len(versions))
	script := filepath.Join(repoDir(t), "packaging", "deb", "build.sh")
	var wg sync.WaitGroup
	for i, v := range versions {
		wg.Go(func() {
			out, err := exec.Command("bash", script, bin, filepath.Join(dir, v), v).Output()
			built[i], errs[i] = strings.TrimSpace(string(out)), err
		})
	}
	wg.Wait()
	debs := map[string]string{}
	for i, v := range versions {
		if errs[i] != nil {
			t.Fatalf("build.sh %s: %v", v, errs[i])
		}
		debs[v] = built[i]
	}

	s, err := harness.StartSystemdWith(dir, nil, harness.Options{KeepSyslog: true, Data: dataDir(t), UsrWritable: filepath.Join(dir, "usr-rw")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	defer func() {
		if t.Failed() {
			t.Logf("journal of the namespace:\n%s", lastBytes(s.Journal("autopilot-health.service"), 20000))
			t.Logf("console of its PID 1:\n%s", s.Console(4000))
		}
	}()
	ctx := context.Background()
	if err := s.StartUnit(ctx, "systemd-journald.service"); err != nil {
		t.Fatalf("starting journald: %v", err)
	}
	// dpkg's database: this machine's (the host's /usr is the lower layer
	// of the one inside, so what it lists is there).
	if out, err := exec.Command("cp", "-a", "/var/lib/dpkg", s.Root("/var/lib/")).CombinedOutput(); err != nil {
		t.Fatalf("copying the dpkg database: %v\n%s", err, out)
	}
	dpkgOut := func(args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("nsenter", append([]string{"--target", fmt.Sprint(s.PID), "--mount", "--pid", "--root", "--wd", "--",
			"env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "dpkg", "--log=/dev/null"}, args...)...)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("dpkg %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		return string(out), err
	}
	dpkg := func(args ...string) {
		t.Helper()
		if out, err := dpkgOut(args...); err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	dpkgStatus := func() string {
		out, err := exec.Command("nsenter", "--target", fmt.Sprint(s.PID), "--mount", "--pid", "--root", "--wd", "--",
			"dpkg-query", "-W", "-f=${Status} ${Version}", "autopilot-health").CombinedOutput()
		if err != nil {
			return fmt.Sprintf("dpkg-query: %v: %s", err, out)
		}
		return string(out)
	}
	deb := func(v string) string {
		b, err := os.ReadFile(debs[v])
		if err != nil {
			t.Fatal(err)
		}
		p := "/tmp/autopilot-health_" + v + ".deb"
		if err := os.WriteFile(s.Root(p), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unitFileState := func() string {
		props, err := s.Properties(ctx, "autopilot-health.service", "Unit")
		if err != nil {
			return err.Error()
		}
		st, _ := props["UnitFileState"].Value().(string)
		return st
	}
	metricsAt := func(addr string) (bool, string) {
		body, err := httpGet("http://" + addr + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(body, "autopilot_health_"), lastBytes(body, 200)
	}
	const (
		unit = "autopilot-health.service"
		cfg  = "/etc/autopilot-health/config.toml"
		sf   = "/var/lib/autopilot-health/state.json"
		want = "/etc/systemd/system/multi-user.target.wants/autopilot-health.service"
	)

	// A policy-rc.d that denies every start (Debian's container images ship
	// one) is this machine's, not the system's inside: gone from its /usr.
	policy := s.Root("/usr/sbin/policy-rc.d")
	if err := os.Remove(policy); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}

	// Install: enabled and started, on the shipped configuration.
	dpkg("--install", deb("1.0.0"))
	u1 := waitUnit(t, s, unit, "started by the postinst", active)
	if st := unitFileState(); st != "enabled" {
		t.Errorf("after install: UnitFileState %q", st)
	}
	// deb-systemd-helper names the unit by /lib, the same file on merged /usr.
	if dest, err := os.Readlink(s.Root(want)); err != nil || (dest != "/usr/lib/systemd/system/autopilot-health.service" && dest != "/lib/systemd/system/autopilot-health.service") {
		t.Errorf("after install: %s -> %q (%v)", want, dest, err)
	}
	eventually(t, 30*time.Second, "metrics on :20257 (the shipped configuration)", func() (bool, string) { return metricsAt("127.0.0.1:20257") })
	eventually(t, 60*time.Second, "the daemon's state file", func() (bool, string) {
		_, err := os.Stat(s.Root(sf))
		return err == nil, fmt.Sprint(err)
	})

	// Upgrade with an edited configuration: restarted, runs on the edit.
	port := freeTCPPort(t)
	shipped, err := os.ReadFile(s.Root(cfg))
	if err != nil {
		t.Fatal(err)
	}
	edited := string(shipped) + fmt.Sprintf("\n# edited by the operator\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n", port)
	if err := os.WriteFile(s.Root(cfg), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	dpkg("--force-confdef", "--force-confold", "--install", deb("1.0.1"))
	u2 := waitUnit(t, s, unit, "restarted by the postinst", func(u systemd.Unit) bool { return active(u) && u.Invocation != u1.Invocation })
	t.Logf("invocation %s before the upgrade, %s after", u1.Invocation, u2.Invocation)
	if b, _ := os.ReadFile(s.Root(cfg)); string(b) != edited {
		t.Errorf("the upgrade did not keep the edited configuration:\n%s", b)
	}
	eventually(t, 30*time.Second, fmt.Sprintf("metrics on :%d (the edited configuration)", port), func() (bool, string) {
		return metricsAt(fmt.Sprintf("127.0.0.1:%d", port))
	})
	if ok, _ := metricsAt("127.0.0.1:20257"); ok {
		t.Error("after the upgrade the daemon still serves :20257: not running on the edited configuration")
	}

	// An upgrade onto an edited configuration the new version refuses: the
	// postinst checks it with the new binary first, fails configure with
	// the validator's file:line: key, and leaves the running daemon alone
	// (before, it restarted it onto the refused file, and the node had no
	// health daemon). Fixed, `dpkg --configure -a` restarts it.
	refused := edited + "[checks.ServiceNotRecovering]\nrestart_threshold = 1000\n"
	if err := os.WriteFile(s.Root(cfg), []byte(refused), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := dpkgOut("--force-confdef", "--force-confold", "--install", deb("1.0.2"))
	if err == nil {
		t.Errorf("the upgrade onto a refused configuration succeeded:\n%s", out)
	}
	for _, w := range []string{
		cfg + ":", "key checks.ServiceNotRecovering.restart_threshold: must be between 1 and 100, got 1000",
		"The running daemon was not restarted and keeps running the previous version (1.0.1).",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("dpkg's output lacks %q:\n%s", w, out)
		}
	}
	if st := dpkgStatus(); st != "install ok half-configured 1.0.2" {
		t.Errorf("after the refused upgrade: %q, want install ok half-configured 1.0.2", st)
	}
	if u, err := s.Bus.Unit(ctx, unit); err != nil || !active(u) || u.Invocation != u2.Invocation {
		t.Errorf("after the refused upgrade the daemon is not the one running before: %+v (%v), want invocation %s active", u, err, u2.Invocation)
	}
	if ok, body := metricsAt(fmt.Sprintf("127.0.0.1:%d", port)); !ok {
		t.Errorf("after the refused upgrade no metrics on :%d: %s", port, body)
	}
	if err := os.WriteFile(s.Root(cfg), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	dpkg("--configure", "-a")
	u3 := waitUnit(t, s, unit, "restarted by the postinst once the file was fixed", func(u systemd.Unit) bool { return active(u) && u.Invocation != u2.Invocation })
	if st := dpkgStatus(); st != "install ok installed 1.0.2" {
		t.Errorf("after the fix: %q, want install ok installed 1.0.2", st)
	}
	t.Logf("invocation %s after the fix", u3.Invocation)
	eventually(t, 30*time.Second, fmt.Sprintf("metrics on :%d after the fix", port), func() (bool, string) {
		return metricsAt(fmt.Sprintf("127.0.0.1:%d", port))
	})

	// Remove: stopped; configuration and state kept.
	dpkg("--remove", "autopilot-health")
	waitUnit(t, s, unit, "stopped by the prerm", func(u systemd.Unit) bool { return u.ActiveState == "inactive" })
	for _, p := range []string{cfg, sf} {
		if _, err := os.Stat(s.Root(p)); err != nil {
			t.Errorf("after remove: %v", err)
		}
	}
	if _, err := os.Stat(s.Root("/usr/bin/autopilot-health")); err == nil {
		t.Error("after remove /usr/bin/autopilot-health is still there")
	}

	// Purge: nothing left.
	dpkg("--purge", "autopilot-health")
	for _, p := range []string{"/etc/autopilot-health", "/var/lib/autopilot-health", want} {
		if _, err := os.Lstat(s.Root(p)); err == nil {
			t.Errorf("after purge %s is still there", p)
		}
	}
	if u, err := s.Bus.Unit(ctx, unit); err == nil && u.ActiveState != "inactive" {
		t.Errorf("after purge: %+v", u)
	}

	// Where policy-rc.d forbids starting services (an image build in a
	// container), the install enables the unit and does not start it.
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dpkg("--install", deb("1.0.0"))
	if st := unitFileState(); st != "enabled" {
		t.Errorf("install under policy-rc.d 101: UnitFileState %q", st)
	}
	if u, err := s.Bus.Unit(ctx, unit); err != nil || u.ActiveState != "inactive" || u.Invocation != "" {
		t.Errorf("install under policy-rc.d 101 started the daemon: %+v (%v)", u, err)
	}
}
