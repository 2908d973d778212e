package checks

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// What HidFailed keeps in the state file (84c0b51: the invocation a
// restart found the unit failed at, and its result) across what a state
// file meets: a daemon restarted in the same boot reads it back; a state
// file of the build before (no such field) reads as nothing hidden, without
// an error; a reboot drops it (the memos are this boot's only), so a
// saved invocation never matches a unit of the next boot; a new
// invocation ends it; and a unit the configuration no longer names leaves
// the state file (Watch), so the memory does not grow with renamed units.
func TestHidFailedAcrossTheStateFile(t *testing.T) {
	const kl = "kubelet.service"
	failed := systemd.Unit{Name: kl, LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code", Invocation: "inv-a"}
	left := failed
	left.ActiveState, left.SubState, left.Result = "inactive", "dead", "success"
	m := newFakeManager(failed)
	dir := t.TempDir()
	st := report.NewStore("boot-1")
	if _, err := st.Load(dir); err != nil {
		t.Fatal(err)
	}
	r := NewRepairer(m, quietLog(), time.Now, nil)
	r.KeepIn(st)
	r.Watch([]string{kl, "containerd.service"})
	if res, msg := r.Repair(context.Background(), kl, time.Minute, "healthz failed"); res != RepairRestarted {
		t.Fatalf("the repair: %s %q", res, msg)
	}
	r.Wait()
	if res, ok := r.HidFailed(left); !ok || res != "exit-code" {
		t.Fatalf("left inactive at the invocation it failed at: %q %v, want exit-code true", res, ok)
	}
	if err := st.Save(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	reload := func(boot string, watch ...string) *Repairer {
		t.Helper()
		s := report.NewStore(boot)
		if _, err := s.Load(dir); err != nil {
			t.Fatal(err)
		}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		r.KeepIn(s)
		if watch != nil {
			r.Watch(watch)
		}
		return r
	}
	if res, ok := reload("boot-1").HidFailed(left); !ok || res != "exit-code" {
		t.Errorf("a daemon restarted in the boot: %q %v, want exit-code true", res, ok)
	}
	if _, ok := reload("boot-2").HidFailed(left); ok {
		t.Errorf("after a reboot, a unit at the saved invocation reads as hidden")
	}
	again := left
	again.Invocation = "inv-b"
	if _, ok := reload("boot-1").HidFailed(again); ok {
		t.Errorf("a unit run since (a new invocation) reads as hidden")
	}

	// The state file of the build before: no resetFailedAt nor
	// resetFailedResult.
	path := filepath.Join(dir, "state.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	units := raw["memos"].(map[string]any)[RepairKey].(map[string]any)
	saved := units[kl].(map[string]any)
	if saved["resetFailedAt"] != "inv-a" || saved["resetFailedResult"] != "exit-code" {
		t.Fatalf("the state file's repair of %s: %v, want resetFailedAt inv-a, resetFailedResult exit-code", kl, saved)
	}
	delete(saved, "resetFailedAt")
	delete(saved, "resetFailedResult")
	if b, err = json.Marshal(raw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	old := reload("boot-1")
	if _, ok := old.HidFailed(left); ok {
		t.Errorf("a state file of the build before reads as hidden")
	}
	if s := old.Status(kl); s.Repairs != 1 {
		t.Errorf("a state file of the build before: %+v, want its 1 repair read back", s)
	}
	if err := st.Save(dir, time.Now()); err != nil { // the new build's file again
		t.Fatal(err)
	}

	// kubelet's unit renamed in the configuration: the old name's
	// memory is dropped, and not saved again.
	s := report.NewStore("boot-1")
	if _, err := s.Load(dir); err != nil {
		t.Fatal(err)
	}
	renamed := NewRepairer(m, quietLog(), time.Now, nil)
	renamed.KeepIn(s)
	renamed.Watch([]string{"kubelet2.service"})
	if _, ok := renamed.HidFailed(left); ok {
		t.Errorf("a unit the configuration no longer names reads as hidden")
	}
	if err := s.Save(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	var after struct {
		Memos map[string]map[string]json.RawMessage `json:"memos"`
	}
	if err := json.Unmarshal(b, &after); err != nil {
		t.Fatal(err)
	}
	if _, ok := after.Memos[RepairKey][kl]; ok {
		t.Errorf("the state file still keeps %s, which the configuration no longer names: %s", kl, after.Memos[RepairKey][kl])
	}
}
