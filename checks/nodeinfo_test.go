package checks

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

const nodesJSON = "/var/lib/syself/nodes.json"

// nodeInfoRoot copies the fixture tree testdata/roots/<name> into a
// temporary host root (the test sets mtimes and removes the file) and
// returns it.
func nodeInfoRoot(t *testing.T, name string) string {
	t.Helper()
	root := t.TempDir()
	if name == "" {
		return root
	}
	if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata/roots", name))); err != nil {
		t.Fatal(err)
	}
	return root
}

// nodeInfoEnv is an environment with the host root at root and the clock at now.
func nodeInfoEnv(t *testing.T, root string, now time.Time) *Env {
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Now = func() time.Time { return now }
	return env
}

// setBtime writes the host's /proc/stat with the boot at boot.
func setBtime(t *testing.T, root string, boot time.Time) {
	t.Helper()
	stat := fmt.Sprintf("cpu  1657328 0 623613 631556 7059 0 9667 0 0 0\nctxt 61728513\nbtime %d\nprocesses 512774\n", boot.Unix())
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, ProcStat), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
}

func setMtime(t *testing.T, root string, mtime time.Time) {
	t.Helper()
	if err := os.Chtimes(filepath.Join(root, nodesJSON), mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

func probeNodeInfo(t *testing.T, c Check, wantStatus report.Status, wantReason report.Reason, wantMsg string) {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != wantStatus || r.Reason != wantReason || r.Message != wantMsg {
		t.Errorf("got %s/%s %q (err %v)\nwant %s/%s %q", r.Status, r.Reason, r.Message, err, wantStatus, wantReason, wantMsg)
	}
}

var niT0 = time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC)

// niBoot is the boot time in the fixtures' proc/stat (btime 1796230800).
var niBoot = niT0.Add(-time.Hour)

func TestNodeInfoFreshThenOutdated(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	env := nodeInfoEnv(t, root, niT0.Add(90*time.Second))
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")

	// The sync loop stops writing: 5 minutes is still fresh, past it is not.
	env.Now = func() time.Time { return niT0.Add(5 * time.Minute) }
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
	env.Now = func() time.Time { return niT0.Add(7 * time.Minute) }
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is older than 5m0s (last written 2026-12-02T18:00:00Z)")

	// It writes again.
	setMtime(t, root, niT0.Add(6*time.Minute+30*time.Second))
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
}

func TestNodeInfoMaxAgeIsConfigurable(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	env := nodeInfoEnv(t, root, niT0.Add(90*time.Second))
	env.Config.Checks.NodeInfoStale.MaxAge = config.Duration{Duration: time.Minute}
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is older than 1m0s (last written 2026-12-02T18:00:00Z)")
}

func TestNodeInfoTornWrite(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo-torn")
	setMtime(t, root, niT0)
	c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niT0.Add(10*time.Second)))
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoInvalid,
		"/var/lib/syself/nodes.json is not valid JSON (150 bytes; a torn write?) (last written 2026-12-02T18:00:00Z)")
}

func TestNodeInfoNeverExistedIsUnknown(t *testing.T) {
	env := nodeInfoEnv(t, nodeInfoRoot(t, ""), niT0)
	env.Memos = report.NewStore("boot-1") // the daemon
	c, _ := newNodeInfoCheck(env)
	for range 2 {
		probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound,
			"/var/lib/syself/nodes.json does not exist and has not been written in this boot (no node-info sync loop on this node yet)")
	}
	// The one-shot check (no memos) does not know what the daemon saw.
	c2, _ := newNodeInfoCheck(nodeInfoEnv(t, nodeInfoRoot(t, ""), niT0))
	probeNodeInfo(t, c2, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json does not exist (no node-info sync loop on this node?)")
}

func TestNodeInfoDeletedAfterSeen(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niT0.Add(time.Minute)))
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
	if err := os.Remove(filepath.Join(root, nodesJSON)); err != nil {
		t.Fatal(err)
	}
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoMissing,
		"/var/lib/syself/nodes.json was written earlier in this boot and is gone")
}

// A daemon restart within the boot: the fact that the file was seen is kept
// in the state file, so a file deleted while the daemon was down is
// NodeInfoMissing, not NodeInfoNotFound; in a new boot it is forgotten.
func TestNodeInfoSeenSurvivesRestartWithinBoot(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	state := t.TempDir()
	setMtime(t, root, niT0)

	// First daemon: sees the file, saves the state.
	s1 := report.NewStore("boot-1")
	env := nodeInfoEnv(t, root, niT0.Add(time.Minute))
	env.Memos = s1
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
	select {
	case <-s1.Dirty():
	default:
		t.Error("seeing the file for the first time did not mark the state dirty")
	}
	if err := s1.Save(state, niT0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}

	// The file is deleted while the daemon is down.
	if err := os.Remove(filepath.Join(root, nodesJSON)); err != nil {
		t.Fatal(err)
	}

	// Second daemon, same boot: loads the state before its first probe.
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	env2 := nodeInfoEnv(t, root, niT0.Add(2*time.Minute))
	env2.Memos = s2
	c2, _ := newNodeInfoCheck(env2)
	probeNodeInfo(t, c2, report.StatusTrue, report.ReasonNodeInfoMissing,
		"/var/lib/syself/nodes.json was written earlier in this boot and is gone")

	// And it keeps saving the fact: a third daemon of the same boot knows it too.
	if err := s2.Save(state, niT0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	s3 := report.NewStore("boot-1")
	if _, err := s3.Load(state); err != nil {
		t.Fatal(err)
	}
	var saved nodeInfoSeen
	if !s3.Memo(NodeInfoKey, &saved) || !saved.Seen {
		t.Errorf("third daemon of the boot: memo %+v, want seen", saved)
	}

	// A new boot: the saved fact belongs to the old one.
	s4 := report.NewStore("boot-2")
	if _, err := s4.Load(state); err != nil {
		t.Fatal(err)
	}
	setBtime(t, root, niT0.Add(55*time.Minute))
	env4 := nodeInfoEnv(t, root, niT0.Add(time.Hour))
	env4.Memos = s4
	c4, _ := newNodeInfoCheck(env4)
	probeNodeInfo(t, c4, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json does not exist and has not been written in this boot (no node-info sync loop on this node yet)")

	// Nor does a file the old boot left on /var/lib count in the new one.
	if err := os.WriteFile(filepath.Join(root, nodesJSON), []byte(`{"nodes":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	setMtime(t, root, niT0.Add(50*time.Minute))
	probeNodeInfo(t, c4, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T18:50:00Z, boot at 2026-12-02T18:55:00Z) and has not been written in this boot (no node-info sync loop on this node yet?)")
}

// A re-plan (the node's role re-detected) builds the check again within the
// run: the new one resumes from the one it replaces, not from the state
// loaded at start, which did not know the file yet.
func TestNodeInfoSeenSurvivesReplan(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	s := report.NewStore("boot-1")
	if _, err := s.Load(t.TempDir()); err != nil { // no state file yet
		t.Fatal(err)
	}
	env := nodeInfoEnv(t, root, niT0.Add(time.Minute))
	env.Memos = s
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")

	env2 := *env // as the re-plan copies it
	c2, _ := newNodeInfoCheck(&env2)
	if err := os.Remove(filepath.Join(root, nodesJSON)); err != nil {
		t.Fatal(err)
	}
	probeNodeInfo(t, c2, report.StatusTrue, report.ReasonNodeInfoMissing,
		"/var/lib/syself/nodes.json was written earlier in this boot and is gone")
}

// The bug this guards against: nodes.json is on persistent /var/lib, so at
// the first probe of a new boot the file of the previous boot is there with
// its old mtime. It is not written in this boot, so not True (however old),
// until the sync loop writes it; then it is judged by its age as always.
func TestNodeInfoFromBeforeBootIsUnknown(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niBoot.Add(-10*time.Minute)) // the previous boot's last write
	env := nodeInfoEnv(t, root, niBoot.Add(3*time.Minute))
	env.Memos = report.NewStore("boot-1")
	c, _ := newNodeInfoCheck(env)
	const before = "/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:50:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in this boot (no node-info sync loop on this node yet?)"
	probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound, before)
	// The CNI takes minutes: still the old file, still Unknown.
	env.Now = func() time.Time { return niBoot.Add(9 * time.Minute) }
	probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound, before)

	// The sync loop writes it: judged by its age from now on.
	setMtime(t, root, niBoot.Add(9*time.Minute+30*time.Second))
	env.Now = func() time.Time { return niBoot.Add(10 * time.Minute) }
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
	env.Now = func() time.Time { return niBoot.Add(15 * time.Minute) }
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is older than 5m0s (last written 2026-12-02T17:09:30Z)")

	// The one-shot check knows the boot time too.
	root2 := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root2, niBoot.Add(-10*time.Minute))
	c2, _ := newNodeInfoCheck(nodeInfoEnv(t, root2, niBoot.Add(3*time.Minute)))
	probeNodeInfo(t, c2, report.StatusUnknown, report.ReasonNodeInfoNotFound, before)
}

// The spec's case: the sync loop is stuck from the start of a boot. The file
// an earlier boot left says the node has a sync loop; not rewritten by
// max_age + nodeInfoBootGrace after the boot, it is NodeInfoOutdated, not
// Unknown for the rest of the boot. Until then, Unknown (a fresh boot is not
// a stuck sync loop); an absent file stays Unknown however long after boot.
func TestNodeInfoNotRewrittenAfterBootIsOutdated(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niBoot.Add(-2*time.Minute)) // the previous boot's last write
	env := nodeInfoEnv(t, root, niBoot.Add(time.Minute))
	env.Memos = report.NewStore("boot-1")
	c, _ := newNodeInfoCheck(env)
	const before = "/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:58:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in this boot (no node-info sync loop on this node yet?)"
	for _, after := range []time.Duration{time.Minute, 10 * time.Minute, 15 * time.Minute} {
		env.Now = func() time.Time { return niBoot.Add(after) }
		probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound, before)
	}
	env.Now = func() time.Time { return niBoot.Add(15*time.Minute + time.Second) }
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:58:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in the more than 15m0s since boot (max_age 5m0s + 10m0s to start after a boot): the node-info sync loop has not run in this boot")
	const sixHours = "/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:58:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in the more than 15m0s since boot (max_age 5m0s + 10m0s to start after a boot): the node-info sync loop has not run in this boot"
	env.Now = func() time.Time { return niBoot.Add(6 * time.Hour) }
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated, sixHours)

	// A daemon started late in the boot (or the one-shot check) says so at
	// once: the file unchanged since it first found it proves nothing.
	c2, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niBoot.Add(6*time.Hour)))
	probeNodeInfo(t, c2, report.StatusTrue, report.ReasonNodeInfoOutdated, sixHours)

	// The sync loop writes at last: judged by its age from now on.
	setMtime(t, root, niBoot.Add(6*time.Hour-30*time.Second))
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")

	// The grace counts from max_age as configured.
	root3 := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root3, niBoot.Add(-2*time.Minute))
	env3 := nodeInfoEnv(t, root3, niBoot.Add(11*time.Minute))
	env3.Config.Checks.NodeInfoStale.MaxAge = config.Duration{Duration: time.Minute}
	c3, _ := newNodeInfoCheck(env3)
	probeNodeInfo(t, c3, report.StatusUnknown, report.ReasonNodeInfoNotFound, before)
	env3.Now = func() time.Time { return niBoot.Add(12 * time.Minute) }
	probeNodeInfo(t, c3, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:58:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in the more than 11m0s since boot (max_age 1m0s + 10m0s to start after a boot): the node-info sync loop has not run in this boot")

	// No file at all, hours after boot: no sync loop known, still Unknown.
	env4 := nodeInfoEnv(t, nodeInfoRoot(t, "nodeinfo"), niBoot.Add(6*time.Hour))
	if err := os.Remove(filepath.Join(env4.Config.HostRoot, nodesJSON)); err != nil {
		t.Fatal(err)
	}
	c4, _ := newNodeInfoCheck(env4)
	probeNodeInfo(t, c4, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json does not exist (no node-info sync loop on this node?)")
}

// The largest max_age a duration holds ("2562047h47m16s", which the
// configuration accepts) leaves a file from an earlier boot Unknown after
// the boot: before, max_age + nodeInfoBootGrace overflowed to a negative
// duration, and the file was NodeInfoOutdated at the first run of every
// boot, whatever the sync loop did.
func TestNodeInfoLargestMaxAgeDoesNotOverflow(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niBoot.Add(-2*time.Minute))
	env := nodeInfoEnv(t, root, niBoot.Add(time.Minute))
	env.Config.Checks.NodeInfoStale.MaxAge = config.Duration{Duration: math.MaxInt64}
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:58:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in this boot (no node-info sync loop on this node yet?)")
}

// A file written exactly at the boot time (btime has whole seconds) counts.
func TestNodeInfoWrittenAtBootTime(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niBoot)
	c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niBoot.Add(time.Minute)))
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
}

// A torn file left by a power cut in the previous boot is not this boot's
// writer's fault: Unknown, not NodeInfoInvalid.
func TestNodeInfoTornBeforeBootIsUnknown(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo-torn")
	setMtime(t, root, niBoot.Add(-time.Second))
	c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niBoot.Add(time.Minute)))
	probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:59:59Z, boot at 2026-12-02T17:00:00Z) and has not been written in this boot (no node-info sync loop on this node yet?)")
}

// A file that changed since the check first found it was written in this
// boot, whatever its mtime says against the boot time (the clock may have
// been stepped since); and the first-found file is kept across a daemon
// restart within the boot.
func TestNodeInfoChangedSinceFirstFound(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	state := t.TempDir()
	setMtime(t, root, niBoot.Add(-10*time.Minute))
	s1 := report.NewStore("boot-1")
	env := nodeInfoEnv(t, root, niBoot.Add(time.Minute))
	env.Memos = s1
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json is from before this boot (last written 2026-12-02T16:50:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in this boot (no node-info sync loop on this node yet?)")
	if err := s1.Save(state, niBoot.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}

	// The daemon restarts; meanwhile the file is replaced (a new inode)
	// with an mtime that is still before the boot time.
	p := filepath.Join(root, nodesJSON)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(`{"nodes":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	setMtime(t, root, niBoot.Add(-time.Minute))
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	env2 := nodeInfoEnv(t, root, niBoot.Add(2*time.Minute))
	env2.Memos = s2
	c2, _ := newNodeInfoCheck(env2)
	probeNodeInfo(t, c2, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")
}

// An mtime in the future (the clock was stepped back after the write) does
// not count as fresh: up to nodeInfoSkew ahead it is now; beyond it, a file
// written in this boot is NodeInfoInvalid until the sync loop writes it
// again, and one not known to be written in this boot stays Unknown.
func TestNodeInfoFutureMtime(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	env := nodeInfoEnv(t, root, niT0.Add(-30*time.Second))
	env.Memos = report.NewStore("boot-1")
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")

	// The clock is stepped back by an hour and nothing rewrites the file:
	// not fresh for the hour it would take the clock to catch up.
	env.Now = func() time.Time { return niT0.Add(-time.Hour + time.Minute) }
	const ahead = "/var/lib/syself/nodes.json is dated 2026-12-02T18:00:00Z, more than 1m0s ahead of the clock: its age cannot be told (the clock was stepped back?) until the sync loop writes it again"
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoInvalid, ahead)

	// The sync loop writes it again.
	setMtime(t, root, niT0.Add(-time.Hour+90*time.Second))
	env.Now = func() time.Time { return niT0.Add(-time.Hour + 2*time.Minute) }
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")

	// Not yet known to be written in this boot, a future mtime does not
	// tell that it was (nor is the boot time compared with it).
	root2 := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root2, niT0)
	c2, _ := newNodeInfoCheck(nodeInfoEnv(t, root2, niT0.Add(-2*time.Minute)))
	probeNodeInfo(t, c2, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json is dated 2026-12-02T18:00:00Z, more than 1m0s ahead of the clock: not known to be written in this boot (the clock was stepped back?) until the sync loop writes it")
}

// Without a readable boot time the check cannot tell whether the file was
// written in this boot: an error (CheckFailed), not a guess.
func TestNodeInfoBootTimeUnreadable(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	for name, stat := range map[string]string{
		"missing":  "",
		"no btime": "cpu  1 2 3\nctxt 5\n",
		"garbage":  "btime soon\n",
	} {
		if stat == "" {
			if err := os.Remove(filepath.Join(root, ProcStat)); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(filepath.Join(root, ProcStat), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
		c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niT0.Add(time.Minute)))
		if _, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "/proc/stat") {
			t.Errorf("%s: /proc/stat %q: error %v, want one naming /proc/stat", name, stat, err)
		}
	}
}

func TestParseBtime(t *testing.T) {
	data, err := os.ReadFile("testdata/roots/nodeinfo/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := parseBtime(data); err != nil || !got.Equal(niBoot) {
		t.Errorf("fixture: got %v, %v; want %v", got, err, niBoot)
	}
	for _, bad := range []string{"", "btime\n", "btime 0\n", "btime -5\n", "btime 12x\n", "xbtime 12\n", "btime 99999999999999999999\n"} {
		if got, err := parseBtime([]byte(bad)); err == nil {
			t.Errorf("%q: got %v, want an error", bad, got)
		}
	}
}

// The real thing: this host's btime is when CLOCK_BOOTTIME says the boot
// began (to the second btime has).
func TestBootTimeOfThisHost(t *testing.T) {
	env := testEnv(t, nil) // host root /
	got, err := env.BootTime()
	if err != nil {
		t.Fatal(err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	want := time.Now().Add(-time.Duration(ts.Nano()))
	if d := got.Sub(want); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("btime %v, CLOCK_BOOTTIME says %v (%v apart)", got, want, d)
	}
}

func FuzzParseBtime(f *testing.F) {
	if data, err := os.ReadFile("testdata/roots/nodeinfo/proc/stat"); err == nil {
		f.Add(data)
	}
	f.Add([]byte("btime 1796230800\n"))
	f.Add([]byte("btime \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, err := parseBtime(data); err == nil && got.Unix() <= 0 {
			t.Errorf("%q: accepted %v", data, got)
		}
	})
}

// Each of NodeInfoStale's states keeps its message from run to run while
// the state lasts: a message that changes is a write of the Node's status
// each run (report.Store.Set counts a new message as a change, and the
// reporter writes on a change), every minute for the whole boot on a node
// whose sync loop is stuck (NodeInfoOutdated) and on every healthy node
// (NodeInfoFresh: the sync loop rewrites the file more often than the check
// runs). Fails when a message carries the file's age ("7m0s ago"), the time
// since boot, how far ahead of the clock the file is, or (for Fresh) the
// mtime of the last write.
func TestNodeInfoMessageStaysTheSameRunToRun(t *testing.T) {
	for _, tc := range []struct {
		name, fixture string
		mtime, now    func(run time.Duration) time.Time
		status        report.Status
	}{
		{name: "fresh, rewritten every 30 s", fixture: "nodeinfo", status: report.StatusFalse,
			mtime: func(run time.Duration) time.Time { return niT0.Add(run*time.Minute - 30*time.Second) },
			now:   func(run time.Duration) time.Time { return niT0.Add(run * time.Minute) }},
		{name: "outdated", fixture: "nodeinfo", status: report.StatusTrue,
			mtime: func(time.Duration) time.Time { return niT0 },
			now:   func(run time.Duration) time.Time { return niT0.Add(7*time.Minute + run*time.Minute) }},
		{name: "torn write", fixture: "nodeinfo-torn", status: report.StatusTrue,
			mtime: func(time.Duration) time.Time { return niT0 },
			now:   func(run time.Duration) time.Time { return niT0.Add(10*time.Second + run*time.Minute) }},
		{name: "not written since boot", fixture: "nodeinfo", status: report.StatusTrue,
			mtime: func(time.Duration) time.Time { return niBoot.Add(-2 * time.Minute) },
			now:   func(run time.Duration) time.Time { return niBoot.Add(16*time.Minute + run*time.Minute) }},
		{name: "dated ahead of the clock", fixture: "nodeinfo", status: report.StatusUnknown,
			mtime: func(time.Duration) time.Time { return niT0.Add(time.Hour) },
			now:   func(run time.Duration) time.Time { return niT0.Add(run * time.Minute) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := nodeInfoRoot(t, tc.fixture)
			env := nodeInfoEnv(t, root, tc.now(0))
			c, _ := newNodeInfoCheck(env)
			var first string
			for run := range time.Duration(5) {
				setMtime(t, root, tc.mtime(run))
				env.Now = func() time.Time { return tc.now(run) }
				r, err := c.Probe(context.Background())
				if err != nil || r.Status != tc.status {
					t.Fatalf("run %d: %s/%s %q, %v; want %s", run, r.Status, r.Reason, r.Message, err, tc.status)
				}
				if run == 0 {
					first = r.Message
				} else if r.Message != first {
					t.Errorf("run %d: message %q\nchanged from %q", run, r.Message, first)
				}
			}
		})
	}
}

// A FIFO at the path is refused at once (Unknown, CheckFailed): before,
// the open waited for a writer that never came, the run was abandoned at
// its timeout and every later run found it still running.
func TestNodeInfoFIFOIsRefusedAtOnce(t *testing.T) {
	root := nodeInfoRoot(t, "")
	mkdir(t, filepath.Join(root, filepath.Dir(nodesJSON)))
	if err := unix.Mkfifo(filepath.Join(root, nodesJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niT0))
	if err, want := probeFIFO(t, c, filepath.Join(root, nodesJSON)), "/var/lib/syself/nodes.json is not a regular file (p---------)"; err == nil || err.Error() != want {
		t.Errorf("a FIFO: %v; want %q", err, want)
	}
}

// hostClock is a host whose wall clock can be stepped: up is the time since
// the boot (CLOCK_BOOTTIME), which a step does not move, and the wall clock
// is the boot's wall time plus up plus the steps so far.
type hostClock struct {
	Sys
	boot time.Time
	up   time.Duration
	step time.Duration
}

func (h *hostClock) SinceBoot() (time.Duration, error) { return h.up, nil }
func (h *hostClock) now() time.Time                    { return h.boot.Add(h.up + h.step) }

// A step of the clock between the sync loop's write and the next run does
// not make the file look old (a step forward) or dated ahead (a step back):
// the daemon saw it written since its last run, a minute ago by
// CLOCK_BOOTTIME, and the sync loop writes it again within the next
// minute. Before, each step of the clock (chrony's makestep, a VM resumed
// or migrated) set NodeInfoStale True for a run and cleared it the next, an
// alert for nothing. A file put in place with an old mtime (renamed from
// elsewhere, touch -d) is still judged by its mtime.
func TestNodeInfoWrittenBeforeAClockStep(t *testing.T) {
	const fresh = "/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)"
	for _, tc := range []struct {
		name string
		step time.Duration
	}{
		{"stepped forward 10 minutes", 10 * time.Minute},
		{"stepped back an hour", -time.Hour},
		{"stepped back 2 minutes", -2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, h, c := freshOnAHostClock(t, fresh)
			// The sync loop writes 30 s later; the clock is stepped 15 s
			// after that; the check runs 15 s later.
			h.up += 30 * time.Second
			writeNodesJSON(t, root, h.now())
			h.up += 15 * time.Second
			h.step += tc.step
			h.up += 15 * time.Second
			probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh, fresh)
			// Not written again (a sync loop writing every 2 minutes):
			// its age counts on from the write, not from the stepped clock.
			h.up += time.Minute
			probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh, fresh)
			// The sync loop is stuck from then on: older than max_age by
			// CLOCK_BOOTTIME is outdated, whatever the clock says.
			h.up += 4 * time.Minute
			r, err := c.Probe(context.Background())
			if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonNodeInfoOutdated {
				t.Errorf("6 min after the write, not written since: %s/%s %q, %v; want True/NodeInfoOutdated", r.Status, r.Reason, r.Message, err)
			}
			// It writes again, with the stepped clock.
			writeNodesJSON(t, root, h.now())
			h.up += 30 * time.Second
			probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh, fresh)
		})
	}

	// A file put in place between two runs with an mtime from long ago is
	// not taken for a write since the last run: still its mtime decides.
	root, h, c := freshOnAHostClock(t, fresh)
	writeNodesJSON(t, root, h.now().Add(-20*time.Minute))
	h.up += time.Minute
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is older than 5m0s (last written 2026-12-02T17:40:00Z)")
}

// freshOnAHostClock is a NodeInfoStale check on the host clock h (booted
// an hour ago), its memory kept, over a nodes.json under root written 30 s
// ago and probed once: False/NodeInfoFresh with the message fresh.
func freshOnAHostClock(t *testing.T, fresh string) (root string, h *hostClock, c Check) {
	t.Helper()
	root = nodeInfoRoot(t, "nodeinfo")
	h = &hostClock{boot: niBoot, up: time.Hour}
	env := nodeInfoEnv(t, root, niT0)
	env.Sys, env.Now, env.Memos = h, h.now, report.NewStore("boot-1")
	c, _ = newNodeInfoCheck(env)
	setMtime(t, root, h.now().Add(-30*time.Second))
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh, fresh)
	return root, h, c
}

// writeNodesJSON writes nodes.json as the sync loop does, by rename (a new
// inode), with the mtime at.
func writeNodesJSON(t *testing.T, root string, at time.Time) {
	t.Helper()
	p := filepath.Join(root, nodesJSON)
	if err := os.WriteFile(p+".tmp", []byte(`{"nodes":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p+".tmp", at, at); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
}

// path is applied by a reload (and by a restart with the state file): what
// the check knows of the file the old path named ("written in this boot",
// the file first found) is not the new path's. Before, a new path with no
// file yet was NodeInfoMissing, "written earlier in this boot and is gone",
// True at once, for a file that never was there; and a file an earlier
// boot left at the new path counted as written in this boot (the old
// path's "seen") and was judged by its mtime as one.
func TestNodeInfoPathChangedByAReload(t *testing.T) {
	const moved = "/var/lib/syself/v2/nodes.json"
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0.Add(-30*time.Second))
	env := nodeInfoEnv(t, root, niT0)
	env.Memos = report.NewStore("boot-1")
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (written within max_age 5m0s)")

	// The operator points the check at the new path and reloads; the new
	// sync loop has not written there yet.
	env2 := *env
	cfg := *env.Config
	cfg.Checks.NodeInfoStale.Path = moved
	env2.Config = &cfg
	c2, _ := newNodeInfoCheck(&env2)
	probeNodeInfo(t, c2, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		moved+" does not exist and has not been written in this boot (no node-info sync loop on this node yet)")

	// A file an earlier boot left there is not this boot's write: an hour
	// after the boot, the sync loop has not written it in this boot (not
	// "older than 5m0s", a write of this boot judged by its age).
	p := filepath.Join(root, moved)
	mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(`{"nodes":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, niBoot.Add(-time.Hour), niBoot.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	probeNodeInfo(t, c2, report.StatusTrue, report.ReasonNodeInfoOutdated,
		moved+" is from before this boot (last written 2026-12-02T16:00:00Z, boot at 2026-12-02T17:00:00Z) and has not been written in the more than 15m0s since boot (max_age 5m0s + 10m0s to start after a boot): the node-info sync loop has not run in this boot")

	// The sync loop writes it: judged by its age from then on.
	if err := os.Chtimes(p, niT0, niT0); err != nil {
		t.Fatal(err)
	}
	probeNodeInfo(t, c2, report.StatusFalse, report.ReasonNodeInfoFresh,
		moved+" is fresh (written within max_age 5m0s)")
}
