package checks

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// A DisksFailure run that cannot list the NVMe controllers (the read of
// /sys/class/nvme fails: ENOTDIR here, EMFILE or EIO on a bad day) failed,
// and its condition says so: the disks document keeps the drives the run
// before read, named stale with the failure. Before, the failed run carried
// its empty list as what it collected, current: the document said `"disks":[]`
// ("no disks", an answer) under a fresh updatedAt, the drives gone and no
// "stale".
func TestDisksListingFailedKeepsTheDrivesStale(t *testing.T) {
	f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A"}, "nvme1": {model: "B"}}}
	env := nvmeEnv(t, f)
	det := report.NewDetails()
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Details: det, Only: []string{"DisksFailure"}})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(context.Background())
	if d := docOf(t, det, "disks"); !strings.Contains(d, `"controller":"nvme0"`) || !strings.Contains(d, `"controller":"nvme1"`) {
		t.Fatalf("disks document after a run that read both drives: %s", d)
	}

	// The host's /sys/class/nvme read by the real lister, and failing.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/class"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "sys/class/nvme"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env.Config.HostRoot, env.NVMe = root, nil
	if _, err := env.nvme().Controllers(); err == nil {
		t.Fatal("listing a /sys/class/nvme that is a file did not fail")
	}
	r.RunOnce(context.Background())
	if c, _ := store.Get("DisksFailure"); c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed {
		t.Fatalf("DisksFailure after the failed listing: %+v", c)
	}
	d := docOf(t, det, "disks")
	var doc struct {
		Disks []NVMeHealth   `json:"disks"`
		Stale []report.Stale `json:"stale"`
	}
	if err := json.Unmarshal([]byte(d), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Disks) != 2 || len(doc.Stale) != 1 || doc.Stale[0].Check != "DisksFailure" ||
		len(doc.Stale[0].Fields) != 1 || doc.Stale[0].Fields[0] != "disks" || !strings.Contains(doc.Stale[0].Error, "not a directory") {
		t.Errorf("disks document after a run that could not list the drives: want both drives, stale with the failure: %s", d)
	}
}

// The edges of a listing that fails (held): the very first run failing has
// no list to keep (the document has no "disks" and no "stale": README's "a
// check that never decided has no fields"); a node with no NVMe at all
// (/sys/class/nvme absent) is an answer, "disks":[] and nothing stale; and a
// listing that works again replaces the stale list, "stale" gone.
func TestDisksListingFailedEdges(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/class"), 0o755); err != nil {
		t.Fatal(err)
	}
	nvme := filepath.Join(root, "sys/class/nvme")
	if err := os.WriteFile(nvme, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := testEnv(t, nil)
	env.Config.HostRoot, env.NVMe = root, nil
	det := report.NewDetails()
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Details: det, Only: []string{"DisksFailure"}})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(context.Background())
	if c, _ := store.Get("DisksFailure"); c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed {
		t.Fatalf("DisksFailure after a first run that could not list the drives: %+v", c)
	}
	if d := docOf(t, det, "disks"); strings.Contains(d, `"disks"`) || strings.Contains(d, `"stale"`) {
		t.Errorf("disks document after a first run that could not list the drives: %s; want neither disks nor stale", d)
	}

	// No NVMe at all: the directory absent is no error.
	if err := os.Remove(nvme); err != nil {
		t.Fatal(err)
	}
	r.RunOnce(context.Background())
	if d := docOf(t, det, "disks"); !strings.Contains(d, `"disks":[]`) || strings.Contains(d, `"stale"`) {
		t.Errorf("disks document on a node without /sys/class/nvme: %s; want \"disks\":[], nothing stale", d)
	}

	// Drives listed, then the listing fails (stale), then it works again.
	env.NVMe = &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A"}}}
	r2, err := NewRunner(env, Options{Store: store, Details: det, Only: []string{"DisksFailure"}})
	if err != nil {
		t.Fatal(err)
	}
	r2.RunOnce(context.Background())
	env.NVMe = &fakeNVMe{err: errors.New("EMFILE")}
	r2.RunOnce(context.Background())
	if d := docOf(t, det, "disks"); !strings.Contains(d, `"controller":"nvme0"`) || !strings.Contains(d, `"stale"`) {
		t.Fatalf("disks document after the listing failed: %s; want nvme0, stale", d)
	}
	env.NVMe = &fakeNVMe{ctrls: map[string]fakeDrive{"nvme1": {model: "B"}}}
	r2.RunOnce(context.Background())
	if d := docOf(t, det, "disks"); strings.Contains(d, `"nvme0"`) || !strings.Contains(d, `"controller":"nvme1"`) || strings.Contains(d, `"stale"`) {
		t.Errorf("disks document once the listing works again: %s; want nvme1 alone, nothing stale", d)
	}
}
