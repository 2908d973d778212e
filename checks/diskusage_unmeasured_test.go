package checks

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// storageFilesystems decodes the filesystems of a storage document, each
// entry as its own JSON object (to see which keys it has).
func storageFilesystems(t *testing.T, doc string) []map[string]json.RawMessage {
	t.Helper()
	var d struct {
		Filesystems []map[string]json.RawMessage `json:"filesystems"`
	}
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatalf("storage document %s: %v", doc, err)
	}
	return d.Filesystems
}

// figureKeys are the keys of a measured filesystem's entry that are
// figures: an entry of one that could not be measured has none of them.
var figureKeys = []string{"sizeBytes", "availBytes", "usedPercent", "inodes", "inodesUsedPercent"}

// A filesystem whose statfs fails (EIO) or hangs past its wait while the
// others answer is in the storage document, in mountinfo order, with its
// mount point, type and source and an `error`, and no figures (not a
// zero that would read as empty), as the disks document carries a drive
// it could not read; the condition is as before: the measured filesystem
// decides, the two others are named "not checked". Once the hung statfs
// returns, its entry has figures again. Fails before: the document's
// filesystems list was "/" alone, the two others gone as if unmounted.
func TestDiskUsageUnmeasuredFilesystemsAreInTheReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		root := t.TempDir()
		writeFile(t, root+"/proc/self/mountinfo", `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 8:17 / /srv/data rw,relatime shared:9 - xfs /dev/sdb1 rw
40 22 0:60 / /mnt/backup rw,relatime shared:20 - nfs4 10.0.0.9:/export rw,vers=4.2,hard
`)
		sys := &hangingSys{fakeSys: fakeSys{
			statfs:  map[string]unix.Statfs_t{root: st(1000, 95, 100, 5), root + "/mnt/backup": st(1000, 10, 100, 5)},
			statErr: map[string]error{root + "/srv/data": unix.EIO}},
			hang: []string{root + "/mnt/backup"}, release: make(chan struct{})}
		env := testEnv(t, func(c *config.Config) {
			c.HostRoot = root
			c.Checks.DiskUsageHigh.FSTypesExclude = "^tmpfs$" // NFS watched, as an operator may choose
		})
		env.Sys = sys
		r, _, det := diskUsageRunner(t, env)
		c := r.RunOnce(t.Context())[0]
		const wantMsg = "/ 95% of space used (threshold 90%); not checked: statfs /srv/data: input/output error; /mnt/backup (statfs hung: no answer within 5s; asked again once it answers)"
		if c.Status != report.StatusTrue || c.Reason != report.ReasonFilesystemSpaceHigh || c.Message != wantMsg {
			t.Errorf("DiskUsageHigh = %s/%s %q, want True/FilesystemSpaceHigh %q", c.Status, c.Reason, c.Message, wantMsg)
		}
		doc := docOf(t, det, "storage")
		fss := storageFilesystems(t, doc)
		want := []string{
			`{"mountPoint":"/","fsType":"ext4","source":"/dev/sda1","sizeBytes":4096000,"availBytes":204800,"usedPercent":95,"inodes":100,"inodesUsedPercent":5}`,
			`{"mountPoint":"/srv/data","fsType":"xfs","source":"/dev/sdb1","error":"statfs: input/output error"}`,
			`{"mountPoint":"/mnt/backup","fsType":"nfs4","source":"10.0.0.9:/export","error":"statfs hung: no answer within 5s; asked again once it answers"}`,
		}
		var d struct {
			Filesystems []json.RawMessage `json:"filesystems"`
		}
		json.Unmarshal([]byte(doc), &d)
		var got []string
		for _, e := range d.Filesystems {
			got = append(got, string(e))
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("storage filesystems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		for _, e := range fss[1:] {
			for _, k := range figureKeys {
				if _, ok := e[k]; ok {
					t.Errorf("entry of a filesystem not measured has %s: %s", k, doc)
				}
			}
		}
		// The hung statfs returns: the next run measures it again.
		close(sys.release)
		synctest.Wait()
		r.RunOnce(t.Context())
		fss = storageFilesystems(t, docOf(t, det, "storage"))
		if len(fss) != 3 || string(fss[2]["usedPercent"]) != "10" || fss[2]["error"] != nil {
			t.Errorf("after the hung statfs returned: %s", docOf(t, det, "storage"))
		}
	})
}

// Every statfs failed and LVM was not asked: the run fails as before
// (Unknown / CheckFailed, naming each), and carries its filesystems with
// their errors, current (not stale), as a disks run that could read no
// drive carries each with its error; the figures of the run before are
// not shown under a fresh updatedAt. Fails before: the document kept the
// earlier figures, stale.
func TestDiskUsageEveryStatfsFailedListsThem(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root+"/proc/self/mountinfo", `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 8:17 / /srv/data rw,relatime shared:9 - xfs /dev/sdb1 rw
`)
	sys := &fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 20, 100, 5), root + "/srv/data": st(1000, 20, 100, 5)}}
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Sys = sys
	r, _, det := diskUsageRunner(t, env)
	r.RunOnce(t.Context())
	sys.statErr = map[string]error{root: unix.EIO, root + "/srv/data": unix.EACCES}
	c := r.RunOnce(t.Context())[0]
	const wantMsg = `statfs /: input/output error\x0astatfs /srv/data: permission denied` // the message as the store keeps it
	if c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed || c.Message != wantMsg {
		t.Errorf("DiskUsageHigh = %s/%s %q, want Unknown/CheckFailed %q", c.Status, c.Reason, c.Message, wantMsg)
	}
	doc := docOf(t, det, "storage")
	fss := storageFilesystems(t, doc)
	if len(fss) != 2 || string(fss[0]["error"]) != `"statfs: input/output error"` || string(fss[1]["error"]) != `"statfs: permission denied"` ||
		fss[0]["usedPercent"] != nil || strings.Contains(doc, `"stale"`) {
		t.Errorf("storage document after every statfs failed: %s", doc)
	}
}

// Many filesystems that could not be measured, with mount points of
// kilobytes, do not break the document's bounds: it stays within
// MaxDocumentBytes, each entry's long strings cut (ending "…"), the list
// cut with filesystemsTruncated; the filesystem over its threshold, which
// the condition's True is about, is kept before them though it is listed
// last, and the entries not measured are kept before the healthy ones.
func TestDiskUsageManyUnmeasuredFilesystemsKeepTheBounds(t *testing.T) {
	root := t.TempDir()
	var mi strings.Builder
	mi.WriteString("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
	sys := &fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 20, 100, 5)}, statErr: map[string]error{}}
	mp := func(i int) string { return fmt.Sprintf("/srv/d%02d/%s", i, strings.Repeat("x", 2000)) }
	for i := range 40 {
		fmt.Fprintf(&mi, "%d 22 8:%d / %s rw,relatime - xfs /dev/sd%c1 rw\n", 30+i, 100+i, mp(i), 'a'+i%26)
		sys.statErr[root+mp(i)] = unix.EIO
	}
	mi.WriteString("90 22 8:99 / /var rw,relatime - ext4 /dev/sdz1 rw\n")
	sys.statfs[root+"/var"] = st(1000, 95, 100, 5)
	writeFile(t, root+"/proc/self/mountinfo", mi.String())
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Sys = sys
	c, err := newDiskUsageCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	res := probe(t, c)
	if res.Reason != report.ReasonFilesystemSpaceHigh || !strings.HasPrefix(res.Message, "/var 95% of space used (threshold 90%); not checked: statfs /srv/d00/") {
		t.Fatalf("DiskUsageHigh %s/%s %.200q", res.Status, res.Reason, res.Message)
	}
	det := report.NewDetails()
	det.Replace("DiskUsageHigh", res.Details)
	doc := docOf(t, det, "storage")
	if len(doc) > report.MaxDocumentBytes {
		t.Fatalf("storage document is %d bytes, over %d", len(doc), report.MaxDocumentBytes)
	}
	fss := storageFilesystems(t, doc)
	var m struct {
		Truncated int `json:"filesystemsTruncated"`
	}
	json.Unmarshal([]byte(doc), &m)
	if len(fss) < 2 || m.Truncated != 42-len(fss) {
		t.Fatalf("storage document keeps %d filesystems, %d left out, of 42: %s", len(fss), m.Truncated, doc)
	}
	t.Logf("storage document: %d bytes, %d filesystems kept, %d left out", len(doc), len(fss), m.Truncated)
	if last := fss[len(fss)-1]; string(last["mountPoint"]) != `"/var"` || string(last["usedPercent"]) != "95" {
		t.Errorf("the last entry kept is %v, want /var, the filesystem over its threshold", last)
	}
	for _, e := range fss[:len(fss)-1] {
		var mpt, errText string
		json.Unmarshal(e["mountPoint"], &mpt)
		json.Unmarshal(e["error"], &errText)
		if !strings.HasPrefix(mpt, "/srv/d") || !strings.HasSuffix(mpt, "…") || errText != "statfs: input/output error" || e["usedPercent"] != nil {
			t.Errorf("entry %.100s..., error %q: want a /srv mount point cut, its error, no figures", mpt, errText)
		}
	}
}
