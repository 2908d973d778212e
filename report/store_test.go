package report

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func cond(t string, s Status, reason Reason, msg string) Condition {
	return Condition{Type: t, Status: s, Reason: reason, Message: msg}
}

type recorder struct {
	changes  []string
	restored []string
	events   []string
}

func (r *recorder) ConditionChanged(prev *Condition, cur Condition) {
	from := "-"
	if prev != nil {
		from = string(prev.Status)
	}
	r.changes = append(r.changes, cur.Type+":"+from+">"+string(cur.Status))
}
func (r *recorder) ConditionRestored(c Condition) { r.restored = append(r.restored, c.Type) }
func (r *recorder) EventEmitted(e Event)          { r.events = append(r.events, e.Reason) }

func TestTransitionTimeChangesOnlyWithStatus(t *testing.T) {
	s := NewStore("boot1")
	rec := &recorder{}
	s.Observe(rec)
	const ty = "DiskUsageHigh"
	if !s.Set(cond(ty, StatusFalse, "DiskUsageOK", "2 filesystems"), t0) {
		t.Fatal("first Set reported no change")
	}
	if s.Set(cond(ty, StatusFalse, "DiskUsageOK", "2 filesystems"), t0.Add(time.Minute)) {
		t.Error("identical Set reported a change")
	}
	c, _ := s.Get(ty)
	if !c.LastTransitionTime.Equal(t0) || !c.LastUpdateTime.Equal(t0.Add(time.Minute)) {
		t.Errorf("after a repeat: transition %v update %v", c.LastTransitionTime, c.LastUpdateTime)
	}
	// Message changes, status does not: change, same transition time.
	if !s.Set(cond(ty, StatusFalse, "DiskUsageOK", "3 filesystems"), t0.Add(2*time.Minute)) {
		t.Error("message change not reported")
	}
	if c, _ := s.Get(ty); !c.LastTransitionTime.Equal(t0) {
		t.Errorf("message change moved the transition time to %v", c.LastTransitionTime)
	}
	s.Set(cond(ty, StatusTrue, "FilesystemSpaceHigh", "/var 95%"), t0.Add(3*time.Minute))
	if c, _ := s.Get(ty); !c.LastTransitionTime.Equal(t0.Add(3 * time.Minute)) {
		t.Errorf("status change: transition time %v", c.LastTransitionTime)
	}
	s.Set(cond(ty, StatusTrue, "FilesystemInodesHigh", "/var inodes"), t0.Add(4*time.Minute))
	if c, _ := s.Get(ty); !c.LastTransitionTime.Equal(t0.Add(3 * time.Minute)) {
		t.Errorf("reason change moved the transition time to %v", c.LastTransitionTime)
	}
	want := []string{"DiskUsageHigh:->False", "DiskUsageHigh:False>False", "DiskUsageHigh:False>True", "DiskUsageHigh:True>True"}
	if strings.Join(rec.changes, " ") != strings.Join(want, " ") {
		t.Errorf("observer saw %v, want %v", rec.changes, want)
	}
}

func TestHeldConditionsStaySet(t *testing.T) {
	s := NewStore("b")
	s.Set(cond("ReadonlyFilesystem", StatusTrue, "FilesystemIsReadOnly", "sda1"), t0)
	if s.Set(cond("ReadonlyFilesystem", StatusFalse, "FilesystemIsNotReadOnly", ""), t0.Add(time.Minute)) {
		t.Error("a kernel condition held until reboot was cleared")
	}
	if c, _ := s.Get("ReadonlyFilesystem"); c.Status != StatusTrue || c.Message != "sda1" {
		t.Errorf("held condition = %+v", c)
	}
	s.Set(cond("NodeTampered", StatusTrue, "ProtectedFileChanged", "/var/x"), t0)
	s.Set(cond("NodeTampered", StatusFalse, "NodeIntact", ""), t0.Add(time.Minute))
	if c, _ := s.Get("NodeTampered"); c.Status != StatusTrue {
		t.Error("a revert cleared NodeTampered")
	}
	// A check condition follows its probe.
	s.Set(cond("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", ""), t0)
	s.Set(cond("ClockNotSynchronized", StatusFalse, "ClockSynchronized", ""), t0.Add(time.Minute))
	if c, _ := s.Get("ClockNotSynchronized"); c.Status != StatusFalse {
		t.Error("a check condition did not clear")
	}
}

func TestSetRejectsReasonsOutsideTheCatalog(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Set with an unknown reason did not panic")
		}
	}()
	NewStore("b").Set(cond("DiskUsageHigh", StatusTrue, "Whatever", ""), t0)
}

func TestMessageIsCapped(t *testing.T) {
	s := NewStore("b")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", strings.Repeat("é", 2000)), t0)
	c, _ := s.Get("DiskUsageHigh")
	if len(c.Message) > MaxMessageLen || !strings.HasSuffix(c.Message, "...(truncated)") {
		t.Errorf("message len %d, suffix %q", len(c.Message), c.Message[len(c.Message)-20:])
	}
	if !strings.HasPrefix(c.Message, "é") || strings.ContainsRune(c.Message, '\uFFFD') {
		t.Error("capping split a UTF-8 character")
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := NewStore("boot1")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var 95%"), t0)
	s.Set(cond("ClockNotSynchronized", StatusFalse, "ClockSynchronized", "ok"), t0.Add(time.Second))
	s.Set(cond("ReadonlyFilesystem", StatusTrue, "FilesystemIsReadOnly", "sda1"), t0)
	s.Set(cond("NodeTampered", StatusTrue, "ProtectedFileChanged", "/var/x"), t0)
	if err := s.Save(dir, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}

	// Same boot: everything comes back, with its transition times.
	s2 := NewStore("boot1")
	rec := &recorder{}
	s2.Observe(rec)
	res, err := s2.Load(dir)
	if err != nil || res.Restored != 4 || res.Dropped != 0 {
		t.Fatalf("Load = %+v, %v", res, err)
	}
	for _, c := range s.All() {
		got, ok := s2.Get(c.Type)
		if !ok || got.Status != c.Status || !got.LastTransitionTime.Equal(c.LastTransitionTime) || got.Message != c.Message {
			t.Errorf("%s restored as %+v, saved %+v", c.Type, got, c)
		}
	}
	if len(rec.restored) != 4 || len(rec.changes) != 0 {
		t.Errorf("observers: restored %v, changes %v", rec.restored, rec.changes)
	}
	// The next evaluation with the same status does not move the transition time.
	s2.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var 95%"), t0.Add(10*time.Minute))
	if c, _ := s2.Get("DiskUsageHigh"); !c.LastTransitionTime.Equal(t0) {
		t.Errorf("transition time after restart+rerun = %v, want %v", c.LastTransitionTime, t0)
	}

	// New boot: kernel conditions (held until reboot) are dropped, tamper kept.
	s3 := NewStore("boot2")
	res, err = s3.Load(dir)
	if err != nil || res.Restored != 3 || res.Dropped != 1 {
		t.Fatalf("Load after reboot = %+v, %v", res, err)
	}
	if _, ok := s3.Get("ReadonlyFilesystem"); ok {
		t.Error("ReadonlyFilesystem survived a reboot")
	}
	if c, ok := s3.Get("NodeTampered"); !ok || c.Status != StatusTrue {
		t.Error("NodeTampered did not survive a reboot")
	}
}

func TestCorruptStateIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	os.WriteFile(p, []byte("{not json"), 0o644)
	s := NewStore("b")
	res, err := s.Load(dir)
	if err != nil || res.Corrupt == nil {
		t.Fatalf("Load = %+v, %v; want Corrupt set", res, err)
	}
	if b, err := os.ReadFile(res.CorruptPath); err != nil || string(b) != "{not json" {
		t.Errorf("corrupt file not kept at %s: %v", res.CorruptPath, err)
	}
	if len(s.All()) != 0 {
		t.Error("store not empty after a corrupt file")
	}
	// Missing file: empty store, no error.
	res, err = NewStore("b").Load(t.TempDir())
	if err != nil || !reflect.DeepEqual(res, LoadResult{}) {
		t.Errorf("missing file: %+v, %v", res, err)
	}
}

func TestUnknownConditionsInStateAreDropped(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, StateFileName), []byte(`{"version":1,"bootID":"b","conditions":[
	 {"type":"Gone","status":"True","reason":"X"},
	 {"type":"DiskUsageHigh","status":"True","reason":"Renamed"},
	 {"type":"ClockNotSynchronized","status":"False","reason":"ClockSynchronized"}]}`), 0o644)
	s := NewStore("b")
	res, err := s.Load(dir)
	if err != nil || res.Restored != 1 || res.Dropped != 1 || res.Aside != 1 {
		t.Errorf("Load = %+v, %v", res, err)
	}
	// A reason this build does not know is never shown as current, nor
	// written to the Node: only its time is kept, for the first Set
	// (TestUnknownReasonKeepsTheTransitionTimeOfATrue).
	if c, ok := s.Get("DiskUsageHigh"); ok {
		t.Errorf("restored with a reason this build does not know: %+v", c)
	}
	if all := s.All(); len(all) != 1 || all[0].Type != "ClockNotSynchronized" {
		t.Errorf("All = %+v", all)
	}
	if got := s.Aside(); len(got) != 1 || got[0] != "DiskUsageHigh" {
		t.Errorf("Aside = %v", got)
	}
}

func TestAdoptFromNode(t *testing.T) {
	s := NewStore("b")
	rec := &recorder{}
	s.Observe(rec)
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0.Add(time.Hour))
	s.Set(cond("ClockNotSynchronized", StatusFalse, "ClockSynchronized", ""), t0.Add(time.Hour))

	node := func(ty string, st Status, reason Reason, ltt time.Time) Condition {
		return Condition{Type: ty, Status: st, Reason: reason, LastTransitionTime: ltt}
	}
	// Same status on the Node, earlier: the Node's transition time wins.
	if !s.Adopt(node("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", t0), "") {
		t.Error("same status, other time: not adopted")
	}
	if c, _ := s.Get("DiskUsageHigh"); !c.LastTransitionTime.Equal(t0) || c.Message != "/var" {
		t.Errorf("DiskUsageHigh after adopt = %+v", c)
	}
	// Another status on the Node: the local (newer) state wins.
	if s.Adopt(node("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", t0), "") {
		t.Error("a stale Node status overrode the local one")
	}
	// Unknown locally: taken over, observers see a restore.
	if !s.Adopt(node("KernelDeadlock", StatusTrue, "CriticalTaskHung", t0), "") {
		t.Error("new condition not adopted")
	}
	if c, ok := s.Get("KernelDeadlock"); !ok || !c.LastTransitionTime.Equal(t0) {
		t.Errorf("KernelDeadlock = %+v", c)
	}
	if len(rec.restored) != 1 || rec.restored[0] != "KernelDeadlock" {
		t.Errorf("restored %v", rec.restored)
	}
	// Not ours, or a reason we do not know: ignored.
	if s.Adopt(node("Ready", StatusTrue, "KubeletReady", t0), "") || s.Adopt(node("DisksFailure", StatusTrue, "OldReason", t0), "") {
		t.Error("adopted a foreign condition")
	}
}

// Conditions that never turn False by themselves: a kernel condition the
// Node shows True since this boot began is adopted over the local False
// (the state file was lost; the ring buffer may no longer hold the line),
// one from an earlier boot is not (a reboot clears it), and a tamper
// condition the Node shows True is adopted whatever the boot.
func TestAdoptHeldConditions(t *testing.T) {
	boot := t0.Add(time.Hour)
	s := NewStore("b")
	s.SetBootStart(boot)
	rec := &recorder{}
	s.Observe(rec)
	for _, ty := range []string{"ReadonlyFilesystem", "KernelDeadlock", "VerityCorruption", "NodeTampered"} {
		d, _ := Lookup(ty)
		s.Set(cond(ty, StatusFalse, d.HealthyReason, "no matching kernel message seen since the monitor started"), boot.Add(time.Hour))
	}
	node := func(ty string, st Status, reason Reason, ltt time.Time) Condition {
		return Condition{Type: ty, Status: st, Reason: reason, Message: "from the node", LastTransitionTime: ltt}
	}
	// This boot (the Node's time has one-second resolution: a second
	// before the computed boot start still counts).
	if !s.Adopt(node("ReadonlyFilesystem", StatusTrue, "FilesystemIsReadOnly", boot.Add(10*time.Minute)), "") ||
		!s.Adopt(node("VerityCorruption", StatusTrue, "VerityBlockCorrupted", boot.Add(-time.Second)), "") {
		t.Error("a kernel condition True since this boot was not adopted over the local False")
	}
	if c, _ := s.Get("ReadonlyFilesystem"); c.Status != StatusTrue || !c.LastTransitionTime.Equal(boot.Add(10*time.Minute)) || c.Message != "from the node" {
		t.Errorf("ReadonlyFilesystem = %+v", c)
	}
	// Held: a later evaluation to False does not clear it.
	s.Set(cond("ReadonlyFilesystem", StatusFalse, "FilesystemIsNotReadOnly", ""), boot.Add(2*time.Hour))
	if c, _ := s.Get("ReadonlyFilesystem"); c.Status != StatusTrue {
		t.Errorf("the adopted condition was cleared: %+v", c)
	}
	// An earlier boot: not adopted.
	if s.Adopt(node("KernelDeadlock", StatusTrue, "CriticalTaskHung", boot.Add(-time.Hour)), "") {
		t.Error("a kernel condition of an earlier boot was adopted")
	}
	s2 := NewStore("b")
	s2.SetBootStart(boot)
	if s2.Adopt(node("KernelDeadlock", StatusTrue, "CriticalTaskHung", boot.Add(-time.Hour)), "") {
		t.Error("a kernel condition of an earlier boot was adopted into an empty store (it would be held all boot)")
	}
	// Tamper: held forever.
	if !s.Adopt(node("NodeTampered", StatusTrue, "ProtectedFileChanged", boot.Add(-48*time.Hour)), "") {
		t.Error("NodeTampered=True on the Node was not adopted")
	}
	if len(rec.restored) != 3 {
		t.Errorf("restores seen by observers: %v", rec.restored)
	}
	// A check condition is re-evaluated: the local state still wins.
	s.Set(cond("DiskUsageHigh", StatusFalse, "DiskUsageOK", ""), boot.Add(time.Hour))
	if s.Adopt(node("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", boot.Add(time.Minute)), "") {
		t.Error("a check condition's stale True on the Node overrode the local False")
	}
}

// Values kept beside the conditions are saved in the same file, restored
// in the same boot only, and carried on when nobody keeps them yet.
func TestKeptValues(t *testing.T) {
	dir := t.TempDir()
	s := NewStore("boot1")
	type cur struct{ Seq uint64 }
	v := cur{Seq: 41}
	s.Keep("kmsg", func() any { return v })
	s.Set(cond("ReadonlyFilesystem", StatusTrue, "FilesystemIsReadOnly", "line"), t0)
	select {
	case <-s.Dirty():
	default:
		t.Error("a condition change did not mark the state dirty")
	}
	s.Touch()
	select {
	case <-s.Dirty():
	default:
		t.Error("Touch did not mark the state dirty")
	}
	v.Seq = 42
	if err := s.Save(dir, t0); err != nil {
		t.Fatal(err)
	}

	s2 := NewStore("boot1")
	if _, err := s2.Load(dir); err != nil {
		t.Fatal(err)
	}
	var got cur
	if !s2.Memo("kmsg", &got) || got.Seq != 42 {
		t.Errorf("restored %+v", got)
	}
	// Nobody keeps it in s2: saved again as it was.
	if err := s2.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	s3 := NewStore("boot1")
	s3.Load(dir)
	if got = (cur{}); !s3.Memo("kmsg", &got) || got.Seq != 42 {
		t.Errorf("carried on: %+v", got)
	}
	// Another boot: gone.
	s4 := NewStore("boot2")
	s4.Load(dir)
	if s4.Memo("kmsg", &got) {
		t.Error("a value of another boot was restored")
	}
	// Kept again (a producer rebuilt within the run): Memo reads the kept
	// value, the one the next Save writes, not the one loaded.
	s3.Keep("kmsg", func() any { return cur{Seq: 50} })
	if got = (cur{}); !s3.Memo("kmsg", &got) || got.Seq != 50 {
		t.Errorf("kept: %+v", got)
	}
}

// Which boot a True kernel condition on the Node belongs to is read from the
// boot ID of the Node's report (written only after that boot's conditions),
// not from the wall clock: a clock stepped since the line (NTP fixing an
// unsynchronized clock) cannot make this boot's condition look older, nor a
// clock that ran ahead in the previous boot make an old one look new.
func TestAdoptByTheReportsBoot(t *testing.T) {
	boot := t0.Add(time.Hour)
	node := func(ty string, reason Reason, ltt time.Time) Condition {
		return Condition{Type: ty, Status: StatusTrue, Reason: reason, LastTransitionTime: ltt}
	}
	s := NewStore("boot-b")
	s.SetBootStart(boot)
	s.Set(Condition{Type: "ReadonlyFilesystem", Status: StatusUnknown, Reason: ReasonNoData}, boot)
	// This boot's line, the clock stepped forward by a day since: the
	// transition time looks older than this boot's start.
	if !s.Adopt(node("ReadonlyFilesystem", ReasonFilesystemIsReadOnly, boot.Add(-24*time.Hour)), "boot-b") {
		t.Error("this boot's condition (by the report's boot ID) was not adopted")
	}
	// The previous boot's line, its clock a day ahead: looks new.
	if s.Adopt(node("KernelDeadlock", ReasonCriticalTaskHung, boot.Add(24*time.Hour)), "boot-a") {
		t.Error("an earlier boot's condition (by the report's boot ID) was adopted")
	}
}

// A tamper condition is lowered only by the Set that follows an operator's
// clear (Release), once; a True on the Node from before the clear is not
// taken back at a restart, one from after it is.
func TestReleaseAndClearedAdopt(t *testing.T) {
	s := NewStore("b1")
	s.Set(cond("NodeTampered", StatusTrue, ReasonProtectedFileChanged, "x"), t0)
	s.Set(cond("NodeTampered", StatusFalse, ReasonNodeIntact, ""), t0.Add(time.Minute))
	if c, _ := s.Get("NodeTampered"); c.Status != StatusTrue {
		t.Fatalf("lowered without a clear: %+v", c)
	}
	clearAt := t0.Add(2 * time.Minute)
	s.Release("NodeTampered", clearAt)
	// A run in flight during the clear (started before it) still sets
	// True; the release waits for a run started after the clear.
	s.SetRun(cond("NodeTampered", StatusTrue, ReasonProtectedFileChanged, "in flight"), clearAt.Add(-time.Second), clearAt)
	s.SetRun(cond("NodeTampered", StatusFalse, ReasonNodeIntact, ""), clearAt, clearAt.Add(time.Second))
	if c, _ := s.Get("NodeTampered"); c.Status != StatusFalse {
		t.Fatalf("not lowered after the clear: %+v", c)
	}
	s.Set(cond("NodeTampered", StatusTrue, ReasonProtectedFileChanged, "again"), clearAt.Add(2*time.Second))
	s.Set(cond("NodeTampered", StatusFalse, ReasonNodeIntact, ""), clearAt.Add(3*time.Second))
	if c, _ := s.Get("NodeTampered"); c.Status != StatusTrue {
		t.Fatalf("a clear released more than one Set: %+v", c)
	}

	// A clear whose own evaluation is True again (a sealed layer that still
	// mismatches) has spent its release: a later run that fails (Unknown,
	// CheckFailed) does not lower the True.
	clear2 := clearAt.Add(time.Hour)
	s.Release("NodeTampered", clear2)
	s.SetRun(cond("NodeTampered", StatusTrue, ReasonProtectedFileChanged, "still"), clear2, clear2.Add(time.Second))
	s.SetRun(cond("NodeTampered", StatusUnknown, ReasonCheckFailed, "scan failed"), clear2.Add(time.Minute), clear2.Add(time.Minute))
	if c, _ := s.Get("NodeTampered"); c.Status != StatusTrue {
		t.Fatalf("a later failed run lowered the True the clear's own evaluation set: %+v", c)
	}

	// A restart that lost the state: the Node's True from before the clear
	// is ignored, one from after it is held.
	s2 := NewStore("b1")
	s2.SetCleared("NodeTampered", clearAt)
	s2.Set(cond("NodeTampered", StatusFalse, ReasonNodeIntact, ""), clearAt.Add(time.Hour))
	old := cond("NodeTampered", StatusTrue, ReasonProtectedFileChanged, "old")
	old.LastTransitionTime = t0
	if s2.Adopt(old, "b1") {
		t.Error("a True from before the clear was taken back")
	}
	late := cond("NodeTampered", StatusTrue, ReasonProtectedFileChanged, "new")
	late.LastTransitionTime = clearAt.Add(time.Minute)
	if !s2.Adopt(late, "b1") {
		t.Error("a True from after the clear was not held")
	}
	if c, _ := s2.Get("NodeTampered"); c.Status != StatusTrue {
		t.Errorf("after adopting: %+v", c)
	}
}

// A restart that lost the state file keeps a tamper True from the Node
// unless the clear is one the daemon published to the Node (the tamper
// report's cleared.at); a clear only in the host's tamper state file is not
// fed to the store at all (internal/daemon assemble).
func TestAdoptTamperTrustsOnlyAPublishedClear(t *testing.T) {
	set := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	node := Condition{Type: "NodeTampered", Status: StatusTrue, Reason: ReasonProtectedFileChanged, LastTransitionTime: set}

	s := NewStore("boot-1")
	if !s.Adopt(node, "boot-1") {
		t.Fatal("a True from the Node was not taken over")
	}
	if c, _ := s.Get("NodeTampered"); c.Status != StatusTrue {
		t.Fatalf("got %s", c.Status)
	}

	annotations := map[string]string{AnnotationPrefix + "tamper": `{"schemaVersion":1,"tamper":{"cleared":{"at":"2026-12-02T09:30:00Z","reason":"ok","by":"ops"}}}`}
	at := ReportedClear(annotations)
	if !at.Equal(set.Add(30 * time.Minute)) {
		t.Fatalf("ReportedClear = %v", at)
	}
	s = NewStore("boot-1")
	s.SetCleared("NodeTampered", at)
	if s.Adopt(node, "boot-1") {
		t.Fatal("a True from before a published clear was taken over")
	}
	if !ReportedClear(map[string]string{AnnotationPrefix + "tamper": `{"tamper":{}}`}).IsZero() || !ReportedClear(nil).IsZero() {
		t.Fatal("a clear without one")
	}
}

// The Node has the later word over a store that knows less: a placeholder
// Unknown (NoData: the kernel log not read yet after a start that lost the
// state file), or a state file older than the Node (its save failed). A
// held condition the store has True is never lowered by the Node's time.
func TestAdoptNodeWinsOverNoDataAndOlderState(t *testing.T) {
	// The state file the start reads (the store's evaluations before it,
	// by an earlier run).
	prior := NewStore("b")
	prior.Set(cond("DiskUsageHigh", StatusFalse, "DiskUsageOK", ""), t0.Add(-time.Hour))
	prior.Set(cond("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", ""), t0.Add(500*time.Millisecond))
	prior.Set(cond("CNIUnhealthy", StatusFalse, "CNIHealthy", ""), t0.Add(-time.Hour))
	prior.Set(cond("NodeTampered", StatusTrue, "ProtectedFileChanged", "/etc/containerd/config.toml"), t0.Add(-time.Hour))
	s := restarted(t, prior)
	rec := &recorder{}
	s.Observe(rec)
	node := func(ty string, st Status, reason Reason, ltt time.Time) Condition {
		return Condition{Type: ty, Status: st, Reason: reason, Message: "from the node", LastTransitionTime: ltt}
	}
	now := t0.Add(2 * time.Hour)
	s.Set(Condition{Type: "KernelDeadlock", Status: StatusUnknown, Reason: ReasonNoData, Message: "the kernel log has not been read yet"}, now)
	if !s.Adopt(node("KernelDeadlock", StatusFalse, "KernelHasNoDeadlock", t0), "b") {
		t.Error("a placeholder Unknown (NoData) won over the Node's False: the first write would flap it")
	}
	if c, _ := s.Get("KernelDeadlock"); c.Status != StatusFalse || !c.LastTransitionTime.Equal(t0) {
		t.Errorf("KernelDeadlock = %+v; want False since %v", c, t0)
	}
	// The reader catches up and finds nothing: no transition.
	s.Set(Condition{Type: "KernelDeadlock", Status: StatusFalse, Reason: "KernelHasNoDeadlock"}, now.Add(time.Second))
	if c, _ := s.Get("KernelDeadlock"); !c.LastTransitionTime.Equal(t0) {
		t.Errorf("after catching up: %+v; want lastTransitionTime %v kept", c, t0)
	}

	// A state file an hour older than the Node's change.
	if !s.Adopt(node("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", t0), "b") {
		t.Error("an older local False won over the Node's later True")
	}
	if c, _ := s.Get("DiskUsageHigh"); c.Status != StatusTrue || !c.LastTransitionTime.Equal(t0) {
		t.Errorf("DiskUsageHigh = %+v; want True since %v", c, t0)
	}
	// A local change within the second the Node names: not known to be
	// older; the store keeps it.
	if s.Adopt(node("ClockNotSynchronized", StatusFalse, "ClockSynchronized", t0), "b") {
		t.Error("a local change in the Node's second was overridden")
	}
	// No time on the Node: nothing to compare.
	if s.Adopt(node("CNIUnhealthy", StatusTrue, ReasonCiliumNotOk, time.Time{}), "b") {
		t.Error("a Node condition without a transition time overrode the store")
	}
	// Held forever and True in the store: the Node's later False does
	// not lower it (only an operator's clear does).
	if s.Adopt(node("NodeTampered", StatusFalse, "NodeIntact", t0), "b") {
		t.Error("the Node's later False lowered a tamper condition the store holds True")
	}
	if c, _ := s.Get("NodeTampered"); c.Status != StatusTrue {
		t.Errorf("NodeTampered = %+v", c)
	}
	if len(rec.restored) != 2 || rec.restored[0] != "KernelDeadlock" || rec.restored[1] != "DiskUsageHigh" {
		t.Errorf("restores seen by observers: %v", rec.restored)
	}
}

// The daemon's conditions on the Node were written by an earlier run of it,
// so what this process evaluated, or saw change, is later than them
// whatever the wall clock says. After the clock was set back (chrony's
// makestep after an RTC that ran ahead; a boot whose clock is behind the
// last boot's), this run's times read earlier than the Node's: the Node's
// stale True replaced the False a check had just found (until the check's
// next run), and the Node's time replaced that of a change the store saw.
// A state file's evaluations are an earlier run's like the Node's: only
// their times order them.
func TestAdoptAfterTheClockWasSetBack(t *testing.T) {
	ahead := t0.Add(time.Hour) // the Node's times, from before the step
	nodeTrue := func(ty string, reason Reason) Condition {
		return Condition{Type: ty, Status: StatusTrue, Reason: reason, Message: "from the node", LastTransitionTime: ahead}
	}
	s := NewStore("b")
	s.Set(cond("DiskUsageHigh", StatusFalse, "DiskUsageOK", "this run"), t0.Add(time.Minute))
	if s.Adopt(nodeTrue("DiskUsageHigh", "FilesystemSpaceHigh"), "b") {
		t.Error("the Node's True from before the step replaced the False this run found")
	}
	if c, _ := s.Get("DiskUsageHigh"); c.Status != StatusFalse {
		t.Errorf("DiskUsageHigh = %+v; want this run's False", c)
	}
	// True, False, True in this run, before the Node is read (the API
	// server not reached yet).
	s.Set(cond("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", "a"), t0.Add(time.Minute))
	s.Set(cond("ClockNotSynchronized", StatusFalse, "ClockSynchronized", "b"), t0.Add(2*time.Minute))
	again := t0.Add(3 * time.Minute)
	s.Set(cond("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", "c"), again)
	if s.Adopt(nodeTrue("ClockNotSynchronized", "ClockUnsynchronized"), "b") {
		t.Error("the Node's time from before the step replaced the change this run saw")
	}
	if c, _ := s.Get("ClockNotSynchronized"); !c.LastTransitionTime.Equal(again) {
		t.Errorf("ClockNotSynchronized = %+v; want True since %v", c, again)
	}

	// The same from the state file: the times decide.
	s = restarted(t, s)
	if !s.Adopt(nodeTrue("DiskUsageHigh", "FilesystemSpaceHigh"), "b") {
		t.Error("the Node's later True did not replace the state file's older False")
	}
	if !s.Adopt(nodeTrue("ClockNotSynchronized", "ClockUnsynchronized"), "b") {
		t.Error("the Node's later time did not replace the state file's")
	}
}

// A kernel condition the Node shows True in this boot has been True since
// its time: held until reboot, it never turned False. After a start that
// lost the state file, with the line gone from the ring buffer (a flood),
// the reader's catching up decides False, and a later line (a hung task
// logged again 120 s on) True: a change from one decided status to
// another, which kept its own time over the Node's while the API server
// had not answered yet. The Node's lastTransitionTime stays, as it does
// when the Node is read first.
func TestAdoptHeldConditionKeepsTheNodesTimeOverALostLine(t *testing.T) {
	boot := t0
	since := boot.Add(10 * time.Minute)
	now := boot.Add(time.Hour)
	s := NewStore("b")
	s.SetBootStart(boot)
	s.Set(cond("KernelDeadlock", StatusUnknown, ReasonNoData, "the kernel log has not been read yet"), now)
	s.Set(cond("KernelDeadlock", StatusFalse, "KernelHasNoDeadlock", "no matching kernel message"), now.Add(time.Second))
	s.Set(cond("KernelDeadlock", StatusTrue, ReasonCriticalTaskHung, "INFO: task kubelet:1 blocked for more than 120 seconds."), now.Add(2*time.Minute))
	s.Adopt(Condition{Type: "KernelDeadlock", Status: StatusTrue, Reason: ReasonCriticalTaskHung, Message: "on the node", LastTransitionTime: since}, "b")
	if c, _ := s.Get("KernelDeadlock"); c.Status != StatusTrue || !c.LastTransitionTime.Equal(since) {
		t.Errorf("KernelDeadlock = %+v; want True since the Node's %v", c, since)
	}
}

// restarted is the store a restart of the daemon reads from s's state
// file: what s evaluated is an earlier run's there, not this process's.
func restarted(t *testing.T, s *Store) *Store {
	t.Helper()
	dir := t.TempDir()
	if err := s.Save(dir, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	s2 := NewStore(s.bootID)
	if _, err := s2.Load(dir); err != nil {
		t.Fatal(err)
	}
	return s2
}

// What the store knows is as recent as its last evaluation: a check that
// ran after the restart and found the same status as a stale state file
// holds the later word, and a NoData a check decided (not the kernel log
// monitor's placeholder) is a result like any other.
func TestAdoptJudgesTheStoreByItsLastEvaluation(t *testing.T) {
	s := NewStore("b")
	s.Set(cond("CertRenewalFailing", StatusTrue, ReasonCertificateExpiringSoon, "stale state"), t0.Add(-time.Hour))
	s.Set(cond("CertRenewalFailing", StatusTrue, ReasonCertificateExpiringSoon, "the first run after the restart"), t0.Add(10*time.Minute))
	if s.Adopt(Condition{Type: "CertRenewalFailing", Status: StatusFalse, Reason: ReasonCertificatesValid, LastTransitionTime: t0}, "b") {
		t.Error("the Node's False, older than the store's last run, lowered its True")
	}
	if c, _ := s.Get("CertRenewalFailing"); c.Status != StatusTrue {
		t.Errorf("CertRenewalFailing = %+v", c)
	}
	s.Set(Condition{Type: "KubeletHeartbeatFailed", Status: StatusUnknown, Reason: ReasonNoData, Message: "no journal entries"}, t0.Add(10*time.Minute))
	if s.Adopt(Condition{Type: "KubeletHeartbeatFailed", Status: StatusFalse, Reason: "KubeletHeartbeatOK", LastTransitionTime: t0}, "b") {
		t.Error("a NoData a check decided after the Node's change lost to the Node")
	}
	// The Node's status changed after the store's last evaluation, the
	// state file's (one this process made is later than anything on the
	// Node): the Node wins, and the condition is not shown evaluated
	// before it changed.
	prior := NewStore("b")
	prior.Set(cond("DiskUsageHigh", StatusFalse, "DiskUsageOK", ""), t0.Add(-time.Hour))
	s = restarted(t, prior)
	if !s.Adopt(Condition{Type: "DiskUsageHigh", Status: StatusTrue, Reason: "FilesystemSpaceHigh", LastTransitionTime: t0}, "b") {
		t.Error("a store last evaluated an hour before the Node's change won")
	}
	if c, _ := s.Get("DiskUsageHigh"); c.LastUpdateTime.Before(c.LastTransitionTime) {
		t.Errorf("evaluated before it changed: %+v", c)
	}
}

// A new condition, status or reason asks for a save at once (Dirty); a new
// message alone, or TouchLater, for one that may wait (Later); the same
// condition again for none.
func TestStoreSaveUrgency(t *testing.T) {
	s := NewStore("boot1")
	got := func() string {
		out := ""
		select {
		case <-s.Dirty():
			out += "now"
		default:
		}
		select {
		case <-s.Later():
			out += "later"
		default:
		}
		return out
	}
	steps := []struct {
		what string
		c    Condition
		want string
	}{
		{"a new condition", cond("DisksFailure", StatusFalse, ReasonDisksHealthy, "1 error"), "now"},
		{"a new message", cond("DisksFailure", StatusFalse, ReasonDisksHealthy, "2 errors"), "later"},
		{"the same again", cond("DisksFailure", StatusFalse, ReasonDisksHealthy, "2 errors"), ""},
		{"a new status", cond("DisksFailure", StatusTrue, ReasonDiskIOErrors, "3 errors"), "now"},
		{"a new reason", cond("DisksFailure", StatusTrue, ReasonNVMeCriticalWarning, "3 errors"), "now"},
	}
	for i, st := range steps {
		s.Set(st.c, t0.Add(time.Duration(i)*time.Second))
		if g := got(); g != st.want {
			t.Errorf("%s: asked for %q, want %q", st.what, g, st.want)
		}
	}
	s.TouchLater()
	if g := got(); g != "later" {
		t.Errorf("TouchLater: asked for %q", g)
	}
}

// True, False, True through an API outage, then a restart before the API
// returns: the Node still shows the first True. The store saw the condition
// turn True again after that (the state file says so), and its later time
// is kept: taking the Node's older one would make a "True for N minutes"
// watcher (a MachineHealthCheck) act early. A True the store only found so
// at its start (the state file lost, then saved) is no such change: the
// Node's time, the one watchers have been timing, wins.
func TestAdoptKeepsAChangeTheNodeHasNotSeen(t *testing.T) {
	nodeTrue := Condition{Type: "DiskUsageHigh", Status: StatusTrue, Reason: "FilesystemSpaceHigh", Message: "on the node", LastTransitionTime: t0}
	restart := func(t *testing.T, s *Store) *Store {
		t.Helper()
		dir := t.TempDir()
		if err := s.Save(dir, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		s2 := NewStore("b")
		if _, err := s2.Load(dir); err != nil {
			t.Fatal(err)
		}
		return s2
	}

	s := NewStore("b")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "a"), t0)
	s.Set(cond("DiskUsageHigh", StatusFalse, "DiskUsageOK", "b"), t0.Add(time.Minute))
	again := t0.Add(2 * time.Minute)
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemInodesHigh", "c"), again)
	s = restart(t, s)
	if s.Adopt(nodeTrue, "b") {
		t.Error("the Node's older True time replaced the change the store saw")
	}
	if c, _ := s.Get("DiskUsageHigh"); !c.LastTransitionTime.Equal(again) {
		t.Errorf("after True, False, True and a restart: %+v; want True since %v", c, again)
	}

	s = NewStore("b") // started without its state file
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "a"), t0.Add(time.Hour))
	s = restart(t, s)
	if !s.Adopt(nodeTrue, "b") {
		t.Error("a True first seen at a start won over the Node's time")
	}
	if c, _ := s.Get("DiskUsageHigh"); !c.LastTransitionTime.Equal(t0) {
		t.Errorf("first seen at a start: %+v; want the Node's time %v", c, t0)
	}

	// A start without the state file: the kernel log monitor's placeholder
	// (Unknown, NoData), then True once the log is read, before the Node
	// is read. Deciding after a placeholder is no change seen: the Node's
	// time stays (a lost state file does not reset "True for 120 s").
	ro := Condition{Type: "ReadonlyFilesystem", Status: StatusTrue, Reason: "FilesystemIsReadOnly", Message: "on the node", LastTransitionTime: t0}
	s = NewStore("b")
	s.Set(cond("ReadonlyFilesystem", StatusUnknown, ReasonNoData, "the kernel log has not been read yet"), t0.Add(time.Hour))
	s.Set(cond("ReadonlyFilesystem", StatusTrue, "FilesystemIsReadOnly", "EXT4-fs (sda1): Remounting filesystem read-only"), t0.Add(time.Hour+time.Second))
	s.Adopt(ro, "b")
	if c, _ := s.Get("ReadonlyFilesystem"); !c.LastTransitionTime.Equal(t0) {
		t.Errorf("decided after the placeholder: %+v; want the Node's time %v", c, t0)
	}
}
