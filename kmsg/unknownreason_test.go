package kmsg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// A kernel condition True in this boot, saved by a build that knows a
// reason this one does not (a rollback past an added kernel reason): the
// line that made it True lies behind the saved cursor and is not read
// again, so nothing but the restored state holds it. The start's
// placeholder (Unknown, NoData) and the log read to its end (False) must
// not lower it: it stays True, since the other build's time, for the rest
// of the boot, under this build's reason for it with the other build's
// message, and the Node's copy does not change that.
func TestRestoredKernelTrueWithAnUnknownReasonIsHeldForTheBoot(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	for _, tc := range []struct {
		name            string
		fromState, node bool
	}{{"state file and Node", true, true}, {"state file only", true, false}, {"Node only", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			store := report.NewStore("b")
			now := t0.Add(time.Hour)
			store.SetClock(func() time.Time { return now })
			if tc.fromState {
				sf := `{"version":1,"bootID":"b","savedAt":"` + t0.Format(time.RFC3339) + `","conditions":[
				 {"type":"KernelDeadlock","status":"True","reason":"CriticalTaskHungInGuest","message":"task qemu-kvm:1234 blocked for more than 120 seconds","lastTransitionTime":"` +
					since.Format(time.RFC3339) + `","lastUpdateTime":"` + since.Format(time.RFC3339) + `"}]}`
				if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(sf), 0o600); err != nil {
					t.Fatal(err)
				}
				if _, err := store.Load(dir); err != nil {
					t.Fatal(err)
				}
			}
			mon := NewMonitor(opts(t, store))
			mon.Start(now, t0.Add(-4*time.Hour))
			if tc.node {
				store.Adopt(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHungInGuest",
					Message: "task qemu-kvm:1234 blocked for more than 120 seconds", LastTransitionTime: since}, "b")
			}
			mon.CaughtUp(200*uint64(time.Second/time.Microsecond), now)
			got, _ := store.Get("KernelDeadlock")
			if got.Status != report.StatusTrue || got.Reason != report.ReasonCriticalTaskHung || !got.LastTransitionTime.Equal(since) ||
				!strings.Contains(got.Message, "qemu-kvm:1234") || !strings.Contains(got.Message, "CriticalTaskHungInGuest") {
				t.Errorf("after the start and the log read to its end: %s/%s since %v (%q), want True/CriticalTaskHung since %v with the other build's reason and message",
					got.Status, got.Reason, got.LastTransitionTime, got.Message, since)
			}
		})
	}
}
