// Package packaging holds the Debian package of the daemon (deb/build.sh);
// this test builds it and checks what an OS image gets.
package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

func TestDebianPackage(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		testenv.Skip(t, "dpkg-deb not installed")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "autopilot-health")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/autopilot-health").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command("bash", "deb/build.sh", bin, dir, "1.2.3").CombinedOutput()
	if err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	deb := strings.TrimSpace(string(out))
	list, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"./usr/bin/autopilot-health", "./lib/systemd/system/autopilot-health.service",
		"./lib/systemd/system-preset/80-autopilot-health.preset", "./etc/autopilot-health/config.toml"} {
		if !strings.Contains(string(list), p) {
			t.Errorf("package lacks %s:\n%s", p, list)
		}
	}
	x := filepath.Join(dir, "x")
	if out, err := exec.Command("dpkg-deb", "-R", deb, x).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "conffiles")); string(b) != "/etc/autopilot-health/config.toml\n" {
		t.Errorf("conffiles %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "control")); !strings.Contains(string(b), "Version: 1.2.3\n") {
		t.Errorf("control:\n%s", b)
	}
	// The shipped config is valid and, all commented out, means the defaults.
	cfg := filepath.Join(x, "etc", "autopilot-health", "config.toml")
	if out, err := exec.Command(bin, "config", "validate", cfg).CombinedOutput(); err != nil {
		t.Errorf("shipped config does not validate: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(cfg)
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			t.Errorf("uncommented line in the shipped config: %q", line)
		}
	}
}
