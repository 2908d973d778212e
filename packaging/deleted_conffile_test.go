package packaging

import (
	"os"
	"runtime"
	"testing"
)

// TestDebianPackageKeepsADeletedConfiguration: an operator who deleted
// config.toml (the daemon then runs on its embedded defaults, README
// "Installing it in the OS image") keeps it deleted through an upgrade
// whose default changed (apt's unattended --force-confdef --force-confold)
// and through a remove and a reinstall: dpkg holds a deleted conffile as the
// operator's edit.
func TestDebianPackageKeepsADeletedConfiguration(t *testing.T) {
	needDpkgDeb(t)
	hostBinary(t)
	v1 := buildDeb(t, runtime.GOARCH, "1.0.0")
	v2, _ := newerPackage(t, v1)
	r := newDpkgRoot(t, runtime.GOARCH)
	r.dpkg("--install", v1)
	must(t, os.Remove(r.path(cfgPath)))
	r.dpkg("--force-confdef", "--force-confold", "--install", v2)
	if s := r.status(); s != "install ok installed 1.0.1" {
		t.Fatalf("after the upgrade: %q", s)
	}
	if r.exists(cfgPath) {
		t.Errorf("the upgrade wrote %s again:\n%s", cfgPath, r.read(cfgPath))
	}
	// The new default is beside it, as beside an edited one.
	if !r.exists(cfgPath + ".dpkg-dist") {
		t.Errorf("the upgrade left no %s.dpkg-dist", cfgPath)
	}
	r.dpkg("--remove", "autopilot-health")
	r.dpkg("--force-confdef", "--force-confold", "--install", v2)
	if r.exists(cfgPath) {
		t.Errorf("the reinstall after a remove wrote %s again", cfgPath)
	}
	if s := r.systemctl("is-enabled", "autopilot-health.service"); s != "enabled" {
		t.Errorf("after the reinstall: is-enabled %q", s)
	}
}
