//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// sysextWorkDir is a directory of the test's, removed when it ends (after
// the namespace it holds has stopped), named by prefix, with the daemon
// built into it as dir/autopilot-health.
func sysextWorkDir(t *testing.T, prefix string) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin = filepath.Join(dir, "autopilot-health")
	if err := harness.BuildDaemon(bin); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// bootSysextNode boots a real systemd 252 as an image-based node OS: the
// extension img in /usr/lib/extensions/autopilot-health.raw (laid over the
// host's /usr), systemd-sysext.service and the shipped
// sysext-daemon-reload.service wanted by the default target,
// multi-user.target reached at boot, the gettys masked (a getty on the
// console would take the terminal the namespace runs on), and no
// configuration file or drop-in: the unit as the image ships it, on the
// embedded defaults (an extension image has no /etc). The namespace's /dev
// is a tmpfs: LoopDevices makes the loop device nodes systemd-sysext
// attaches the image to. It returns the namespace, stopped when the test
// ends, and when its systemd was started; nothing is awaited.
func bootSysextNode(t *testing.T, dir, img string) (*harness.Systemd, time.Time) {
	t.Helper()
	usr := filepath.Join(dir, "usr")
	if err := os.MkdirAll(filepath.Join(usr, "lib", "extensions"), 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(usr, "lib", "extensions", "autopilot-health.raw"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	reloadUnit, err := harness.RepoFile("packaging/sysext/sysext-daemon-reload.service")
	if err != nil {
		t.Fatal(err)
	}
	units := map[string]string{
		"sysext-daemon-reload.service": string(reloadUnit),
		"test.target.d/10-boot.conf":   "[Unit]\nWants=systemd-sysext.service sysext-daemon-reload.service multi-user.target\n",
		"getty.target":                 "",
		"console-getty.service":        "",
	}
	start := time.Now()
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), units, harness.Options{KeepSyslog: true, SharedMounts: true, Usr: usr, LoopDevices: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, start
}

// sysextNode boots a real systemd 252 as an image-based node OS with the
// extension img in /usr/lib/extensions/autopilot-health.raw, merged at boot
// by systemd-sysext.service and reloaded by the shipped
// sysext-daemon-reload.service (as TestSysextImageMergesAndTheUnitStarts),
// and waits until the daemon, started by the image's Upholds= alone, is
// active. It returns the namespace and a runner of commands inside it.
func sysextNode(t *testing.T, dir, img string) (*harness.Systemd, func(args ...string) (string, error)) {
	t.Helper()
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	for _, tool := range []string{"mksquashfs", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing (apt install squashfs-tools util-linux)", tool)
		}
	}
	s, _ := bootSysextNode(t, dir, img)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal:\n%s", lastBytes(s.Journal("systemd-sysext.service", "autopilot-health.service", "autopilot-health-privileged.service", "autopilot-health-refused.service"), 8000))
		}
	})
	waitUnitFor(t, s, "autopilot-health.service", 90*time.Second, "autopilot-health.service active after boot", active)
	in := func(args ...string) (string, error) {
		out, err := exec.Command("nsenter", append([]string{"--target", fmt.Sprint(s.PID), "--mount", "--pid", "--root", "--wd", "--",
			"env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, args...)...).CombinedOutput()
		return string(out), err
	}
	return s, in
}

// mustIn runs a command inside the node and fails the test if it fails.
func mustIn(t *testing.T, in func(args ...string) (string, error), args ...string) string {
	t.Helper()
	out, err := in(args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestSysextUnmergedDoesNotSpin: the extension unmerged while the daemon
// runs (`systemd-sysext unmerge`, or a refresh with the image deleted, as
// README's way from the extension to the Debian package does): the binaries
// and the unit files vanish from /usr, and systemd 252 does not reload, so
// the units stay loaded, and the running daemon runs on. Killed then (a
// crash, an OOM kill), the daemon and its privileged helper are not
// restarted for ever: systemd cannot execute them (203/EXEC), and before,
// Restart=always with no start limit tried again every RestartSec (5 s, the
// helper's 1 s), a failed start and its journal lines each time, until the
// next boot. Now each unit's automatic restart finds its
// ConditionPathExists= (the binary) unmet: the unit goes inactive, no exec
// is tried, and nothing starts over a window of twice RestartSec; once the
// extension is merged again, a daemon-reload and a start bring the daemon
// back. (An exec that fails with the binary there is restarted:
// TestExecFailedWithTheBinaryThereIsRestarted.)
func TestSysextUnmergedDoesNotSpin(t *testing.T) {
	harness.Parallel(t, 1, "port20257")
	dir, bin := sysextWorkDir(t, "autopilot-health-sysext-unmerge-")
	s, in := sysextNode(t, dir, buildSysext(t, bin, filepath.Join(dir, "img")))
	ctx := context.Background()
	const unit, helper = "autopilot-health.service", "autopilot-health-privileged.service"
	// The helper runs once the first pass asked it (the kernel log).
	waitUnitFor(t, s, helper, 30*time.Second, "the helper active", active)
	before, err := s.Bus.Unit(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}

	mustIn(t, in, "systemd-sysext", "unmerge")
	for _, p := range []string{"/usr/bin/autopilot-health", "/usr/lib/autopilot-health/autopilot-health-privileged", "/usr/lib/systemd/system/autopilot-health.service"} {
		if _, err := os.Stat(s.Root(p)); !os.IsNotExist(err) {
			t.Fatalf("after the unmerge, %s: %v, want gone", p, err)
		}
	}
	// systemd 252 does not reload after an unmerge: the unit is still
	// loaded, and the daemon runs on (its binary is still mapped).
	if u, err := s.Bus.Unit(ctx, unit); err != nil || !active(u) || u.Invocation != before.Invocation {
		t.Fatalf("after the unmerge, the running daemon: %+v %v", u, err)
	}

	// A crash of each: systemd cannot execute either again.
	if err := s.KillMain(ctx, helper, 9); err != nil {
		t.Fatal(err)
	}
	if err := s.KillMain(ctx, unit, 9); err != nil {
		t.Fatal(err)
	}
	// Each automatic restart finds its binary gone: the start is skipped
	// (ConditionPathExists=), the unit inactive, and not restarted again.
	skipped := func(name string) systemd.Unit {
		t.Helper()
		var u systemd.Unit
		eventually(t, 30*time.Second, name+" inactive, its restart skipped on its unmet ConditionPathExists=", func() (bool, string) {
			var err error
			u, err = s.Bus.Unit(ctx, name)
			if err != nil {
				return false, err.Error()
			}
			up, err := s.Properties(ctx, name, "Unit")
			if err != nil {
				return false, err.Error()
			}
			sp, err := s.Properties(ctx, name, "Service")
			if err != nil {
				return false, err.Error()
			}
			cond, _ := up["ConditionResult"].Value().(bool)
			st, _ := sp["ExecMainStatus"].Value().(int32)
			if u.ActiveState == "failed" && st == 203 {
				t.Fatalf("%s failed with status 203/EXEC: its restart tried to execute a binary that is gone", name)
			}
			return u.ActiveState == "inactive" && u.NRestarts >= 1 && !cond, fmt.Sprintf("%s/%s result %s status %d NRestarts %d ConditionResult %v", u.ActiveState, u.SubState, u.Result, st, u.NRestarts, cond)
		})
		return u
	}
	d0, h0 := skipped(unit), skipped(helper)
	t.Logf("after the crash: %s %s/%s NRestarts=%d; %s %s/%s NRestarts=%d", unit, d0.ActiveState, d0.Result, d0.NRestarts, helper, h0.ActiveState, h0.Result, h0.NRestarts)
	// The window: twice the daemon's RestartSec (5 s), ten times the
	// helper's (1 s); nothing is to happen, so a window of time is the
	// measure.
	time.Sleep(10 * time.Second)
	for _, w := range []struct {
		name string
		then systemd.Unit
	}{{unit, d0}, {helper, h0}} {
		u, err := s.Bus.Unit(ctx, w.name)
		if err != nil {
			t.Fatal(err)
		}
		if u.ActiveState != "inactive" || u.NRestarts != w.then.NRestarts || u.Invocation != w.then.Invocation {
			t.Errorf("%s over 10 s after its binary went: %s/%s, NRestarts %d -> %d, invocation %s -> %s: it spins",
				w.name, u.ActiveState, u.SubState, w.then.NRestarts, u.NRestarts, w.then.Invocation, u.Invocation)
		}
	}
	for _, name := range []string{"autopilot-health.path", "autopilot-health-privileged.socket"} {
		u, err := s.Bus.Unit(ctx, name)
		t.Logf("after the window, %s: %s/%s %v", name, u.ActiveState, u.SubState, err)
	}
	// PID 1's lines (to the console here, to the journal on a node): no
	// execution tried, whoever started the unit (a restart, the path unit,
	// the image's Upholds=).
	console, err := os.ReadFile(filepath.Join(s.Dir, "logs", "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{unit, helper} {
		if n := strings.Count(string(console), name+": Main process exited, code=exited, status=203/EXEC"); n != 0 {
			t.Errorf("%s: systemd tried to execute its gone binary %d times, want none; PID 1's lines of the units:\n%s", name, n, unitLines(string(console)))
		}
	}
	t.Logf("PID 1's lines of the units:\n%s", lastBytes(unitLines(string(console)), 2500))

	// Merged again: a reload and a start, as README says.
	mustIn(t, in, "systemd-sysext", "merge")
	mustIn(t, in, "systemctl", "daemon-reload")
	mustIn(t, in, "systemctl", "start", unit)
	waitUnitFor(t, s, unit, 2*time.Minute, "the daemon active again after the merge, a reload and a start", active)
	// The units PartOf= the daemon, stopped with its skipped restart, are
	// started with it (its Wants=).
	for _, name := range []string{"autopilot-health.path", "autopilot-health-privileged.socket"} {
		if u, err := s.Bus.Unit(ctx, name); err != nil || u.ActiveState != "active" {
			t.Errorf("after the merge, a reload and a start, %s: %+v %v", name, u, err)
		}
	}
}

// TestSysextRefreshToANewerImage: an upgrade by image swap, a newer image
// under the same name in a directory searched first (/run/extensions over
// /usr/lib/extensions) and `systemd-sysext refresh` while the daemon runs.
// systemd 252 neither reloads nor restarts anything: /usr has the new
// binary, and the daemon that runs is the old one, the same invocation,
// until it is restarted (README: "As a system extension"); a daemon-reload
// and a restart run the new one. Then an image whose file name is not its
// extension-release's (autopilot-health_1.2.5_x86-64.raw, its
// extension-release.autopilot-health): systemd-sysext 252 refuses the
// refresh, exit 1, with one line naming the image, and /usr keeps what it
// had (at boot, systemd-sysext.service runs the same refresh and fails).
func TestSysextRefreshToANewerImage(t *testing.T) {
	harness.Parallel(t, 1, "port20257")
	dir, bin := sysextWorkDir(t, "autopilot-health-sysext-refresh-")
	// The newer binary: the same program with bytes after its end (the
	// kernel loads the ELF's segments only), so that which one runs shows
	// in its digest.
	v2 := filepath.Join(dir, "v2", "autopilot-health")
	if err := os.MkdirAll(filepath.Dir(v2), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v2, append(b, "autopilot-health 1.2.4"...), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", filepath.Join(dir, "autopilot-health-privileged"), filepath.Dir(v2)).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	img1 := buildSysext(t, bin, filepath.Join(dir, "img1"))
	img2 := buildSysextVersion(t, v2, filepath.Join(dir, "img2"), "1.2.4")
	sum1, sum2 := fileSHA(t, bin), fileSHA(t, v2)
	s, in := sysextNode(t, dir, img1)
	ctx := context.Background()
	const unit = "autopilot-health.service"
	running := func() (systemd.Unit, [32]byte) {
		t.Helper()
		u, err := s.Bus.Unit(ctx, unit)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := s.Properties(ctx, unit, "Service")
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := sp["MainPID"].Value().(uint32)
		return u, fileSHA(t, s.Root(fmt.Sprintf("/proc/%d/exe", pid)))
	}
	before, exe := running()
	if exe != sum1 {
		t.Fatalf("the daemon at boot does not run the image's binary")
	}

	put := func(name, img string) {
		t.Helper()
		raw, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(s.Root("/run/extensions"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.Root("/run/extensions/"+name), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("autopilot-health.raw", img2)
	out := mustIn(t, in, "systemd-sysext", "refresh")
	t.Logf("systemd-sysext refresh:\n%s", out)
	if fileSHA(t, s.Root("/usr/bin/autopilot-health")) != sum2 {
		t.Fatalf("after the refresh, /usr/bin/autopilot-health is not the newer image's")
	}
	if rel, err := os.ReadFile(s.Root("/usr/lib/extension-release.d/extension-release.autopilot-health")); err != nil || !strings.Contains(string(rel), "SYSEXT_VERSION_ID=1.2.4") {
		t.Fatalf("after the refresh, the extension-release: %q %v", rel, err)
	}
	// Nothing restarted the daemon: the older binary runs on.
	after, exe := running()
	if !active(after) || after.Invocation != before.Invocation || exe != sum1 {
		t.Errorf("after the refresh: %s/%s, invocation %s (before %s), runs the older binary %v; want the same invocation of the older binary running",
			after.ActiveState, after.SubState, after.Invocation, before.Invocation, exe == sum1)
	}
	// README's upgrade: reload, then restart.
	mustIn(t, in, "systemctl", "daemon-reload")
	mustIn(t, in, "systemctl", "restart", unit)
	waitUnitFor(t, s, unit, 2*time.Minute, "the daemon active after the restart", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != before.Invocation
	})
	if _, exe := running(); exe != sum2 {
		t.Errorf("after the daemon-reload and the restart, the daemon does not run the newer image's binary")
	}

	// Renamed: systemd-sysext 252 refuses the whole refresh (exit 1, every
	// extension, not only this one), with one line naming the image, and
	// /usr keeps what it had.
	put("autopilot-health_1.2.5_x86-64.raw", img1)
	out, err = in("systemd-sysext", "refresh")
	t.Logf("systemd-sysext refresh with a renamed image (%v):\n%s", err, out)
	if err == nil || !strings.Contains(out, "Failed to read metadata for image autopilot-health_1.2.5_x86-64: No medium found") {
		t.Errorf("systemd-sysext refresh with a renamed image: %v, want exit 1 and the line naming it:\n%s", err, out)
	}
	if fileSHA(t, s.Root("/usr/bin/autopilot-health")) != sum2 {
		t.Errorf("after the refused refresh, /usr/bin/autopilot-health is not the one merged before")
	}
	if rel, err := os.ReadFile(s.Root("/usr/lib/extension-release.d/extension-release.autopilot-health")); err != nil || !strings.Contains(string(rel), "SYSEXT_VERSION_ID=1.2.4") {
		t.Errorf("after the refused refresh, the extension-release: %q %v", rel, err)
	}
	if u, _ := running(); !active(u) {
		t.Errorf("after the refused refresh, the daemon: %s/%s", u.ActiveState, u.SubState)
	}
	// At boot: systemd-sysext.service's merge refuses it the same way, and
	// merges nothing.
	mustIn(t, in, "systemd-sysext", "unmerge")
	out, err = in("systemd-sysext", "merge")
	t.Logf("systemd-sysext merge with a renamed image (%v):\n%s", err, out)
	if err == nil || !strings.Contains(out, "Failed to read metadata for image autopilot-health_1.2.5_x86-64: No medium found") {
		t.Errorf("systemd-sysext merge with a renamed image: %v, want exit 1 and the line naming it:\n%s", err, out)
	}
	if _, err := os.Stat(s.Root("/usr/bin/autopilot-health")); !os.IsNotExist(err) {
		t.Errorf("after the refused merge, /usr/bin/autopilot-health: %v, want none merged", err)
	}
	list, _ := in("systemd-sysext", "list")
	t.Logf("systemd-sysext list:\n%s", list)
}

// unitLines are the lines of console that name the daemon's units.
func unitLines(console string) string {
	var out []string
	for _, l := range strings.Split(console, "\n") {
		if strings.Contains(l, "autopilot-health") && !strings.Contains(l, "level=") {
			out = append(out, l)
		}
	}
	return lastBytes(strings.Join(out, "\n"), 6000)
}

// TestExecFailedWithTheBinaryThereIsRestarted: an exec of the daemon or of
// its helper that fails while the binary is there (status=203/EXEC) is
// restarted every RestartSec, and the unit comes back on its own once the
// exec works again. On a node that is an execve failing for want of memory
// or processes (an OOM kill, then its restart's exec fails): at 5a35bc1
// (RestartPreventExitStatus=2 203, for a binary gone with its system
// extension) the unit then stayed failed, and the node had no health daemon
// until someone started it. The binary gone is TestSysextUnmergedDoesNotSpin
// (ConditionPathExists=). ENOMEM cannot be made on purpose; two execs that
// fail with the file present stand for it: a script whose interpreter is
// not there (execve: ENOENT, the errno of a binary gone), and a file without
// its execute bit (EACCES). The shipped units and binaries under a writable
// /usr, a real systemd 252.
func TestExecFailedWithTheBinaryThereIsRestarted(t *testing.T) {
	harness.Parallel(t, 1, "port20257")
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	dir, err := os.MkdirTemp("", "autopilot-health-execfail-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), map[string]string{"getty.target": "", "console-getty.service": ""},
		harness.Options{KeepSyslog: true, UsrWritable: filepath.Join(dir, "usr-rw")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	const unit, helper = "autopilot-health.service", "autopilot-health-privileged.service"
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("PID 1's lines of the units:\n%s\n%s", unitLines(s.Console(1<<20)), lastBytes(s.Journal(unit, helper), 6000))
		}
	})
	if err := harness.InstallDaemon(s.Root("/usr")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	waitUnitFor(t, s, unit, 2*time.Minute, "the daemon active", active)
	// The helper runs once the first pass asked it (the kernel log).
	waitUnitFor(t, s, helper, 30*time.Second, "the helper active", active)
	bins := map[string]string{unit: s.Root("/usr/bin/autopilot-health"), helper: s.Root("/usr/lib/autopilot-health/autopilot-health-privileged")}

	for _, c := range []struct {
		what         string
		break_, mend func(bin string) error
	}{
		{"its interpreter is not there",
			func(bin string) error {
				if err := os.Rename(bin, bin+".good"); err != nil {
					return err
				}
				return os.WriteFile(bin, []byte("#!/nonexistent\n"), 0o755)
			},
			func(bin string) error { return os.Rename(bin+".good", bin) }},
		{"it has no execute bit",
			func(bin string) error { return os.Chmod(bin, 0o644) },
			func(bin string) error { return os.Chmod(bin, 0o755) }},
	} {
		then := map[string]systemd.Unit{}
		for name, bin := range bins {
			u, err := s.Bus.Unit(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			then[name] = u
			if err := c.break_(bin); err != nil {
				t.Fatal(err)
			}
		}
		for name := range bins {
			if err := s.KillMain(ctx, name, 9); err != nil {
				t.Fatal(err)
			}
		}
		// Restarted after a failed exec: a restart scheduled again (the
		// second since the kill) with the last exit 203/EXEC.
		for name := range bins {
			eventually(t, 30*time.Second, name+" restarted after an exec that failed because "+c.what, func() (bool, string) {
				u, err := s.Bus.Unit(ctx, name)
				if err != nil {
					return false, err.Error()
				}
				sp, err := s.Properties(ctx, name, "Service")
				if err != nil {
					return false, err.Error()
				}
				st, _ := sp["ExecMainStatus"].Value().(int32)
				if u.ActiveState == "failed" && st == 203 {
					t.Fatalf("%s failed with status 203/EXEC (%s) and is not restarted: %s/%s result %s NRestarts %d", name, c.what, u.ActiveState, u.SubState, u.Result, u.NRestarts)
				}
				return st == 203 && u.NRestarts >= then[name].NRestarts+2, fmt.Sprintf("%s/%s result %s status %d NRestarts %d (before the kill %d)", u.ActiveState, u.SubState, u.Result, st, u.NRestarts, then[name].NRestarts)
			})
		}
		mended := time.Now()
		for _, bin := range bins {
			if err := c.mend(bin); err != nil {
				t.Fatal(err)
			}
		}
		for name := range bins {
			u := waitUnitFor(t, s, name, time.Minute, name+" back on its own once its exec works again ("+c.what+")", func(u systemd.Unit) bool {
				return active(u) && u.Invocation != then[name].Invocation
			})
			t.Logf("%s (%s): active again %.1f s after the exec could work, NRestarts %d", name, c.what, time.Since(mended).Seconds(), u.NRestarts)
		}
	}
}
