//go:build integration

package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// buildSysext builds the daemon and its sysext image with
// packaging/sysext/build.sh, as `make sysext` does, and returns the image.
func buildSysext(t *testing.T, bin, out string) string {
	t.Helper()
	return buildSysextVersion(t, bin, out, "1.2.3")
}

// buildSysextVersion is buildSysext with the image's SYSEXT_VERSION_ID.
func buildSysextVersion(t *testing.T, bin, out, version string) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(repoDir(t), "packaging", "sysext", "build.sh"), bin, out, version)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("packaging/sysext/build.sh: %v\n%s", err, b)
	}
	return strings.TrimSpace(string(b))
}

func fileSHA(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// The systemd-sysext image as an image-based node OS gets it: systemd's own
// systemd-dissect recognises it as a system extension, two builds of the
// same binary are the same bytes, and in a real systemd 252 the real
// systemd-sysext.service merges it, a daemon reload finds the unit, and the
// unit starts the binary from the image.
func TestSysextImageMergesAndTheUnitStarts(t *testing.T) {
	harness.Parallel(t, 1, "port20257")
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	for _, tool := range []string{"mksquashfs", "systemd-dissect"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing (apt install squashfs-tools systemd-container)", tool)
		}
	}
	dir, bin := sysextWorkDir(t, "autopilot-health-sysext-")
	img := buildSysext(t, bin, filepath.Join(dir, "a"))
	if again := buildSysext(t, bin, filepath.Join(dir, "b")); fileSHA(t, img) != fileSHA(t, again) {
		t.Errorf("two builds of the same binary differ: not reproducible")
	}
	out, err := exec.Command("systemd-dissect", img).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-dissect: %v\n%s", err, out)
	}
	for _, want := range []string{"✓ extension for system", "ID=_any", "SYSEXT_VERSION_ID=1.2.3", "squashfs"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("systemd-dissect does not say %q:\n%s", want, out)
		}
	}

	// The node OS image: the extension in /usr/lib/extensions (laid over
	// the host's /usr), systemd-sysext.service and the shipped
	// sysext-daemon-reload.service enabled (wanted by the default target),
	// and multi-user.target reached at boot. Nothing starts the daemon
	// but what the image ships.
	s, start := bootSysextNode(t, dir, img)
	defer func() {
		if t.Failed() {
			t.Logf("journal:\n%s", lastBytes(s.Journal("systemd-sysext.service", "sysext-daemon-reload.service", "autopilot-health.service"), 10000))
			t.Logf("console:\n%s", s.Console(6000))
		}
	}()
	ctx := context.Background()
	// No StartUnit: the boot alone brings the daemon up.
	eventually(t, 60*time.Second, "autopilot-health.service active after boot", func() (bool, string) {
		u, err := s.Bus.Unit(ctx, "autopilot-health.service")
		return err == nil && active(u), fmt.Sprintf("%+v %v", u, err)
	})
	t.Logf("autopilot-health.service from the sysext image active %s after systemd started", time.Since(start).Round(time.Millisecond))
	rel, err := os.ReadFile(s.Root("/usr/lib/extension-release.d/extension-release.autopilot-health"))
	if err != nil || !bytes.Contains(rel, []byte("ID=_any")) {
		t.Fatalf("after the merge, the extension-release file: %q %v", rel, err)
	}
	merged, err := os.ReadFile(s.Root("/usr/bin/autopilot-health"))
	if err != nil || sha256.Sum256(merged) != fileSHA(t, bin) {
		t.Fatalf("after the merge, /usr/bin/autopilot-health is not the built binary (%v)", err)
	}
	up, err := s.Properties(ctx, "autopilot-health.service", "Unit")
	if err != nil {
		t.Fatal(err)
	}
	// The host has no such unit: it is the image's (systemd names it by
	// its /lib path, /lib being a link to /usr/lib).
	if fp := up["FragmentPath"].Value(); fp != "/usr/lib/systemd/system/autopilot-health.service" && fp != "/lib/systemd/system/autopilot-health.service" {
		t.Errorf("unit loaded from %v, want the image's /usr/lib/systemd/system", fp)
	}
	// The default metrics address, :20257.
	page, err := httpGet("http://127.0.0.1:20257/metrics")
	if err != nil || !strings.Contains(page, `autopilot_health_build_info{`) {
		t.Errorf("the daemon's metrics: %v\n%.300s", err, page)
	}
	// Logged at the start; through journald's stream, which the unit's
	// READY=1 does not wait for: awaited (10 s), not read at once.
	var j string
	eventually(t, 10*time.Second, "the daemon's line saying it runs on the embedded defaults", func() (bool, string) {
		j = s.Journal("autopilot-health.service")
		return strings.Contains(j, "embedded defaults; /etc/autopilot-health/config.toml absent"), lastBytes(j, 500)
	})
	// run's one P (README, Cost: "One P"), as shipped: the unit sets no
	// GOMAXPROCS.
	if !strings.Contains(j, "gomaxprocs=1") {
		t.Errorf("the daemon does not run on one P:\n%s", lastBytes(j, 3000))
	}
}
