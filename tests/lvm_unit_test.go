//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// lvmUnitConfig: the defaults (lvm_command /usr/sbin/lvm) but for a
// loopback metrics port, an API server that is down, and no repairs of
// units this namespace does not have.
const lvmUnitConfig = `# written by tests/lvm_unit_test.go
role = "worker"
gpu = "false"

[metrics]
listen_address = "127.0.0.1:%[1]d"

[runner]
first_run_spread = "0s"

[checks.KubeletUnhealthy]
enabled = false

[checks.ContainerRuntimeUnhealthy]
enabled = false

[kubernetes]
kubeconfig = "/etc/autopilot-health/kubeconfig"
`

// The LVM part of DiskUsageHigh through the packaged unit's sandbox
// (DevicePolicy=closed, ProtectSystem=strict): a volume group made on the
// host on a loop device is reported by name, with its size, by the daemon
// running under its own unit (the status socket's evidence). Without
// DeviceAllow=block-* r, lvm cannot open the loop device and reports no
// volume group: the unit without it failed this test with
// storage.volumeGroups [] and no error. lvm needs no udev setting: with no
// udev in the namespace (no /run/udev/control) it scans /dev itself. (This
// machine's kernel has no device-mapper: no logical volume is activated, so
// /dev/mapper/control and thin pool use are not exercised here.)
func TestLVMUnderTheUnit(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	for _, p := range []string{"/usr/sbin/lvm", "/usr/sbin/losetup"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing (apt install lvm2 mount)", p)
		}
	}
	dir, err := os.MkdirTemp("", "autopilot-health-lvm-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	// A volume group on a loop device of the host (the namespace's
	// /dev/loopN nodes are the same devices).
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	img := filepath.Join(dir, "pv.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	loop := run("losetup", "--find", "--show", img)
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	vg := "aph" + strings.ReplaceAll(harness.Token(), "-", "")
	run("pvcreate", "-q", loop)
	t.Cleanup(func() { exec.Command("pvremove", "-q", "-ff", "-y", loop).Run() })
	run("vgcreate", "-q", vg, loop)
	t.Cleanup(func() { exec.Command("vgremove", "-q", "-f", vg).Run() })

	usr := filepath.Join(dir, "usr")
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(usr, "bin", "autopilot-health")
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), nil, harness.Options{KeepSyslog: true, Usr: usr, LoopDevices: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	defer func() {
		if t.Failed() {
			t.Logf("journal of the namespace:\n%s", lastBytes(s.Journal("autopilot-health.service"), 8000))
		}
	}()
	if err := writeFile(s.Root("/etc/autopilot-health/config.toml"), fmt.Appendf(nil, lvmUnitConfig, freeTCPPort(t))); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(s.Root("/etc/autopilot-health/kubeconfig"), fmt.Appendf(nil, deadAPIKubeconfig, freeTCPPort(t))); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.StartUnit(ctx, "systemd-journald.service"); err != nil {
		t.Fatalf("starting journald: %v", err)
	}
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("starting autopilot-health.service: %v", err)
	}

	sock := s.Root("/run/autopilot-health/status.sock")
	var last string
	eventually(t, 30*time.Second, "DiskUsageHigh evidence naming volume group "+vg, func() (bool, string) {
		out, _ := exec.Command(bin, "status", "--json", "--socket", sock).Output()
		var st daemon.StatusReport
		if err := json.Unmarshal(out, &st); err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		for _, c := range st.Conditions {
			if c.Type != "DiskUsageHigh" {
				continue
			}
			b, _ := json.Marshal(c)
			last = string(b)
			if c.Status == report.StatusUnknown || strings.Contains(c.Message, "not checked") {
				return false, last
			}
			raw, _ := json.Marshal(c.Evidence["storage.volumeGroups"])
			var vgs []struct {
				Name             string `json:"name"`
				SizeBytes        uint64 `json:"sizeBytes"`
				AllocatedPercent int    `json:"allocatedPercent"`
			}
			json.Unmarshal(raw, &vgs)
			for _, g := range vgs {
				// 64 MiB less LVM's metadata area: 15 extents of 4 MiB.
				if g.Name == vg && g.SizeBytes == 15<<22 && g.AllocatedPercent == 0 {
					return true, last
				}
			}
			return false, last
		}
		return false, string(out)
	})
	t.Logf("DiskUsageHigh under the unit: %s", last)
}

func writeFile(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}
