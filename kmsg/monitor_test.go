package kmsg

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

func opts(t testing.TB, store *report.Store) Options {
	rs, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	return Options{Rules: rs, Store: store, IOErrorThreshold: 5, IOErrorWindow: 10 * time.Minute}
}

var t0 = time.Unix(1700000000, 0)

func rec(usec uint64, msg string) Record {
	return Record{Facility: 0, Level: 3, Usec: usec, Message: []byte(msg)}
}

// The lines captured from Debian's 6.1 kernel in a VM, replayed: exactly
// these actions.
func TestReplayCapturedDebianLines(t *testing.T) {
	got, st := replayFile(t, "testdata/captured-debian-6.1.kmsg")
	want := []string{
		`{"kind":"condition","type":"VerityCorruption","status":"True","reason":"VerityBlockCorrupted","message":"device-mapper: verity: 7:1: data block 5 is corrupted"}`,
		`{"kind":"condition","type":"VerityCorruption","status":"True","reason":"VerityBlockCorrupted","message":"device-mapper: verity: 7:1: metadata block 6 is corrupted"}`,
		`{"kind":"event","reason":"Ext4Error","message":"EXT4-fs error (device loop0): trigger_test_error:126: comm init: 1"}`,
		`{"kind":"condition","type":"ReadonlyFilesystem","status":"True","reason":"FilesystemIsReadOnly","message":"EXT4-fs (loop0): Remounting filesystem read-only"}`,
		`{"kind":"event","reason":"Ext4Error","message":"EXT4-fs error (device loop0): ext4_journal_check_start:83: comm init: Detected aborted journal"}`,
		`{"kind":"event","reason":"Ext4Error","message":"EXT4-fs error (device loop0) in __ext4_new_inode:1096: Journal has aborted"}`,
		`{"kind":"condition","type":"KernelDeadlock","status":"True","reason":"CriticalTaskHung","message":"INFO: task kubelet:128 blocked for more than 1 seconds."}`,
		`{"kind":"event","reason":"TaskHung","message":"INFO: task kubelet:128 blocked for more than 1 seconds."}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("actions:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st.Lines != 46 || st.Matched != len(want) {
		t.Errorf("stats %+v", st)
	}
}

func TestDiskIOErrorWindow(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	sec := uint64(time.Second / time.Microsecond)
	ioerr := func(at uint64, dev string) {
		mon.Handle(rec(at, fmt.Sprintf("I/O error, dev %s, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", dev)), t0.Add(time.Duration(at)*time.Microsecond))
	}
	status := func() report.Condition { c, _ := store.Get("DisksFailure"); return c }
	if c := status(); c.Status != report.StatusUnknown || c.Reason != report.ReasonNoData {
		t.Fatalf("at start, before the log was read: %+v", c)
	}
	mon.CaughtUp(0, t0)
	if c := status(); c.Status != report.StatusFalse {
		t.Fatalf("the log read, no errors: %+v", c)
	}
	// Loop, device-mapper and network block device (nbd, Ceph RBD) errors
	// do not count.
	for i := range 10 {
		ioerr(uint64(i)*sec, "loop0")
		ioerr(uint64(i)*sec, "dm-0")
		ioerr(uint64(i)*sec, "nbd0")
		ioerr(uint64(i)*sec, "rbd0")
	}
	if c := status(); c.Status != report.StatusFalse {
		t.Fatalf("loop/dm/nbd/rbd errors counted: %+v", c)
	}
	// 4 errors spread over 12 minutes, then one more: only 4 within 10 min.
	for i, at := range []uint64{100, 400, 700, 820} {
		ioerr(at*sec, []string{"sda", "sda", "nvme0n1", "sda"}[i])
	}
	ioerr(830*sec, "sdb")
	if c := status(); c.Status != report.StatusFalse {
		t.Fatalf("4 errors within 10 minutes set it: %+v", c)
	}
	ioerr(840*sec, "sdb")
	c := status()
	if c.Status != report.StatusTrue || c.Reason != "DiskIOErrors" || c.Message != "the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on nvme0n1, sda, sdb" {
		t.Fatalf("5 errors within 10 minutes: %+v", c)
	}
	// The errors age out: a minute later 5 are still within 10 minutes
	// (400 s .. 840 s), eleven minutes later none.
	mon.Tick(840*sec+60*sec, t0)
	if c := status(); c.Status != report.StatusTrue {
		t.Errorf("cleared too early: %+v", c)
	}
	mon.Tick(840*sec+11*60*sec, t0)
	if c := status(); c.Status != report.StatusFalse {
		t.Errorf("did not clear after the window: %+v", c)
	}
}

// DisksFailure has two causes: the window is one part, a second part (NVMe
// SMART) can set it while the window is quiet.
func TestDisksFailureTwoParts(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	store.SetPart(report.SourceCheck, report.Condition{Type: "DisksFailure", Status: report.StatusTrue, Reason: "NVMeCriticalWarning", Message: "nvme0: available spare below threshold"}, t0)
	c, _ := store.Get("DisksFailure")
	if c.Status != report.StatusTrue || c.Reason != "NVMeCriticalWarning" || c.Message != "nvme0: available spare below threshold" {
		t.Errorf("SMART part: %+v", c)
	}
	mon.Tick(1, t0) // the window part is re-evaluated False: SMART keeps it True
	if c, _ := store.Get("DisksFailure"); c.Status != report.StatusTrue {
		t.Errorf("window part cleared the SMART cause: %+v", c)
	}
}

func TestScopesAndKernelOnly(t *testing.T) {
	store := report.NewStore("b")
	o := opts(t, store)
	o.KernelOnly = true
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	if _, ok := store.Get("GpuFallenOffBus"); ok {
		t.Error("GpuFallenOffBus evaluated on a node without a GPU")
	}
	mon.Handle(rec(1, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."), t0)
	if _, ok := store.Get("GpuFallenOffBus"); ok {
		t.Error("GPU rule fired on a node without a GPU")
	}
	user := rec(2, "EXT4-fs (sda1): Remounting filesystem read-only")
	user.Facility = 1
	mon.Handle(user, t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Error("a user-space line set a kernel condition with kernel_only")
	}
	mon.Handle(rec(3, "EXT4-fs (sda1): Remounting filesystem read-only"), t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
		t.Error("kernel line ignored")
	}
	// Held until reboot: a restart (Start again) does not clear it.
	mon.Start(t0.Add(time.Hour), t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
		t.Error("Start cleared a held condition")
	}
}

// A flood of 100,000 lines (a third matching) must not grow memory with the
// number of lines: the window holds at most windowCap errors.
func TestFloodMemoryBounded(t *testing.T) {
	store := report.NewStore("b")
	events := 0
	store.Observe(countEvents{&events})
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	lines := [][]byte{
		[]byte("3,1,1,-;I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0"),
		[]byte("6,2,2,-;audit: type=1400 audit(1700000000.000:42): apparmor=\"DENIED\" operation=\"open\""),
		[]byte("6,3,3,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"),
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 100000 {
		r, _ := ParseRecord(lines[i%3])
		r.Usec = uint64(i)
		mon.Handle(r, t0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if events != 33334 {
		t.Errorf("%d events, want 33334", events)
	}
	if mon.window.n > windowCap {
		t.Errorf("window holds %d entries", mon.window.n)
	}
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 512<<10 {
		t.Errorf("heap grew by %d bytes over 100,000 lines", grow)
	}
}

type countEvents struct{ n *int }

func (countEvents) ConditionChanged(*report.Condition, report.Condition) {}
func (countEvents) ConditionRestored(report.Condition)                   {}
func (c countEvents) EventEmitted(report.Event)                          { *c.n++ }

// Before the reader has read the log to its end a kernel condition is not
// known to be healthy (Unknown/NoData, never a fake False); when the reader
// cannot read, conditions that are not True are Unknown (CheckFailed) and
// so is DisksFailure's kernel part; a True one stays held.
func TestNotReadIsNotHealthy(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	for _, ty := range mon.Conditions() {
		if c, _ := store.Get(ty); c.Status != report.StatusUnknown || c.Reason != report.ReasonNoData {
			t.Errorf("%s before the log was read: %+v", ty, c)
		}
	}
	mon.Handle(rec(1, "EXT4-fs (sda1): Remounting filesystem read-only"), t0)
	mon.CaughtUp(1, t0)
	if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusFalse {
		t.Errorf("KernelDeadlock once the log was read: %+v", c)
	}
	mon.Blind(errors.New("read /dev/kmsg: input/output error"), t0.Add(time.Minute))
	for ty, want := range map[string]report.Status{"ReadonlyFilesystem": report.StatusTrue, "KernelDeadlock": report.StatusUnknown, "DisksFailure": report.StatusUnknown} {
		c, _ := store.Get(ty)
		if c.Status != want || (want == report.StatusUnknown && (c.Reason != report.ReasonCheckFailed || c.Message != "cannot read the kernel log: read /dev/kmsg: input/output error")) {
			t.Errorf("%s while blind: %+v", ty, c)
		}
	}
	mon.CaughtUp(2, t0.Add(2*time.Minute))
	if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusFalse {
		t.Errorf("KernelDeadlock after recovery: %+v", c)
	}
	// A restart: a condition restored from this boot keeps its state.
	s2 := report.NewStore("b")
	s2.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusFalse, Reason: report.ReasonKernelHasNoDeadlock}, t0)
	s2.Set(report.Condition{Type: "DisksFailure", Status: report.StatusFalse, Reason: report.ReasonDisksHealthy}, t0)
	NewMonitor(opts(t, s2)).Start(t0, t0)
	for _, ty := range []string{"KernelDeadlock", "DisksFailure"} {
		if c, _ := s2.Get(ty); c.Status != report.StatusFalse {
			t.Errorf("%s restored False, then Start: %+v", ty, c)
		}
	}
}

// A GPU detected after the start: only the GPU conditions change, and they
// are False only when the log has been read (Unknown while it cannot be);
// a blind monitor's Unknown kernel conditions stay Unknown (it set every
// Unknown kernel condition False before).
func TestSetGPUNeverFakesFalse(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	mon.Blind(errors.New("no device"), t0)
	mon.SetGPU(true, t0)
	for _, ty := range []string{"ReadonlyFilesystem", "GpuFallenOffBus"} {
		if c, _ := store.Get(ty); c.Status != report.StatusUnknown {
			t.Errorf("%s after a GPU appeared while blind: %+v", ty, c)
		}
	}
	mon.SetGPU(false, t0)
	mon.CaughtUp(1, t0)
	mon.SetGPU(true, t0)
	if c, _ := store.Get("GpuFallenOffBus"); c.Status != report.StatusFalse || c.Message != "no matching kernel message since the GPU was detected" {
		t.Errorf("GpuFallenOffBus after a GPU appeared, log read: %+v", c)
	}
}

// DisksFailure restored from this boot's state (its parts are not saved)
// does not flap when the NVMe SMART check sets its part before the reader
// has read the kernel log again: the kernel's part starts as what the
// restored condition says of it, so the check's False (or nothing to check)
// neither lowers a True the kernel set nor turns the condition Unknown, and
// the kernel's evaluation then keeps the transition time.
func TestRestoredDisksFailureDoesNotFlapOnRestart(t *testing.T) {
	sec := uint64(time.Second / time.Microsecond)
	for _, c := range []struct {
		name     string
		restored report.Condition
		smart    report.Condition
		ioErrors int
	}{
		{"kernel True, SMART False", report.Condition{Status: report.StatusTrue, Reason: report.ReasonDiskIOErrors,
			Message: "the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on sda"},
			report.Condition{Status: report.StatusFalse, Reason: report.ReasonDisksHealthy, Message: "nvme0: healthy"}, 5},
		{"kernel True, no NVMe", report.Condition{Status: report.StatusTrue, Reason: report.ReasonDiskIOErrors,
			Message: "the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on sda"},
			report.Condition{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: "no NVMe drives"}, 5},
		{"False, no NVMe", report.Condition{Status: report.StatusFalse, Reason: report.ReasonDisksHealthy,
			Message: "the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5)"},
			report.Condition{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: "no NVMe drives"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := report.NewStore("b")
			c.restored.Type, c.smart.Type = "DisksFailure", "DisksFailure"
			store.Set(c.restored, t0)
			mon := NewMonitor(opts(t, store))
			now := t0.Add(time.Hour)
			mon.Start(now, t0)
			check := func(step string) {
				t.Helper()
				got, _ := store.Get("DisksFailure")
				if got.Status != c.restored.Status || got.Reason != c.restored.Reason || !got.LastTransitionTime.Equal(t0) {
					t.Errorf("%s: %s/%s since %v, want %s/%s since %v (restored)", step, got.Status, got.Reason, got.LastTransitionTime,
						c.restored.Status, c.restored.Reason, t0)
				}
			}
			check("after Start")
			store.SetPart(report.SourceCheck, c.smart, now)
			check("the SMART check's part set before the kernel log was read")
			for i := range c.ioErrors {
				mon.Handle(rec(uint64(100+i)*sec, "I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0"), now)
			}
			mon.CaughtUp(200*sec, now)
			check("the kernel log read")
		})
	}
}

// The mirror of TestRestoredDisksFailureDoesNotFlapOnRestart: DisksFailure
// restored True for the NVMe SMART part's reason, the kernel's part False,
// both parts saved with it. The kernel log read again before the SMART
// check runs does not lower it: Start keeps the restored kernel part, and
// the part that reports first does not decide alone.
func TestRestoredNVMeDisksFailureDoesNotFlapOnRestart(t *testing.T) {
	dir := t.TempDir()
	prev := report.NewStore("b")
	prev.SetPart(report.SourceKmsg, report.Condition{Type: "DisksFailure", Status: report.StatusFalse, Reason: report.ReasonDisksHealthy,
		Message: "the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5)"}, t0)
	prev.SetPart(report.SourceCheck, report.Condition{Type: "DisksFailure", Status: report.StatusTrue, Reason: report.ReasonNVMeCriticalWarning,
		Message: "nvme0: available spare below threshold"}, t0)
	if err := prev.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	store := report.NewStore("b")
	if _, err := store.Load(dir); err != nil {
		t.Fatal(err)
	}
	mon := NewMonitor(opts(t, store))
	now := t0.Add(time.Hour)
	mon.Start(now, t0)
	mon.CaughtUp(200*uint64(time.Second/time.Microsecond), now)
	if got, _ := store.Get("DisksFailure"); got.Status != report.StatusTrue || got.Reason != report.ReasonNVMeCriticalWarning || !got.LastTransitionTime.Equal(t0) {
		t.Errorf("the kernel log read before the SMART check ran: %s/%s since %v, want True/NVMeCriticalWarning since %v",
			got.Status, got.Reason, got.LastTransitionTime, t0)
	}
}

// A hung task's line names its thread, which any process names
// (prctl(PR_SET_NAME)): a pod's thread named with terminal escape sequences
// ("runc:" matches a critical task) is matched on the kernel's words, and
// its condition's and its Event's messages carry the sequences as /dev/kmsg
// and dmesg write them (\x1b), never the raw bytes that `kubectl describe
// node` or `kubectl get events` would send to an administrator's terminal.
func TestHungTaskNamedWithEscapesIsPublishedEscaped(t *testing.T) {
	store := report.NewStore("b")
	events := &eventMessages{}
	store.Observe(events)
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	for _, line := range []string{
		`6,100,5000000,-;INFO: task runc:\x1b[2J\x1b[H:4242 blocked for more than 120 seconds.`,
		`6,101,5000001,-;INFO: task \x1b]0;pwn\x07\xc2\x9b:4243 blocked for more than 120 seconds.`,
	} {
		r, err := ParseRecord([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		mon.Handle(r, t0)
	}
	want := []string{
		`INFO: task runc:\x1b[2J\x1b[H:4242 blocked for more than 120 seconds.`,
		`INFO: task \x1b]0;pwn\x07\xc2\x9b:4243 blocked for more than 120 seconds.`,
	}
	if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusTrue || c.Message != want[0] {
		t.Errorf("KernelDeadlock: %+v\nwant the message %q", c, want[0])
	}
	if strings.Join(events.msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("TaskHung events:\n%q\nwant:\n%q", events.msgs, want)
	}
}
