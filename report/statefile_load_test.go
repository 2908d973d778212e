package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeStateFile writes sf as the state file in dir.
func writeStateFile(t testing.TB, dir string, sf stateFile) {
	t.Helper()
	b, err := json.Marshal(sf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StateFileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A state file that holds a message longer than MaxMessageLen (written by
// hand, by another build, or garbled within valid JSON) restores it capped,
// as Set would have stored it: before, it went to the Node's condition
// whole, up to the state file's 4 MiB.
func TestLoadCapsRestoredMessages(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 5000)
	writeStateFile(t, dir, stateFile{Version: stateVersion, BootID: "boot1", SavedAt: t0,
		Conditions: []Condition{
			{Type: "DiskUsageHigh", Status: StatusTrue, Reason: ReasonFilesystemSpaceHigh, Message: long, LastTransitionTime: t0, LastUpdateTime: t0},
			{Type: "DisksFailure", Status: StatusTrue, Reason: ReasonDiskIOErrors, Message: long, LastTransitionTime: t0, LastUpdateTime: t0},
		},
		Parts: map[string]map[string]Condition{"DisksFailure": {
			"kernel-io-errors": {Type: "DisksFailure", Status: StatusTrue, Reason: ReasonDiskIOErrors, Message: long},
		}},
	})
	s := NewStore("boot1")
	if res, err := s.Load(dir); err != nil || res.Restored != 2 {
		t.Fatalf("Load = %+v, %v", res, err)
	}
	for _, c := range s.All() {
		if len(c.Message) > MaxMessageLen || !strings.HasSuffix(c.Message, "...(truncated)") {
			t.Errorf("%s restored with a message of %d bytes (%.20q...); want at most %d, truncated", c.Type, len(c.Message), c.Message, MaxMessageLen)
		}
	}
	for name, p := range s.parts["DisksFailure"] {
		if len(p.Message) > MaxMessageLen {
			t.Errorf("part %s restored with a message of %d bytes; want at most %d", name, len(p.Message), MaxMessageLen)
		}
	}
}

// FuzzLoadStateFile: whatever the state file holds, Load returns a nil
// error, never panics, and restores only conditions the catalog knows,
// with a reason valid for their status and a message within MaxMessageLen.
func FuzzLoadStateFile(f *testing.F) {
	s := NewStore("boot1")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var 95%"), t0)
	s.Set(cond("ClockNotSynchronized", StatusFalse, "ClockSynchronized", "ok"), t0.Add(time.Second))
	s.SetPart(SourceKmsg, cond("DisksFailure", StatusTrue, ReasonDiskIOErrors, "sda"), t0)
	seedDir := f.TempDir()
	if err := s.Save(seedDir, t0.Add(time.Minute)); err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(seedDir, StateFileName))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"version":1,"bootID":"boot1","conditions":[{"type":"DiskUsageHigh","status":"True","reason":"FilesystemSpaceHigh","message":"` + strings.Repeat("é", 700) + `"}]}`))
	f.Add([]byte(`{"version":1,"bootID":"boot1","conditions":[{"type":"Nope","status":"True"}],"parts":{"DisksFailure":{"x":{}}},"memos":{"k":1}}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, StateFileName), b, 0o600); err != nil {
			t.Fatal(err)
		}
		s := NewStore("boot1")
		if _, err := s.Load(dir); err != nil {
			t.Fatalf("Load: %v", err)
		}
		for _, c := range s.All() {
			desc, ok := Lookup(c.Type)
			if !ok || !desc.ValidReason(c.Status, c.Reason) {
				t.Fatalf("restored %+v: not in the catalog", c)
			}
			if len(c.Message) > MaxMessageLen {
				t.Fatalf("restored %s with a message of %d bytes", c.Type, len(c.Message))
			}
		}
		for typ, ps := range s.parts {
			for name, p := range ps {
				if len(p.Message) > MaxMessageLen {
					t.Fatalf("restored part %s/%s with a message of %d bytes", typ, name, len(p.Message))
				}
			}
		}
	})
}

// A condition of the state file without a transition time (edited by hand,
// the field dropped) is restored since the file's save time (now when the
// file has none either), and the Redaters are told; it counts as no change
// the store saw, so that the Node's time for the same status is adopted,
// not replaced by the save time (TestRestoredConditionWithoutATransitionTime
// in internal/daemon: the Node and a restart).
func TestLoadDatesAConditionWithoutATransitionTime(t *testing.T) {
	now := t0.Add(time.Hour)
	saved := now.Add(-10 * time.Minute)
	for _, tc := range []struct {
		name    string
		savedAt time.Time
		want    time.Time
	}{
		{"saved at", saved, saved},
		{"no save time", time.Time{}, now},
		{"a save time ahead of the clock", now.Add(time.Hour), now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeStateFile(t, dir, stateFile{Version: stateVersion, BootID: "b", SavedAt: tc.savedAt,
				Conditions: []Condition{
					{Type: "DiskUsageHigh", Status: StatusFalse, Reason: "DiskUsageOK"},
					{Type: "CNIUnhealthy", Status: StatusFalse, Reason: "CNIHealthy"},
				},
				Observed: []string{"CNIUnhealthy", "DiskUsageHigh"},
			})
			s := NewStore("b")
			s.SetBootStart(t0)
			s.SetClock(func() time.Time { return now })
			rec := &redateRecorder{}
			s.Observe(rec)
			if _, err := s.Load(dir); err != nil {
				t.Fatal(err)
			}
			for _, ty := range []string{"CNIUnhealthy", "DiskUsageHigh"} {
				if c, _ := s.Get(ty); !c.LastTransitionTime.Equal(tc.want) || c.LastUpdateTime.Before(c.LastTransitionTime) {
					t.Errorf("%s restored without a transition time: since %v, updated %v; want since %v", ty, c.LastTransitionTime, c.LastUpdateTime, tc.want)
				}
			}
			at := tc.want.Format(time.TimeOnly)
			if want := []string{"DiskUsageHigh state file 00:00:00>" + at, "CNIUnhealthy state file 00:00:00>" + at}; !slices.Equal(rec.redated, want) {
				t.Errorf("redated %q; want %q", rec.redated, want)
			}
			// The Node holds the same status since an hour before: its
			// time is the better word.
			since := t0
			if !s.Adopt(Condition{Type: "DiskUsageHigh", Status: StatusFalse, Reason: "DiskUsageOK", LastTransitionTime: since}, "b") {
				t.Error("the Node's time for the same status was not adopted")
			}
			if c, _ := s.Get("DiskUsageHigh"); !c.LastTransitionTime.Equal(since) {
				t.Errorf("DiskUsageHigh since %v after the Node's word; want the Node's %v", c.LastTransitionTime, since)
			}
		})
	}
}
