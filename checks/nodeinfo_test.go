package checks

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

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

func TestNodeInfoFreshThenOutdated(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	env := nodeInfoEnv(t, root, niT0.Add(90*time.Second))
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (last written 2026-12-02T18:00:00Z, 1m30s ago; max_age 5m0s)")

	// The sync loop stops writing: 5 minutes is still fresh, past it is not.
	env.Now = func() time.Time { return niT0.Add(5 * time.Minute) }
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (last written 2026-12-02T18:00:00Z, 5m0s ago; max_age 5m0s)")
	env.Now = func() time.Time { return niT0.Add(7 * time.Minute) }
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is older than 5m0s (last written 2026-12-02T18:00:00Z, 7m0s ago)")

	// It writes again.
	setMtime(t, root, niT0.Add(6*time.Minute+30*time.Second))
	probeNodeInfo(t, c, report.StatusFalse, report.ReasonNodeInfoFresh,
		"/var/lib/syself/nodes.json is fresh (last written 2026-12-02T18:06:30Z, 30s ago; max_age 5m0s)")
}

func TestNodeInfoMaxAgeIsConfigurable(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo")
	setMtime(t, root, niT0)
	env := nodeInfoEnv(t, root, niT0.Add(90*time.Second))
	env.Config.Checks.NodeInfoStale.MaxAge = config.Duration{Duration: time.Minute}
	c, _ := newNodeInfoCheck(env)
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoOutdated,
		"/var/lib/syself/nodes.json is older than 1m0s (last written 2026-12-02T18:00:00Z, 1m30s ago)")
}

func TestNodeInfoTornWrite(t *testing.T) {
	root := nodeInfoRoot(t, "nodeinfo-torn")
	setMtime(t, root, niT0)
	c, _ := newNodeInfoCheck(nodeInfoEnv(t, root, niT0.Add(10*time.Second)))
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoInvalid,
		"/var/lib/syself/nodes.json is not valid JSON (150 bytes; a torn write?) (last written 2026-12-02T18:00:00Z, 10s ago)")
}

func TestNodeInfoNeverExistedIsUnknown(t *testing.T) {
	env := nodeInfoEnv(t, nodeInfoRoot(t, ""), niT0)
	env.Memos = report.NewStore("boot-1") // the daemon
	c, _ := newNodeInfoCheck(env)
	for range 2 {
		probeNodeInfo(t, c, report.StatusUnknown, report.ReasonNodeInfoNotFound,
			"/var/lib/syself/nodes.json has not existed in this boot (no node-info sync loop on this node yet)")
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
		"/var/lib/syself/nodes.json is fresh (last written 2026-12-02T18:00:00Z, 1m0s ago; max_age 5m0s)")
	if err := os.Remove(filepath.Join(root, nodesJSON)); err != nil {
		t.Fatal(err)
	}
	probeNodeInfo(t, c, report.StatusTrue, report.ReasonNodeInfoMissing,
		"/var/lib/syself/nodes.json was present earlier in this boot and is gone")
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
		"/var/lib/syself/nodes.json is fresh (last written 2026-12-02T18:00:00Z, 1m0s ago; max_age 5m0s)")
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
		"/var/lib/syself/nodes.json was present earlier in this boot and is gone")

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
	env4 := nodeInfoEnv(t, root, niT0.Add(time.Hour))
	env4.Memos = s4
	c4, _ := newNodeInfoCheck(env4)
	probeNodeInfo(t, c4, report.StatusUnknown, report.ReasonNodeInfoNotFound,
		"/var/lib/syself/nodes.json has not existed in this boot (no node-info sync loop on this node yet)")
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
		"/var/lib/syself/nodes.json is fresh (last written 2026-12-02T18:00:00Z, 1m0s ago; max_age 5m0s)")

	env2 := *env // as the re-plan copies it
	c2, _ := newNodeInfoCheck(&env2)
	if err := os.Remove(filepath.Join(root, nodesJSON)); err != nil {
		t.Fatal(err)
	}
	probeNodeInfo(t, c2, report.StatusTrue, report.ReasonNodeInfoMissing,
		"/var/lib/syself/nodes.json was present earlier in this boot and is gone")
}
