package daemon

import (
	"net"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// README, "Using it on a node": systemctl status's STATUS= line counts the
// conditions evaluated on this node, "21 on a worker without a GPU; `check`
// counts all 24, the NotApplicable ones too". The line counts the store's
// conditions (TestLifecycleOverRealNotifySocket: as many as are evaluated),
// and these are the ones evaluated with every check and the kernel log
// monitor on, as shipped: not GpuActivationFailed, GpuFallenOffBus (GPU
// nodes) or APIServerSourceIPUnavailable (control plane) on a worker
// without a GPU. (Held.)
func TestStatusLineCountsTheConditionsOfThisNode(t *testing.T) {
	if n := len(report.Conditions); n != 24 {
		t.Errorf("the catalog has %d conditions; README says `check` counts all 24", n)
	}
	for _, tc := range []struct {
		role, gpu string
		want      int
		left      []string
	}{
		{"worker", "false", 21, []string{"GpuActivationFailed", "APIServerSourceIPUnavailable", "GpuFallenOffBus"}},
	} {
		cfg := testConfig(t)
		cfg.Checks = config.Default().Checks // every check on, as shipped (none runs here)
		cfg.Kmsg.Enabled = true
		cfg.Role, cfg.GPU = tc.role, tc.gpu
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
		if err != nil {
			t.Fatal(err)
		}
		got := d.parts.applicable(d.currentEnv())
		if len(got) != tc.want {
			t.Errorf("%s, gpu %s: %d conditions evaluated, want %d: %v", tc.role, tc.gpu, len(got), tc.want, got)
		}
		for _, c := range tc.left {
			for _, g := range got {
				if g == c {
					t.Errorf("%s, gpu %s: %s evaluated", tc.role, tc.gpu, c)
				}
			}
		}
		ln.Close()
	}
}
