package kmsg

import (
	"errors"
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
			store, now := storeAtAnHour()
			if tc.fromState {
				loadState(t, store, `"type":"KernelDeadlock","status":"True","reason":"CriticalTaskHungInGuest","message":"task qemu-kvm:1234 blocked for more than 120 seconds"`, since)
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

// DisksFailure True in the state file with a reason this build does not
// know (a newer build's SMART reason): the kernel log monitor's start (its
// part: no data yet) and the SMART check's True must keep the other build's
// time, as for any condition with such a reason (a True that stays True).
func TestRestoredDisksFailureWithAnUnknownReasonKeepsItsTime(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	store, now := storeAtAnHour()
	loadState(t, store, `"type":"DisksFailure","status":"True","reason":"NVMeSomethingNew","message":"nvme0: new"`, since)
	mon := NewMonitor(opts(t, store))
	mon.Start(now, t0.Add(-4*time.Hour))
	store.SetPart(report.SourceCheck, report.Condition{Type: "DisksFailure", Status: report.StatusTrue, Reason: report.ReasonNVMeCriticalWarning,
		Message: "nvme0: available spare below threshold"}, now)
	mon.CaughtUp(200*uint64(time.Second/time.Microsecond), now)
	if got, _ := store.Get("DisksFailure"); got.Status != report.StatusTrue || !got.LastTransitionTime.Equal(since) {
		t.Errorf("after the start: %s/%s since %v, want True since %v", got.Status, got.Reason, got.LastTransitionTime, since)
	}
}

// A kernel condition False in the state file with a healthy reason this
// build does not know (renamed): the start's placeholder (Unknown, NoData)
// does not spend its time, and the log read to its end keeps it False since
// the other build's time.
func TestRestoredKernelFalseWithAnUnknownReasonKeepsItsTime(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	store, now := storeAtAnHour()
	loadState(t, store, `"type":"KernelDeadlock","status":"False","reason":"NoKernelDeadlock","message":"none"`, since)
	mon := NewMonitor(opts(t, store))
	mon.Start(now, t0.Add(-4*time.Hour))
	mon.CaughtUp(200*uint64(time.Second/time.Microsecond), now)
	if got, _ := store.Get("KernelDeadlock"); got.Status != report.StatusFalse || got.Reason != report.ReasonKernelHasNoDeadlock || !got.LastTransitionTime.Equal(since) {
		t.Errorf("after the start: %s/%s since %v, want False/KernelHasNoDeadlock since %v", got.Status, got.Reason, got.LastTransitionTime, since)
	}
}

// storeAtAnHour is boot "b"'s store and its clock's time, t0 plus an hour
// (the start after a restart).
func storeAtAnHour() (*report.Store, time.Time) {
	store, now := report.NewStore("b"), t0.Add(time.Hour)
	store.SetClock(func() time.Time { return now })
	return store, now
}

// loadState loads into store a state file of boot "b", saved at t0, that
// holds one condition: its JSON fields (type, status, reason, message)
// and, for both its times, since.
func loadState(t *testing.T, store *report.Store, fields string, since time.Time) {
	t.Helper()
	dir := t.TempDir()
	sf := `{"version":1,"bootID":"b","savedAt":"` + t0.Format(time.RFC3339) + `","conditions":[
	 {` + fields + `,"lastTransitionTime":"` + since.Format(time.RFC3339) + `","lastUpdateTime":"` + since.Format(time.RFC3339) + `"}]}`
	if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(sf), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Load(dir); err != nil {
		t.Fatal(err)
	}
}

// A GPU kernel condition read back False with a healthy reason this build
// does not know (renamed), on a node whose GPU is found only after the start
// (its driver loaded later, the reader blind meanwhile): SetGPU's placeholder
// (Unknown, NoData), set before the log is read to its end, must not spend
// the time kept for it, as Start's does not; the log read to its end keeps
// it False since the other build's time. Before, the placeholder was the
// first Set of its type: the kept time was gone, and the False that
// followed was a transition of now (a MachineHealthCheck's timeout and an
// alert's `for:` started over).
func TestGPUFoundAfterTheStartKeepsTheTimeOfAConditionWithAnUnknownReason(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	for _, tc := range []struct {
		name            string
		fromState, node bool
		blind           bool // the reader cannot read the log when the GPU is found
		read            bool // the log is read to its end when the GPU is found
	}{
		{"state file, found before the log is read", true, false, false, false},
		{"Node, found before the log is read", false, true, false, false},
		{"state file, found while the log cannot be read", true, false, true, false},
		{"state file, found after the log is read", true, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, now := storeAtAnHour()
			if tc.fromState {
				loadState(t, store, `"type":"GpuFallenOffBus","status":"False","reason":"GpuStillOnBus","message":"none"`, since)
			}
			mon := NewMonitor(opts(t, store)) // no GPU at the start
			mon.Start(now, t0.Add(-4*time.Hour))
			if tc.node {
				store.Adopt(report.Condition{Type: "GpuFallenOffBus", Status: report.StatusFalse, Reason: "GpuStillOnBus",
					Message: "none", LastTransitionTime: since}, "b")
			}
			if tc.blind {
				mon.Blind(errors.New("no device"), now)
			}
			if tc.read {
				mon.CaughtUp(200*uint64(time.Second/time.Microsecond), now)
			}
			mon.SetGPU(true, now.Add(time.Minute))
			if !tc.read {
				mon.CaughtUp(200*uint64(time.Second/time.Microsecond), now.Add(2*time.Minute))
			}
			if got, _ := store.Get("GpuFallenOffBus"); got.Status != report.StatusFalse || got.Reason != report.ReasonGpuOnBus || !got.LastTransitionTime.Equal(since) {
				t.Errorf("after the GPU was found and the log read: %s/%s since %v, want False/GpuOnBus since %v",
					got.Status, got.Reason, got.LastTransitionTime, since)
			}
		})
	}
}
