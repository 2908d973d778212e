package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// `check --json` carries a filesystem whose statfs failed in its storage
// document, as the daemon writes it to the Node: its mount point, type and
// source and an `error`, no figures, beside the measured one; the
// condition is as before (False on the measured filesystem, the other
// named "not checked"). The statfs is the real one: the mount point
// /srv/gone is not under the host root (ENOENT). Fails before: the storage
// document listed "/" alone.
func TestCheckJSONListsAFilesystemNotMeasured(t *testing.T) {
	cfg := fakeHost(t, "[checks.DiskUsageHigh]\nspace_percent = 99\ninodes_percent = 99\n")
	root := filepath.Dir(cfg)
	mi := "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n30 22 8:17 / /srv/gone rw,relatime shared:9 - xfs /dev/sdb1 rw\n"
	if err := os.WriteFile(filepath.Join(root, "proc/self/mountinfo"), []byte(mi), 0o644); err != nil {
		t.Fatal(err)
	}
	_, out, stderr := run(t, "check", "--json", "--only", "DiskUsageHigh", "--config", cfg)
	var res checkOutput
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s\n%s", err, out, stderr)
	}
	var row checkRow
	for _, r := range res.Conditions {
		if r.Type == "DiskUsageHigh" {
			row = r
		}
	}
	if want := "1 filesystem not over 99% space and 99% inodes; not checked: statfs /srv/gone: no such file or directory"; row.Status != report.StatusFalse || row.Message != want {
		t.Errorf("DiskUsageHigh = %s %q, want False %q", row.Status, row.Message, want)
	}
	var storage struct {
		Filesystems []map[string]json.RawMessage `json:"filesystems"`
	}
	if err := json.Unmarshal(res.Report["storage"], &storage); err != nil || len(storage.Filesystems) != 2 {
		t.Fatalf("report.storage = %s (%v), want 2 filesystems", res.Report["storage"], err)
	}
	measured, gone := storage.Filesystems[0], storage.Filesystems[1]
	if string(measured["mountPoint"]) != `"/"` || measured["usedPercent"] == nil || measured["error"] != nil {
		t.Errorf("first filesystem %s", res.Report["storage"])
	}
	var keys []string
	for k := range gone {
		keys = append(keys, k)
	}
	if string(gone["mountPoint"]) != `"/srv/gone"` || string(gone["fsType"]) != `"xfs"` || string(gone["source"]) != `"/dev/sdb1"` ||
		string(gone["error"]) != `"statfs: no such file or directory"` || len(gone) != 4 {
		t.Errorf("filesystem not measured: %s (keys %s), want mountPoint, fsType, source, error", res.Report["storage"], strings.Join(keys, " "))
	}
}
