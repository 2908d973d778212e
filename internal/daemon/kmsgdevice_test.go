package daemon

import (
	"net"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// A kmsg.device that does not exist does not stop the daemon: it starts,
// and the kernel log monitor's conditions are Unknown (CheckFailed) naming
// the device, while the reader retries (README, "Kernel log monitor").
// config validate's warning for such a device says so
// (TestConfigValidateWarnsOfTheKmsgDevice).
func TestDaemonWithAMissingKmsgDeviceRunsAndSaysSo(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kmsg.Enabled = true
	cfg.Kmsg.Device = "/dev/nonexistent-kmsg"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	want := cfg.HostPath(cfg.Kmsg.Device) + ": no such file or directory"
	for _, cond := range []string{"ReadonlyFilesystem", "KernelDeadlock"} {
		await(t, d, cond+" Unknown (CheckFailed) naming the device", func() bool {
			c, ok := d.Store().Get(cond)
			return ok && c.Status == report.StatusUnknown && c.Reason == report.ReasonCheckFailed && strings.Contains(c.Message, want)
		})
	}
}
