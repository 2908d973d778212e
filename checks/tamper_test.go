package checks

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
	"golang.org/x/sys/unix"
)

// tamperHost is a host tree with protected files, a state directory and a
// clock, and builds the daemon's NodeTampered check for a boot as a daemon
// (re)start does.
type tamperHost struct {
	t        *testing.T
	root     string
	stateDir string
	now      time.Time
	memos    *report.Store
	// gpu: the node has an NVIDIA GPU; protect adds protected paths;
	// exclude is checks.NodeTampered.exclude; tolerate replaces
	// checks.NodeTampered.tolerate (nil: the default).
	gpu     bool
	protect []string
	// paths, when set, replaces the three default protected paths.
	paths []string
	// keeper, when set, is the daemon's keeper the check is built with (a
	// reload builds it again with the same one); nil: a new keeper of the
	// state directory, as a start makes.
	keeper   *tamper.Keeper
	exclude  []string
	tolerate []string
	// logs, when set, gets the check's log lines (else they are dropped).
	logs *testenv.SyncBuffer
	// malformed, when set, counts the lines of host input the check
	// skipped (Env.Malformed).
	malformed *MalformedLines
}

func newTamperHost(t *testing.T) *tamperHost {
	h := &tamperHost{t: t, root: t.TempDir(), stateDir: t.TempDir(), now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	h.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n")
	h.write("/etc/cni/net.d/05-cilium.conflist", "{}\n")
	h.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\n")
	if err := os.Symlink("05-cilium.conflist", h.path("/etc/cni/net.d/active")); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *tamperHost) path(p string) string { return filepath.Join(h.root, p) }

func (h *tamperHost) write(p, content string) {
	h.t.Helper()
	if err := os.MkdirAll(filepath.Dir(h.path(p)), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(h.path(p), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// start builds the check as a daemon starting in boot does: a new keeper of
// the same state directory, and the state file's memos of this boot (memos
// nil: the state file was lost).
func (h *tamperHost) start(boot string, memos *report.Store) *nodeTamperedCheck {
	h.t.Helper()
	env := testEnv(h.t, func(c *config.Config) {
		c.HostRoot = h.root
		c.StateDir = h.stateDir
		paths := []string{"/var/lib/kubelet/config.yaml", "/etc/cni/net.d", "/etc/kubernetes/kubelet.conf"}
		if h.paths != nil {
			paths = slices.Clone(h.paths)
		}
		c.Checks.NodeTampered.Paths = append(paths, h.protect...)
		c.Checks.NodeTampered.Exclude = h.exclude
		if h.tolerate != nil {
			c.Checks.NodeTampered.Tolerate = h.tolerate
		}
		c.Checks.NodeTampered.BaselineAfter = []string{"/etc/kubernetes/kubelet.conf"}
		c.Checks.NodeTampered.Settle = config.Duration{}
	})
	env.Now = func() time.Time { return h.now }
	if h.logs != nil {
		env.Log = slog.New(slog.NewTextHandler(h.logs, nil))
	}
	env.GPU = h.gpu
	env.Malformed = h.malformed
	env.BootID = boot
	env.Tamper = h.keeper
	if env.Tamper == nil {
		env.Tamper = tamper.NewKeeper(h.stateDir, boot, false)
	}
	if memos != nil {
		env.Memos = memos
	}
	c, err := newNodeTamperedCheck(env)
	if err != nil {
		h.t.Fatal(err)
	}
	return c.(*nodeTamperedCheck)
}

func (h *tamperHost) probe(c Check, want report.Status, reason report.Reason, msg string) Result {
	h.t.Helper()
	h.now = h.now.Add(time.Minute)
	res, err := c.Probe(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	if res.Status != want || res.Reason != reason || !strings.Contains(res.Message, msg) {
		h.t.Fatalf("got %s/%s %q, want %s/%s containing %q", res.Status, res.Reason, res.Message, want, reason, msg)
	}
	return res
}

func TestNodeTamperedChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *tamperHost)
		want   string
	}{
		{"add", func(h *tamperHost) { h.write("/etc/cni/net.d/00-evil.conflist", "{}") }, "/etc/cni/net.d/00-evil.conflist added"},
		{"remove", func(h *tamperHost) { os.Remove(h.path("/var/lib/kubelet/config.yaml")) }, "/var/lib/kubelet/config.yaml removed"},
		{"modify", func(h *tamperHost) {
			h.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}}\n")
		},
			"/var/lib/kubelet/config.yaml modified"},
		{"chmod", func(h *tamperHost) { os.Chmod(h.path("/etc/kubernetes/kubelet.conf"), 0o666) }, "/etc/kubernetes/kubelet.conf mode"},
		{"chown", func(h *tamperHost) {
			if err := os.Lchown(h.path("/etc/kubernetes/kubelet.conf"), 65534, 65534); err != nil {
				testenv.Skip(h.t, "chown needs root: "+err.Error())
			}
		}, "/etc/kubernetes/kubelet.conf owner"},
		{"symlink retarget", func(h *tamperHost) {
			os.Remove(h.path("/etc/cni/net.d/active"))
			os.Symlink("/tmp/evil", h.path("/etc/cni/net.d/active"))
		}, "/etc/cni/net.d/active link-target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTamperHost(t)
			c := h.start("boot-1", report.NewStore("boot-1"))
			h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline")
			tc.change(h)
			h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): "+tc.want)
		})
	}
}

func TestNodeTamperedStaysSet(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	digest := c.keeper.State().Baseline.Digest
	orig, _ := os.ReadFile(h.path("/var/lib/kubelet/config.yaml"))
	h.write("/var/lib/kubelet/config.yaml", "evil\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "modified")

	// Revert: still set.
	h.write("/var/lib/kubelet/config.yaml", string(orig))
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s)")

	// A daemon restart in the same boot reuses the baseline, still set.
	c2 := h.start("boot-1", memos)
	res := h.probe(c2, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s)")
	if got := c2.keeper.State().Baseline.Digest; got != digest {
		t.Errorf("restart in the boot: baseline %s, want the boot's %s", got, digest)
	}
	rep := res.Details[0].Value.(tamper.Report)
	if rep.Baseline == nil || rep.Baseline.Digest != digest || rep.Baseline.Files != 5 || len(rep.Changes) != 1 || rep.Changes[0].Kind != tamper.Modified {
		t.Errorf("report %+v", rep)
	}

	// A new boot takes a new baseline; the finding stays.
	c3 := h.start("boot-2", report.NewStore("boot-2"))
	h.probe(c3, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s)")
	b := c3.keeper.State().Baseline
	if b.BootID != "boot-2" || b.Digest == digest {
		t.Errorf("new boot: baseline %+v, want a new one for boot-2", b)
	}

	// Only a clear drops it; the next run takes a new baseline.
	if err := c3.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	h.probe(c3, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
}

func TestNodeTamperedNewBootNewBaseline(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	first := c.keeper.State().Baseline
	// Between boots (not seen by any baseline) a file changes: the new
	// boot's baseline holds it as it is.
	h.write("/etc/cni/net.d/05-cilium.conflist", `{"new": true}`)
	c2 := h.start("boot-2", report.NewStore("boot-2"))
	h.probe(c2, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	second := c2.keeper.State().Baseline
	if second.BootID != "boot-2" || second.Digest == first.Digest || !second.TakenAt.After(first.TakenAt) {
		t.Errorf("baselines %+v then %+v", first, second)
	}
}

func TestNodeTamperedCorruptBaselineIsAFinding(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	p := filepath.Join(h.stateDir, tamper.StateFileName)
	b, _ := os.ReadFile(p)
	// A baseline edited to hide a change, without its digest.
	os.WriteFile(p, []byte(strings.Replace(string(b), `"mode": 420`, `"mode": 438`, 1)), 0o600)
	c2 := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c2, report.StatusTrue, report.ReasonBaselineCorrupt, "tamper.json baseline-corrupt")
	if _, err := os.Stat(p + ".corrupt"); err != nil {
		t.Errorf("the corrupt file was not kept: %v", err)
	}
	// Not silently taken again: a new baseline is taken to go on watching,
	// and the finding stays.
	h.probe(c2, report.StatusTrue, report.ReasonBaselineCorrupt, "1 finding(s)")
}

func TestNodeTamperedBaselineGoneWithinTheBoot(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	if err := memos.Save(h.stateDir, h.now); err != nil { // the state file holds the baseline's digest
		t.Fatal(err)
	}
	os.Remove(filepath.Join(h.stateDir, tamper.StateFileName))
	restored := report.NewStore("boot-1")
	if _, err := restored.Load(h.stateDir); err != nil {
		t.Fatal(err)
	}
	c2 := h.start("boot-1", restored)
	h.probe(c2, report.StatusTrue, report.ReasonBaselineCorrupt, "is gone from the tamper state")
}

func TestNodeTamperedBaselinePending(t *testing.T) {
	h := newTamperHost(t)
	os.Remove(h.path("/etc/kubernetes/kubelet.conf"))
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/kubernetes/kubelet.conf before taking this boot's baseline")
	h.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\n")
	c.settle = 90 * time.Second
	h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "once the protected files are unchanged for 1m30s")
	h.write("/etc/cni/net.d/06-late.conflist", "{}") // still settling: the settle starts again
	h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "")
	h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "") // 1 min unchanged
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "6 protected paths")

	// After an operator's clear the baseline is taken at once, without
	// settling.
	c.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "test"})
	h.write("/etc/cni/net.d/07-accepted.conflist", "{}")
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "7 protected paths")

	// The one-shot check reads the daemon's baseline, never takes one.
	ro := testEnv(t, func(cfg *config.Config) {
		cfg.HostRoot, cfg.StateDir = h.root, t.TempDir()
	})
	ro.BootID = "boot-1"
	oc, _ := newNodeTamperedCheck(ro)
	res, _ := oc.Probe(context.Background())
	if res.Status != report.StatusUnknown || res.Reason != report.ReasonBaselinePending || !strings.Contains(res.Message, "holds no baseline of this boot (the daemon takes it)") {
		t.Errorf("one-shot check without a baseline: %+v", res)
	}
}

// fakeDM is the kernel's verity tables.
type fakeDM struct {
	targets []tamper.VerityTarget
	err     error
}

func (f *fakeDM) VerityTargets() ([]tamper.VerityTarget, error) { return f.targets, f.err }

const (
	hashA = "4392712ba01368efdf14b05c76f9e4df0d53664630b5d48632ed17a137f39076"
	hashB = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

func sealedEnv(t *testing.T, h *tamperHost, boot string, dm tamper.DM) Check {
	env := testEnv(t, func(c *config.Config) { c.HostRoot, c.StateDir = h.root, h.stateDir })
	env.Now = func() time.Time { return h.now }
	if h.logs != nil {
		env.Log = slog.New(slog.NewTextHandler(h.logs, nil))
	}
	env.GPU = h.gpu
	env.BootID = boot
	env.Tamper = tamper.NewKeeper(h.stateDir, boot, false)
	env.DM = dm
	c, err := newSealedOSCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func verity(name, hash string) tamper.VerityTarget {
	return tamper.VerityTarget{Device: name, Table: tamper.VerityTable{RootHash: hash}}
}

func TestSealedOSTampered(t *testing.T) {
	const rec = "/var/lib/syself/sealed-os/root-hashes"
	t.Run("match then swapped layer", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
		c := sealedEnv(t, h, "boot-1", dm)
		res := h.probe(c, report.StatusFalse, report.ReasonSealedOSIntact, "1 sealed layer(s) enforce their recorded root hash: root "+hashA)
		rep := res.Details[0].Value.(tamper.Report)
		if len(rep.SealedLayers) != 1 || rep.SealedLayers[0] != (tamper.LayerReport{Name: "root", Expected: hashA, Enforced: hashA, Status: "match"}) {
			t.Errorf("report layers %+v", rep.SealedLayers)
		}
		dm.targets = []tamper.VerityTarget{verity("root", hashB)}
		h.probe(c, report.StatusTrue, report.ReasonRootHashMismatch, "root root-hash-mismatch (recorded "+hashA+", enforced "+hashB+")")
		dm.targets = []tamper.VerityTarget{verity("root", hashA)} // back: stays set
		h.probe(c, report.StatusTrue, report.ReasonRootHashMismatch, "1 finding(s)")
		// A clear while the layer still mismatches: True again at once.
		dm.targets = []tamper.VerityTarget{verity("root", hashB)}
		c.(*sealedOSCheck).keeper.ClearAll(tamper.Clear{At: h.now, Reason: "test"})
		h.probe(c, report.StatusTrue, report.ReasonRootHashMismatch, "1 finding(s): root root-hash-mismatch")
	})
	t.Run("unrecorded verity device", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\n")
		c := sealedEnv(t, h, "boot-1", &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA), verity("extra", hashB)}})
		res := h.probe(c, report.StatusFalse, report.ReasonSealedOSIntact, "1 sealed layer(s)")
		layers := res.Details[0].Value.(tamper.Report).SealedLayers
		if len(layers) != 2 || layers[0].Name != "extra" || layers[0].Status != "not recorded" {
			t.Errorf("layers %+v", layers)
		}
	})
	// A layer's device whose table has more than its verity target: the
	// recorded hash covers only part of it. A device built by hand
	// (dmsetup create with two lines) can hold a verity target with the
	// recorded hash over the first sectors and another image's verity
	// target over the rest (the VM tier's sealed_os does it on a real
	// kernel); a target of another type beside a verity one the kernel
	// refuses, the check treats it as a mismatch all the same.
	t.Run("a second target in the layer's table", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			targets []tamper.VerityTarget
			want    string
		}{
			{"verity under another hash", []tamper.VerityTarget{
				{Device: "root", Table: tamper.VerityTable{RootHash: hashA}, Targets: 2},
				{Device: "root", Table: tamper.VerityTable{RootHash: hashB}, Targets: 2}},
				"root root-hash-mismatch (recorded " + hashA + ", enforced " + hashB + ")"},
			{"a target that is not verity", []tamper.VerityTarget{
				{Device: "root", Table: tamper.VerityTable{RootHash: hashA}, Targets: 2}},
				"root root-hash-mismatch (the table of root has 2 targets, 1 of them verity: part of the device is not verified)"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newTamperHost(t)
				h.write(rec, "root "+hashA+"\n")
				c := sealedEnv(t, h, "boot-1", &fakeDM{targets: tc.targets})
				res := h.probe(c, report.StatusTrue, report.ReasonRootHashMismatch, tc.want)
				if l := res.Details[0].Value.(tamper.Report).SealedLayers; len(l) != 1 || l[0].Status != "mismatch" {
					t.Errorf("layers %+v", l)
				}
			})
		}
	})
	t.Run("layer missing", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\nusr "+hashB+"\n")
		c := sealedEnv(t, h, "boot-1", &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}})
		h.probe(c, report.StatusTrue, report.ReasonSealedLayerMissing, "usr layer-missing")
	})
	t.Run("recorded hash altered in the boot", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
		c := sealedEnv(t, h, "boot-1", dm)
		h.probe(c, report.StatusFalse, report.ReasonSealedOSIntact, "")
		// A swapped layer with the record rewritten to match it.
		dm.targets = []tamper.VerityTarget{verity("root", hashB)}
		h.write(rec, "root "+hashB+"\n")
		// After a restart too: the first value of the boot is kept.
		c2 := sealedEnv(t, h, "boot-1", dm)
		h.probe(c2, report.StatusTrue, report.ReasonRootHashMismatch, "recorded-hash-altered (layer root: first read in this boot as \""+hashA+"\", now \""+hashB+"\")")
	})
	// Two layers swapped with the record rewritten to match both: one
	// finding of the record, recorded once, however many runs see it.
	// Before, each layer's difference was a finding of the same path with
	// its own detail, so each run found the record's latest finding
	// differing and added them all again: two findings every interval,
	// the reason turning RecordedHashAltered, and within hours the full
	// list made room by dropping the layers' mismatches and NodeTampered's
	// earlier findings.
	t.Run("recorded hashes of two layers altered", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\nusr "+hashB+"\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA), verity("usr", hashB)}}
		c := sealedEnv(t, h, "boot-1", dm)
		h.probe(c, report.StatusFalse, report.ReasonSealedOSIntact, "2 sealed layer(s)")
		dm.targets = []tamper.VerityTarget{verity("root", hashB), verity("usr", hashA)}
		h.write(rec, "root "+hashB+"\nusr "+hashA+"\n")
		for range 3 {
			h.probe(c, report.StatusTrue, report.ReasonRootHashMismatch,
				"3 finding(s): usr root-hash-mismatch (recorded "+hashB+", enforced "+hashA+"); root root-hash-mismatch")
		}
		st := c.(*sealedOSCheck).keeper.State()
		fs := st.FindingsFor(tamper.CondSealed)
		if len(fs) != 3 || fs[0].Kind != tamper.RecordAltered ||
			fs[0].Detail != `layer root: first read in this boot as "`+hashA+`", now "`+hashB+`"; layer usr: first read in this boot as "`+hashB+`", now "`+hashA+`"` {
			t.Errorf("findings %+v", fs)
		}
	})
	// A malformed file at its first reading in the boot is an error (the
	// runner's Unknown, CheckFailed): nothing was recorded to compare with.
	// Once read, the same file turning malformed is RecordedHashAltered.
	t.Run("malformed recorded file", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\nusr not-hex\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
		c := sealedEnv(t, h, "boot-1", dm)
		if _, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "recorded root hashes "+rec+": line 2") {
			t.Fatalf("first reading of a malformed file: err %v", err)
		}
		h.write(rec, "root "+hashA+"\n")
		h.probe(c, report.StatusFalse, report.ReasonSealedOSIntact, "")
		h.write(rec, "root "+hashA+"\nusr not-hex\n")
		h.probe(c, report.StatusTrue, report.ReasonRecordedHashAltered, rec+" recorded-hash-altered (no longer readable: line 2")
	})
	t.Run("no sealed layers", func(t *testing.T) {
		h := newTamperHost(t)
		c := sealedEnv(t, h, "boot-1", &fakeDM{err: tamper.ErrNoDeviceMapper})
		h.probe(c, report.StatusUnknown, report.ReasonNothingToCheck, "no sealed OS layers on this node: no device-mapper (no device-mapper control node), and no layer recorded in "+rec)
	})
	t.Run("enforced but nothing recorded", func(t *testing.T) {
		h := newTamperHost(t)
		c := sealedEnv(t, h, "boot-1", &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}})
		if _, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "does not exist: nothing recorded to compare them with") {
			t.Errorf("err %v", err)
		}
	})
}

// The real control node: a host without device-mapper says so (this
// machine's kernel has none; the VM tier reads a real verity table).
func TestDMControlWithoutDeviceMapper(t *testing.T) {
	_, err := tamper.DMControl{Path: filepath.Join(t.TempDir(), "control")}.VerityTargets()
	if err == nil || !strings.Contains(err.Error(), "no device-mapper control node") {
		t.Errorf("err %v", err)
	}
}

// File notifications wake the check on a change of a protected path (the
// kernel's inotify on this machine's filesystem): a write, and then a chmod,
// each wake it on their own. A write queues several events (create, modify,
// close) and the wake token is one: a chmod step watched by the same watcher
// could pass on a wake the write's later events left. So each change is
// watched by a watcher (and a wake channel) of its own, and the write's
// watcher has returned (Watch waits for its reader, so no more wakes can
// come from it) before the chmod's starts: the chmod step passes only on the
// chmod's own event (IN_ATTRIB; without it in the watch mask it fails).
func TestNodeTamperedWatchWakesOnAChange(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "") // hands the watcher its directories
	for _, step := range []struct {
		name   string
		change func()
		// finding: what the run after the change finds (that run also
		// hands the next watcher its directories).
		finding string
	}{
		{"write", func() { h.write("/etc/cni/net.d/00-evil.conflist", "{}") }, "/etc/cni/net.d/00-evil.conflist added"},
		{"chmod", func() {
			if err := os.Chmod(h.path("/var/lib/kubelet/config.yaml"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "/var/lib/kubelet/config.yaml mode"},
	} {
		woken, stop := watchWakes(c)
		// The run its new watches ask for says they are in place; then
		// one change must wake the check.
		awaitWatching(t, woken)
		step.change()
		ok := false
		select {
		case <-woken:
			ok = true
		case <-time.After(10 * time.Second):
		}
		// Quiet: this watcher's reader has returned, nothing wakes after
		// this; its channel (and a token the change's later events left
		// in it) is not the next step's.
		stop()
		if !ok {
			t.Fatalf("%s: no wake-up within 10s of the change", step.name)
		}
		h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, step.finding)
	}
}

// A mount over a protected file (a bind mount of another file) or over a
// directory on the way to one (a tmpfs over /var/lib/kubelet) sends
// inotify nothing, yet changes what the scan reads: the mount table's
// change wakes the check (real mounts, real inotify). Before, both waited
// for the interval's scan, up to 5 min.
func TestNodeTamperedWatchWakesOnAMountOverAProtectedPath(t *testing.T) {
	h := newTamperHost(t)
	h.write("/srv/evil", "apiVersion: v1\nclusters: [{cluster: {server: https://evil}}]\n")
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	var mounted []string
	t.Cleanup(func() { // before t.TempDir's removal, which a mount keeps busy
		for _, p := range slices.Backward(mounted) {
			unix.Unmount(p, unix.MNT_DETACH)
		}
	})
	for _, step := range []struct {
		name    string
		mount   func() (string, error)
		finding string
	}{
		{"a bind mount over a protected file", func() (string, error) {
			p := h.path("/etc/kubernetes/kubelet.conf")
			return p, unix.Mount(h.path("/srv/evil"), p, "", unix.MS_BIND, "")
		}, "/etc/kubernetes/kubelet.conf modified"},
		{"a tmpfs over a directory on the way", func() (string, error) {
			p := h.path("/var/lib/kubelet")
			return p, unix.Mount("tmpfs", p, "tmpfs", 0, "mode=0755")
		}, "/var/lib/kubelet/config.yaml removed"},
	} {
		woken, stop := watchWakes(c)
		awaitWatching(t, woken)
		p, err := step.mount()
		if err != nil {
			stop()
			testenv.Skip(t, "cannot mount (root in a mount namespace that allows it): "+err.Error())
		}
		mounted = append(mounted, p)
		ok := false
		select {
		case <-woken:
			ok = true
		case <-time.After(10 * time.Second):
		}
		stop()
		if !ok {
			t.Fatalf("%s: no wake-up within 10s of the mount", step.name)
		}
		h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, step.finding)
	}
}

// A pattern with a wildcard directory ("/etc/systemd/system/*.d/*.conf"):
// a file written into a matching directory that holds no protected file
// yet (a drop-in directory created empty, the file written a while later,
// as an editor does) wakes the check (real inotify). Before, only the
// directories of the entries and the pattern's fixed prefix were watched:
// the new directory was not, and the file waited for the interval's scan.
func TestNodeTamperedWatchWakesInANewWildcardDirectory(t *testing.T) {
	h := newTamperHost(t)
	h.protect = []string{"/etc/systemd/system/*.d/*.conf"}
	h.write("/etc/systemd/system/kubelet.service.d/10.conf", "[Service]\n")
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "6 protected paths unchanged")
	if err := os.Mkdir(h.path("/etc/systemd/system/evil.service.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The run the directory's creation wakes: nothing protected in it yet.
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "6 protected paths unchanged")
	woken, stop := watchWakes(c)
	defer stop()
	// The run its new watches ask for says they are in place.
	awaitWatching(t, woken)
	h.write("/etc/systemd/system/evil.service.d/x.conf", "[Service]\nExecStart=/evil\n")
	select {
	case <-woken:
		h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/systemd/system/evil.service.d/x.conf added")
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of a file written into a new drop-in directory")
	}
}

func TestNodeTamperedOverTheCapIsAFinding(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.spec.MaxEntries = 6
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	// Past the cap: a finding, and the paths within it are still compared.
	h.write("/etc/cni/net.d/00-a", "{}")
	h.write("/etc/cni/net.d/00-b", "{}")
	h.write("/var/lib/kubelet/config.yaml", "changed\n")
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "over-limit")
	for _, want := range []string{"/etc/cni/net.d/00-a added", "/var/lib/kubelet/config.yaml modified"} {
		if !strings.Contains(res.Message, want) {
			t.Errorf("message %q lacks %q", res.Message, want)
		}
	}
	// A file over 64 MiB is a finding, not an error.
	h2 := newTamperHost(t)
	c2 := h2.start("boot-1", report.NewStore("boot-1"))
	h2.probe(c2, report.StatusFalse, report.ReasonNodeIntact, "")
	h2.write("/etc/cni/net.d/big", "")
	if err := os.Truncate(h2.path("/etc/cni/net.d/big"), tamper.MaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	h2.probe(c2, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/cni/net.d/big added")
}

// Over the cap, a removal the cut scan would have read is a finding: the
// scan reads the patterns in order, and config.yaml's pattern is the first,
// read whole before the cut. A path of the baseline past the cut (the
// third pattern's kubelet.conf, where the cut fell) is not reported
// removed. Before, every removal was left out while over the cap, so the
// findings an operator reviews before a clear did not name it.
func TestNodeTamperedOverTheCapStillSeesARemoval(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.spec.MaxEntries = 6
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	if err := os.Remove(h.path("/var/lib/kubelet/config.yaml")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"00-a", "00-b", "00-c"} {
		h.write("/etc/cni/net.d/"+f, "{}")
	}
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/kubernetes/kubelet.conf over-limit")
	if !strings.Contains(res.Message, "/var/lib/kubelet/config.yaml removed") {
		t.Errorf("message %q does not name the removal within the cap", res.Message)
	}
	if strings.Contains(res.Message, "/etc/kubernetes/kubelet.conf removed") {
		t.Errorf("message %q names a path past the cut as removed", res.Message)
	}
}

func TestNodeTamperedBaselineMaxWait(t *testing.T) {
	t.Run("a file that keeps changing", func(t *testing.T) {
		h := newTamperHost(t)
		c := h.start("boot-1", report.NewStore("boot-1"))
		c.settle, c.maxWait = 90*time.Second, 5*time.Minute
		for i := range 5 { // a DaemonSet rewriting it every minute
			h.write("/etc/cni/net.d/05-cilium.conflist", fmt.Sprintf("{%d}\n", i))
			h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "unchanged for 1m30s (at most 5m)")
		}
		h.write("/etc/cni/net.d/05-cilium.conflist", "{5}\n")
		h.probe(c, report.StatusFalse, report.ReasonNodeIntact,
			"(baseline taken unsettled after 5m: /etc/cni/net.d/05-cilium.conflist still changing)")
		// Later changes are findings.
		h.write("/etc/cni/net.d/05-cilium.conflist", "{6}\n")
		h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/cni/net.d/05-cilium.conflist modified")
	})
	t.Run("a gate never met", func(t *testing.T) {
		h := newTamperHost(t)
		c := h.start("boot-1", report.NewStore("boot-1"))
		c.gate, c.maxWait = []string{"/etc/cni/net.d/*.conflist", "/etc/never"}, 3*time.Minute
		for range 3 {
			h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/never before taking this boot's baseline (at most 3m)")
		}
		h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "(baseline taken unsettled after 3m: nothing matched /etc/never)")
	})
	t.Run("a glob gate", func(t *testing.T) {
		h := newTamperHost(t)
		os.Remove(h.path("/etc/cni/net.d/05-cilium.conflist"))
		c := h.start("boot-1", report.NewStore("boot-1"))
		c.gate = []string{"/etc/cni/net.d/*.conflist"}
		h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/cni/net.d/*.conflist")
		h.write("/etc/cni/net.d/10-calico.conflist", "{}")
		res := h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
		if strings.Contains(res.Message, "unsettled") {
			t.Errorf("a settled baseline said unsettled: %q", res.Message)
		}
	})
}

// TestNodeTamperedWatchFollowsAReplacedDirectory: real inotify; after a
// watched directory is removed and created again, a new file in the new
// directory wakes the check.
func TestNodeTamperedWatchFollowsAReplacedDirectory(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	woken, stop := watchWakes(c)
	defer stop()
	awaitWake := func(what string, again func()) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case <-woken:
				return
			case <-deadline:
				t.Fatalf("no wake-up within 10s of %s", what)
			case <-time.After(50 * time.Millisecond):
				again()
			}
		}
	}
	// The run its new watches ask for says they are in place.
	awaitWatching(t, woken)
	if err := os.Chmod(h.path("/etc/cni/net.d/05-cilium.conflist"), 0o600); err != nil {
		t.Fatal(err)
	}
	awaitWake("a change", func() {})
	// Let the chmods' events pass, then drop their wake.
	if _, err := c.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	default:
	}
	dir := h.path("/etc/cni/net.d")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	awaitWake("the directory's replacement", func() {})
	// The run after the wake hands the watcher the directories again: the
	// new directory is watched (and read again by the run that asks for).
	if _, err := c.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	awaitWake("the new directory's watch", func() {})
	select {
	case <-woken:
	default:
	}
	h.write("/etc/cni/net.d/01-evil.conflist", "{}")
	awaitWake("a new file in the new directory", func() {})
}

// awaitWatching waits for the wake a watcher asks for once it has set its
// first watches (Watch: a run after them reads what came before them).
func awaitWatching(t *testing.T, woken <-chan struct{}) {
	t.Helper()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of the watcher setting its watches")
	}
}

// awaitWake waits for the check's watch to wake it, 10 s at most; what
// says what should have woken it.
func awaitWake(t *testing.T, woken <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal(what + ": no wake-up within 10s")
	}
}

// retarget points the host's symlink link at target by rename over it, as
// `ln -sfn` does (one step: the link is never missing).
func (h *tamperHost) retarget(link, target string) {
	h.t.Helper()
	if err := os.Symlink(target, h.path(link+".new")); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(h.path(link+".new"), h.path(link)); err != nil {
		h.t.Fatal(err)
	}
}

// A clear forged into the tamper state file (no baseline, retake) is not an
// operator's clear: the baseline kept in the state file is gone within the
// boot, a finding.
func TestNodeTamperedForgedClearIsAFinding(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	if err := memos.Save(h.stateDir, h.now); err != nil {
		t.Fatal(err)
	}
	forged := `{"version":1,"findings":[],"cleared":{"at":"2099-01-01T00:00:00Z","reason":"x","by":"y"},"retake":true}`
	if err := os.WriteFile(filepath.Join(h.stateDir, tamper.StateFileName), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	restored := report.NewStore("boot-1")
	if _, err := restored.Load(h.stateDir); err != nil {
		t.Fatal(err)
	}
	c2 := h.start("boot-1", restored)
	h.probe(c2, report.StatusTrue, report.ReasonBaselineCorrupt, "is gone from the tamper state")
}

// A tamper state file that counts dropped tolerated changes but lists
// none (whoever can write state_dir wrote it: neither is under the
// baseline's digest) is read as it is: the check says how many, and
// does not panic on the last one it does not have.
func TestNodeTamperedToleratedCountWithoutChanges(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	p := filepath.Join(h.stateDir, tamper.StateFileName)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(string(b), `"version": 1,`, `"version": 1, "toleratedDropped": 3,`, 1)
	if err := os.WriteFile(p, []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := h.start("boot-1", memos)
	h.probe(c2, report.StatusFalse, report.ReasonNodeIntact, "but tolerated ones: 3 change(s) (tolerate, tolerate_gpu; listed in the tamper report)")
}

// A clear while a probe runs never makes the probe fail or panic: it sees
// the baseline, or reports it pending.
func TestNodeTamperedClearDuringProbe(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				c.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "race", By: "test"})
			}
		}
	}()
	for range 300 {
		res, err := c.Probe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Status == report.StatusTrue {
			t.Fatalf("got %s/%s %q", res.Status, res.Reason, res.Message)
		}
	}
	close(stop)
	<-done
}

// An operator's clear while a SealedOSTampered run is in flight: what the
// run read before the clear is not recorded after it. Here the boot's
// first run reads a swapped layer; while it saves the recorded hashes it
// first read, the layer is restored and the operator clears. Before, the
// run then added its root-hash-mismatch to the cleared state, and the
// next run (the one the clear wakes, finding the layer intact) was True
// all the same, until a second clear.
func TestSealedOSTamperedClearDuringProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rec = "/var/lib/syself/sealed-os/root-hashes"
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashB)}}
		c := sealedEnv(t, h, "boot-1", dm)
		k := c.(*sealedOSCheck).keeper
		cleared := make(chan error, 1)
		first := true
		k.SetWrite(func(path string, data []byte, perm os.FileMode) error {
			if first { // the save of the recorded hashes first read
				first = false
				dm.targets = []tamper.VerityTarget{verity("root", hashA)}
				go func() { cleared <- k.ClearAll(tamper.Clear{At: h.now, Reason: "layer restored", By: "uid 0"}) }()
				synctest.Wait() // the clear is applied, waiting for its write
			}
			return report.WriteFileAtomic(path, data, perm)
		})
		res, err := c.Probe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := <-cleared; err != nil {
			t.Fatal(err)
		}
		if res.Status == report.StatusTrue {
			t.Errorf("the run in flight during the clear: %s/%s %q", res.Status, res.Reason, res.Message)
		}
		h.probe(c, report.StatusFalse, report.ReasonSealedOSIntact, "1 sealed layer(s) enforce their recorded root hash: root "+hashA)
	})
}

// The NVIDIA container toolkit's writes to containerd's configuration set
// nothing on a GPU node (checks.NodeTampered.tolerate_gpu, default) and are
// in the report; the same writes on a node without a GPU set NodeTampered,
// and so does any other file in the toolkit's drop-in directory on a GPU
// node. What is written is what nvidia-ctk-installer does (the GPU
// Operator's toolkit container): a drop-in in a new directory, and the
// top-level config rewritten with its imports.
func TestNodeTamperedToleratesTheGPUToolkit(t *testing.T) {
	// The GPU Operator's drop-in directory (conf.d); the installer on its
	// own writes config.d.
	dropIn := func(dir string) func(h *tamperHost) {
		return func(h *tamperHost) {
			h.write("/etc/containerd/"+dir+"/99-nvidia.toml", "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n")
			h.write("/etc/containerd/config.toml", "version = 3\nimports = [\"/etc/containerd/"+dir+"/*.toml\"]\n")
		}
	}
	toolkit := dropIn("conf.d")
	for _, tc := range []struct {
		name   string
		gpu    bool
		change func(h *tamperHost)
		want   report.Status
		reason report.Reason
		msg    string
		// tolerated: how many tolerated changes the report lists
		tolerated int
	}{
		{"GPU node, toolkit", true, toolkit, report.StatusFalse, report.ReasonNodeIntact,
			"no protected path changed since this boot's baseline (2026-12-02T10:01:00Z, sha256:", 3},
		{"GPU node, installer's default directory", true, dropIn("config.d"), report.StatusFalse, report.ReasonNodeIntact,
			"tolerated ones: 3 change(s)", 3},
		{"no GPU, toolkit", false, toolkit, report.StatusTrue, report.ReasonProtectedFileChanged,
			"3 finding(s): /etc/containerd/config.toml modified at", 0},
		{"GPU node, another drop-in", true, func(h *tamperHost) {
			toolkit(h)
			h.write("/etc/containerd/conf.d/50-mirror.toml", "[plugins]\n")
		}, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/containerd/conf.d/50-mirror.toml added", 3},
		{"GPU node, toolkit stops (drop-in removed)", true, func(h *tamperHost) {
			toolkit(h)
			h.now = h.now.Add(time.Minute)
			os.Remove(h.path("/etc/containerd/conf.d/99-nvidia.toml"))
		}, report.StatusFalse, report.ReasonNodeIntact, "tolerated ones: 2 change(s)", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTamperHost(t)
			h.gpu = tc.gpu
			h.protect = []string{"/etc/containerd"}
			h.write("/etc/containerd/config.toml", "version = 3\n")
			c := h.start("boot-1", report.NewStore("boot-1"))
			h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "7 protected paths unchanged")
			tc.change(h)
			res := h.probe(c, tc.want, tc.reason, tc.msg)
			rep := res.Details[0].Value.(tamper.Report)
			if len(rep.Tolerated) != tc.tolerated {
				t.Fatalf("tolerated changes %+v, want %d", rep.Tolerated, tc.tolerated)
			}
			// A tolerated change stays reported across a restart and is not
			// a finding then either.
			c2 := h.start("boot-1", nil)
			h.probe(c2, tc.want, tc.reason, "")
		})
	}
}

// A tolerated path that is a symlink is not tolerated: the scan records the
// link, never what it points to, so a tolerated directory (the toolkit's
// conf.d on a GPU node) swapped for a link to a directory of the attacker's
// would hide every file in it, each of which containerd imports through the
// link and each a finding where the directory is one. Before, the swap was
// two tolerated changes (conf.d modified, 99-nvidia.toml removed) and the
// condition False, with containerd importing evil.toml.
func TestNodeTamperedAToleratedPathSwappedForASymlinkIsAFinding(t *testing.T) {
	h := newTamperHost(t)
	h.gpu = true
	h.protect = []string{"/etc/containerd"}
	h.write("/etc/containerd/config.toml", "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n")
	h.write("/etc/containerd/conf.d/99-nvidia.toml", "version = 3\n")
	h.write("/srv/evil/evil.toml", "[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = \"/srv/evil/certs.d\"\n")
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "9 protected paths unchanged")
	if err := os.RemoveAll(h.path("/etc/containerd/conf.d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/srv/evil", h.path("/etc/containerd/conf.d")); err != nil {
		t.Fatal(err)
	}
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/containerd/conf.d modified")
	// The drop-in the link hides is the toolkit's: tolerated, reported.
	if rep := res.Details[0].Value.(tamper.Report); len(rep.Tolerated) != 1 || rep.Tolerated[0].Path != "/etc/containerd/conf.d/99-nvidia.toml" {
		t.Errorf("tolerated changes %+v, want the drop-in's removal", rep.Tolerated)
	}
}

// tolerate (every node) covers Cilium's CNI file when set: its rewrite is
// reported, the renames cni.exclusive makes of other CNI files are not
// tolerated by it.
func TestNodeTamperedTolerateOnEveryNode(t *testing.T) {
	h := newTamperHost(t)
	h.tolerate = []string{"/etc/cni/net.d/05-cilium.conflist"}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	h.write("/etc/cni/net.d/05-cilium.conflist", `{"cniVersion":"0.3.1","name":"cilium"}`)
	res := h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "1 change(s), the last /etc/cni/net.d/05-cilium.conflist modified")
	if r := res.Details[0].Value.(tamper.Report); len(r.Tolerated) != 1 || r.Tolerated[0].Condition != "" {
		t.Fatalf("tolerated %+v", r.Tolerated)
	}
	h.write("/etc/cni/net.d/10-other.conflist", "{}")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/cni/net.d/10-other.conflist added")
}

// An operator's clear takes the new baseline at the next run, of the files
// as they are then, without waiting for them to settle.
func TestNodeTamperedClearRetakesAtOnce(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.settle = time.Hour
	c.maxWait = 2 * time.Hour
	h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "once the protected files are unchanged for 1h")
	h.now = h.now.Add(time.Hour)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	h.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\nserver: https://other\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/kubernetes/kubelet.conf modified")
	if err := c.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "reviewed", By: "test"}); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline (2026-12-02T11:04:00Z")
}

// A clear takes the baseline at the next run even where baseline_after
// does not match: the operator accepts the node as it is.
func TestNodeTamperedClearDoesNotWaitForTheGate(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	os.Remove(h.path("/etc/kubernetes/kubelet.conf"))
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/kubernetes/kubelet.conf removed")
	if err := c.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "reviewed", By: "test"}); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "4 protected paths unchanged")
	// And the gate applies again at the next boot.
	c2 := h.start("boot-2", report.NewStore("boot-2"))
	h.probe(c2, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/kubernetes/kubelet.conf")
}

// deepTree makes a chain of directories under host path dir whose full
// path is longer than PATH_MAX (made with mkdirat, one level at a time, as
// a process inside it would), so that stat of its deepest path fails with
// ENAMETOOLONG.
func (h *tamperHost) deepTree(dir string) {
	h.t.Helper()
	fd, err := unix.Open(h.path(dir), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	name := strings.Repeat("d", 250)
	for range 20 {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			h.t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			h.t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	h.t.Cleanup(func() { os.RemoveAll(h.path(dir)) })
}

// A path the scan cannot read (here: longer than PATH_MAX, made by a pod
// with a hostPath of /etc/cni/net.d) is recorded as unreadable, not an
// error that stops every scan: a change elsewhere is still a finding, and
// so is the unreadable path itself.
func TestNodeTamperedAnUnreadablePathDoesNotBlindTheScan(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	h.deepTree("/etc/cni/net.d")
	h.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}}\n")
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/var/lib/kubelet/config.yaml modified")
	if !strings.Contains(res.Message, "/etc/cni/net.d/ddd") {
		t.Errorf("the deep tree is not a finding: %q", res.Message)
	}
	var unreadable bool
	for _, f := range c.keeper.State().Findings {
		unreadable = unreadable || strings.Contains(f.Detail, "unreadable")
	}
	if !unreadable {
		t.Errorf("no finding says which path could not be read: %+v", c.keeper.State().Findings)
	}

	// At boot: the baseline is taken all the same, the unreadable path in
	// it; while a path cannot be read the check vouches for nothing
	// (Unknown, not False), and a change elsewhere is True.
	h2 := newTamperHost(t)
	h2.deepTree("/etc/cni/net.d")
	c2 := h2.start("boot-1", report.NewStore("boot-1"))
	res = h2.probe(c2, report.StatusUnknown, report.ReasonCheckFailed, "cannot read 1 protected path(s), no other change since this boot's baseline (")
	if !strings.Contains(res.Message, ": /etc/cni/net.d/ddd") || !strings.HasSuffix(res.Message, "… (open: file name too long)") {
		t.Errorf("message %q: want the path, cut, and why", res.Message)
	}
	if c2.keeper.State().Baseline == nil {
		t.Fatal("no baseline taken")
	}
	h2.write("/var/lib/kubelet/config.yaml", "changed\n")
	h2.probe(c2, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /var/lib/kubelet/config.yaml modified")
}

// Past the cap before this boot's baseline (files a pod adds in the settle
// window after boot): the baseline is taken of the paths within the cap and
// the over-limit is a finding at once, never a check that fails on every
// run and so never takes a baseline (which would leave every later change
// unseen).
func TestNodeTamperedOverTheCapBeforeTheBaseline(t *testing.T) {
	h := newTamperHost(t)
	h.write("/etc/cni/net.d/00-a", "{}")
	h.write("/etc/cni/net.d/00-b", "{}")
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.spec.MaxEntries = 6
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "over-limit")
	if b := c.keeper.State().Baseline; b == nil || len(b.Entries) != 6 {
		t.Fatalf("baseline %+v, want one of the 6 paths within the cap", b)
	}
	h.write("/var/lib/kubelet/config.yaml", "changed\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/var/lib/kubelet/config.yaml modified")
}

// A known writer that replaces its file atomically (Cilium writes its CNI
// configuration with github.com/google/renameio: a temporary file
// ".05-cilium.conflist<digits>" in the same directory, then a rename over
// the file) shows the temporary file to a run that the create woke: it is
// the tolerated path's, so tolerated too. A hidden name that is not that
// (here one CNI would load: extension .conflist) still sets it.
func TestNodeTamperedToleratesAKnownWritersTemporaryFile(t *testing.T) {
	h := newTamperHost(t)
	h.tolerate = []string{"/etc/cni/net.d/05-cilium.conflist"}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	tmp := "/etc/cni/net.d/.05-cilium.conflist2596996162"
	h.write(tmp, `{"cniVersion":"0.3.1","name":"cilium"}`)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "the last "+tmp+" added")
	if err := os.Rename(h.path(tmp), h.path("/etc/cni/net.d/05-cilium.conflist")); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "the last /etc/cni/net.d/05-cilium.conflist modified")
	h.write("/etc/cni/net.d/.05-cilium.conflist.conflist", "{}")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/cni/net.d/.05-cilium.conflist.conflist added")
}

// watchWakes runs c's Watch until stop, which returns once Watch has;
// woken gets a token (one at most waits) at each wake-up.
func watchWakes(c interface {
	Watch(context.Context, func())
}) (woken chan struct{}, stop func()) {
	woken = make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Watch(ctx, func() {
			select {
			case woken <- struct{}{}:
			default:
			}
		})
	}()
	return woken, func() { cancel(); <-done }
}

// A tamper state file that does not load (here garbage: moved aside, a
// finding of NodeTampered) is logged once by SealedOSTampered, not at every
// run: the keeper returns the same load error for as long as it lives.
// Before, each run (every 5 min) logged it again at error priority.
func TestSealedOSTamperedLogsAnUnreadableStateOnce(t *testing.T) {
	h := newTamperHost(t)
	h.logs = &testenv.SyncBuffer{}
	if err := os.WriteFile(filepath.Join(h.stateDir, tamper.StateFileName), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := sealedEnv(t, h, "boot-1", &fakeDM{err: tamper.ErrNoDeviceMapper})
	for range 5 {
		h.probe(c, report.StatusUnknown, report.ReasonNothingToCheck, "no sealed OS layers")
	}
	if n := strings.Count(h.logs.String(), "tamper state unreadable"); n != 1 {
		t.Errorf("%d 'tamper state unreadable' lines in 5 runs, want 1:\n%s", n, h.logs.String())
	}
}

// A protected path the unit's sandbox hides is not vouched for. Both units
// have ProtectHome=yes: in their mount namespaces systemd mounts its
// inaccessible directory over /home, /root and /run/user (the mountinfo
// line below is from testdata/roots/protectsystem-strict, captured under a
// real systemd 252), so the scan finds /root empty. An operator who adds
// /root/.ssh to the protected paths (`autopilot-health check`, run outside
// the unit, reads it) must see that it cannot be read there, Unknown /
// CheckFailed naming it, not NodeIntact over a path nobody looked at, and
// a change elsewhere is still True. Fails when the scan takes the empty
// directory for the host's (False, NodeIntact).
func TestNodeTamperedAPathTheSandboxHidesIsNotVouchedFor(t *testing.T) {
	h := newTamperHost(t)
	h.protect = []string{"/root/.ssh"}
	h.write("/proc/self/mountinfo", "66 49 0:41 / / ro,relatime shared:1 - tmpfs rootfs rw,size=16384k,mode=755\n"+
		"93 66 0:47 / /run rw,nosuid,nodev,relatime shared:10 - tmpfs tmpfs rw,size=16384k,mode=755\n"+
		"108 66 0:47 /systemd/inaccessible/dir /root ro,nosuid,nodev,noexec,relatime shared:35 - tmpfs tmpfs rw,size=16384k,mode=755\n")
	mkdir(t, h.path("/root"))
	c := h.start("boot-1", report.NewStore("boot-1"))
	res := h.probe(c, report.StatusUnknown, report.ReasonCheckFailed, "cannot read 1 protected path(s), no other change since this boot's baseline (")
	if want := ": /root/.ssh (hidden by the sandbox: /root is a systemd inaccessible mount in this mount namespace, as ProtectHome= and InaccessiblePaths= make)"; !strings.HasSuffix(res.Message, want) {
		t.Errorf("message %q\nwant it to end %q", res.Message, want)
	}
	h.write("/var/lib/kubelet/config.yaml", "changed\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /var/lib/kubelet/config.yaml modified")
}

// `autopilot-health check` beside the daemon reads the daemon's tamper.json
// and never writes it: a file it cannot read (here one that does not
// parse; a non-root operator's permission denied the same) is a baseline it
// cannot read, Unknown, not a BaselineCorrupt finding of its own, and the
// file is left where it is for the daemon.
func TestOneShotNodeTamperedCannotReadTheDaemonsState(t *testing.T) {
	h := newTamperHost(t)
	p := filepath.Join(h.stateDir, tamper.StateFileName)
	if err := os.WriteFile(p, []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	ro := testEnv(t, func(cfg *config.Config) { cfg.HostRoot, cfg.StateDir = h.root, h.stateDir })
	ro.BootID = "boot-1"
	oc, err := newNodeTamperedCheck(ro)
	if err != nil {
		t.Fatal(err)
	}
	res, err := oc.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != report.StatusUnknown || res.Reason != report.ReasonBaselinePending || !strings.Contains(res.Message, "cannot read the daemon's baseline") {
		t.Errorf("one-shot check over a tamper.json it cannot read: %s/%s %q", res.Status, res.Reason, res.Message)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "{half" {
		t.Errorf("the daemon's tamper.json was not left as it was: %q, %v", b, err)
	}
}

// A file created under a protected directory is named by whoever creates
// it: a name with a newline and escape sequences is a finding like any
// other, and the condition's message names it with them written \xNN, as
// `ls` quotes them, never raw into `kubectl describe node`.
func TestNodeTamperedFileNamedWithControlCharacters(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline")
	h.write("/etc/cni/net.d/00-\x1b]0;x\x07\n\x1b[2J.conflist", "{}")
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): ")
	store := report.NewStore("boot-1")
	store.Set(report.Condition{Type: "NodeTampered", Status: res.Status, Reason: res.Reason, Message: res.Message}, h.now)
	got, _ := store.Get("NodeTampered")
	if want := `1 finding(s): /etc/cni/net.d/00-\x1b]0;x\x07\x0a\x1b[2J.conflist added`; !strings.Contains(got.Message, want) {
		t.Errorf("message %q\nwant it to hold %q", got.Message, want)
	}
}

// After an operator's clear, the new baseline's digest is kept in the
// state file once it is written: a tamper.json removed after that is still
// a BaselineCorrupt finding at the next start, as before the clear.
func TestNodeTamperedBaselineGoneAfterAClear(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	c.keeper.PrepareClear()
	if err := c.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "reviewed", By: "test"}); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	if err := memos.Save(h.stateDir, h.now); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(h.stateDir, tamper.StateFileName))
	restored := report.NewStore("boot-1")
	if _, err := restored.Load(h.stateDir); err != nil {
		t.Fatal(err)
	}
	c2 := h.start("boot-1", restored)
	h.probe(c2, report.StatusTrue, report.ReasonBaselineCorrupt, "is gone from the tamper state")
}

// A clear whose baseline was not taken before the node rebooted (the clear
// came as the daemon stopped for the reboot, or NodeTampered was disabled
// then) accepted the files of that boot, not those of the next: the next
// boot waits for baseline_after and settles as every boot does. Before,
// the clear's "take it at once" outlived the reboot: the baseline was
// taken at the boot's first run, before the node joined, and the
// kubelet's kubeconfig written by the join set NodeTampered True.
func TestNodeTamperedClearBeforeARebootDoesNotSkipTheNextBootsGate(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	if err := c.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "reviewed", By: "test"}); err != nil {
		t.Fatal(err)
	}
	// The daemon stops before NodeTampered ran again; the node reboots,
	// and the daemon starts before the node has joined.
	os.Remove(h.path("/etc/kubernetes/kubelet.conf"))
	c2 := h.start("boot-2", report.NewStore("boot-2"))
	h.probe(c2, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/kubernetes/kubelet.conf")
	h.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\n")
	h.probe(c2, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
}

// A directory the check starts watching after a run's scan (here one a
// protected path appears in, created a moment before) is read again once
// its watch is set: what was written there between the scan and the watch
// sent no notification, and without that run it waited for the interval's
// scan (5 min). The order is forced by starting the watcher after the
// write: the run that the directory's creation woke has scanned, the
// watcher has not yet watched it (as at every start, and after every run
// that finds a new directory).
func TestNodeTamperedWatchSeesWhatCameBeforeItsWatch(t *testing.T) {
	h := newTamperHost(t)
	h.protect = []string{"/opt/evil/manifests"}
	if err := os.MkdirAll(h.path("/opt"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	// The run the directory's creation wakes: nothing protected in it, and
	// it hands the watcher /opt/evil, where manifests would appear.
	if err := os.Mkdir(h.path("/opt/evil"), 0o755); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	// Written after that run's scan, before the watch on /opt/evil is set.
	h.write("/opt/evil/manifests/evil.yaml", "kind: Pod\n")
	woken, stop := watchWakes(c)
	defer stop()
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up within 10s of watching a directory a protected path was written into before its watch")
	}
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/opt/evil/manifests added")
}

// A baseline taken unsettled (baseline_max_wait) is still said to be so
// after a daemon restart within the boot: the note is kept in the state
// file with the baseline's digest. Before, the restarted daemon's False
// message dropped it (a Node status write, and the operator no longer told
// that the baseline may hold a change made while it was taken). A clear's
// baseline, and the next boot's, do not carry it.
func TestNodeTamperedUnsettledBaselineSaidSoAfterARestart(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	c.gate, c.maxWait = []string{"/etc/never"}, 3*time.Minute
	for range 3 {
		h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/never")
	}
	const note = "(baseline taken unsettled after 3m: nothing matched /etc/never)"
	want := h.probe(c, report.StatusFalse, report.ReasonNodeIntact, note).Message
	if err := memos.Save(h.stateDir, h.now); err != nil {
		t.Fatal(err)
	}
	restored := report.NewStore("boot-1")
	if _, err := restored.Load(h.stateDir); err != nil {
		t.Fatal(err)
	}
	c2 := h.start("boot-1", restored)
	if got := h.probe(c2, report.StatusFalse, report.ReasonNodeIntact, note).Message; got != want {
		t.Errorf("after the restart: %q, want the same message as before it, %q", got, want)
	}
	// A clear retakes the baseline at once, settled by the operator's word.
	if err := c2.keeper.ClearAll(tamper.Clear{At: h.now, Reason: "reviewed", By: "test"}); err != nil {
		t.Fatal(err)
	}
	if res := h.probe(c2, report.StatusFalse, report.ReasonNodeIntact, "unchanged"); strings.Contains(res.Message, "unsettled") {
		t.Errorf("the clear's baseline said unsettled: %q", res.Message)
	}
	if err := restored.Save(h.stateDir, h.now); err != nil {
		t.Fatal(err)
	}
	again := report.NewStore("boot-1")
	if _, err := again.Load(h.stateDir); err != nil {
		t.Fatal(err)
	}
	if res := h.probe(h.start("boot-1", again), report.StatusFalse, report.ReasonNodeIntact, "unchanged"); strings.Contains(res.Message, "unsettled") {
		t.Errorf("the clear's baseline said unsettled after a restart: %q", res.Message)
	}
}

// A reload builds the check's new instance before the old one's loop has
// stopped (Runner.Apply: the old run in flight finishes first), and a
// reload that another check fails keeps the old instance running after its
// successor was built and dropped: the baseline the old instance then takes
// unsettled is still said to be so by the new instance, and after a
// restart. Before, the note lived in the instance that took the baseline,
// while the state file kept the value of the instance built last (restored
// before the baseline was taken: none): the new instance's False message
// dropped it, and so did every later restart in the boot.
func TestNodeTamperedUnsettledBaselineSaidSoByTheInstanceOfAReload(t *testing.T) {
	h := newTamperHost(t)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	c.gate, c.maxWait = []string{"/etc/never"}, 3*time.Minute
	for range 3 {
		h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/never")
	}
	env := *c.env // a reload's env: the same keeper and state file
	built, err := newNodeTamperedCheck(&env)
	if err != nil {
		t.Fatal(err)
	}
	reloaded := built.(*nodeTamperedCheck)
	const note = "(baseline taken unsettled after 3m: nothing matched /etc/never)"
	// The old instance's run, in flight during the reload, takes it.
	want := h.probe(c, report.StatusFalse, report.ReasonNodeIntact, note).Message
	if got := h.probe(reloaded, report.StatusFalse, report.ReasonNodeIntact, "unchanged").Message; got != want {
		t.Errorf("the reload's instance: %q, want the same message as the instance that took the baseline, %q", got, want)
	}
	if err := memos.Save(h.stateDir, h.now); err != nil {
		t.Fatal(err)
	}
	restored := report.NewStore("boot-1")
	if _, err := restored.Load(h.stateDir); err != nil {
		t.Fatal(err)
	}
	if got := h.probe(h.start("boot-1", restored), report.StatusFalse, report.ReasonNodeIntact, "unchanged").Message; got != want {
		t.Errorf("after a restart: %q, want the same message as before it, %q", got, want)
	}
}

// A protected path that is a symlink is recorded as the link (README,
// "Tamper conditions"): what it points to is not read, so a change there is
// no finding unless that path is protected too; pointing the link
// elsewhere is one. This pins what README tells the operator.
func TestNodeTamperedASymlinkedProtectedPathIsRecordedAsTheLink(t *testing.T) {
	h := newTamperHost(t)
	h.write("/opt/real/kubelet.conf", "apiVersion: v1\n")
	h.write("/opt/manifests/etcd.yaml", "kind: Pod\n")
	if err := os.Remove(h.path("/etc/kubernetes/kubelet.conf")); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"/etc/kubernetes/kubelet.conf": "../../opt/real/kubelet.conf", "/etc/kubernetes/manifests": "../../opt/manifests"} {
		if err := os.Symlink(target, h.path(link)); err != nil {
			t.Fatal(err)
		}
	}
	h.protect = []string{"/etc/kubernetes/manifests"}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "6 protected paths unchanged")
	h.write("/opt/real/kubelet.conf", "server: https://evil\n")
	h.write("/opt/manifests/evil.yaml", "kind: Pod\n")
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "6 protected paths unchanged")
	if err := os.Remove(h.path("/etc/kubernetes/manifests")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../opt/real", h.path("/etc/kubernetes/manifests")); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/kubernetes/manifests link-target")
}

// An OS upgrade (README, "Tamper conditions"): recorded hashes rewritten
// for the next image within a boot are RecordedHashAltered there, and that
// finding is held after the reboot into the image they match, until a
// clear; recorded hashes the new image's boot holds before the first run
// in it are that boot's first reading, and its layers match them.
func TestSealedOSTamperedAcrossAnOSUpgrade(t *testing.T) {
	const rec = "/var/lib/syself/sealed-os/root-hashes"
	t.Run("record rewritten before the reboot", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
		h.probe(sealedEnv(t, h, "boot-1", dm), report.StatusFalse, report.ReasonSealedOSIntact, "root "+hashA)
		c := sealedEnv(t, h, "boot-1", dm)
		h.write(rec, "root "+hashB+"\n") // the upgrade stages the next image
		h.probe(c, report.StatusTrue, report.ReasonRecordedHashAltered, "recorded-hash-altered")
		dm.targets = []tamper.VerityTarget{verity("root", hashB)} // the reboot into it
		c2 := sealedEnv(t, h, "boot-2", dm)
		h.probe(c2, report.StatusTrue, report.ReasonRecordedHashAltered, "1 finding(s)")
		if err := c2.(*sealedOSCheck).keeper.ClearAll(tamper.Clear{At: h.now, Reason: "os upgrade", By: "test"}); err != nil {
			t.Fatal(err)
		}
		h.probe(c2, report.StatusFalse, report.ReasonSealedOSIntact, "root "+hashB)
	})
	t.Run("record written in the new image's boot", func(t *testing.T) {
		h := newTamperHost(t)
		h.write(rec, "root "+hashA+"\n")
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
		h.probe(sealedEnv(t, h, "boot-1", dm), report.StatusFalse, report.ReasonSealedOSIntact, "root "+hashA)
		dm.targets = []tamper.VerityTarget{verity("root", hashB)}
		h.write(rec, "root "+hashB+"\n")
		h.probe(sealedEnv(t, h, "boot-2", dm), report.StatusFalse, report.ReasonSealedOSIntact, "root "+hashB)
	})
}

// unprivilegedScan scans as a process without the DAC capabilities
// (testenv.Unprivileged): the daemon's own scan where it has no helper, or
// the one-shot check run by another user.
type unprivilegedScan struct {
	Helper
	t *testing.T
}

func (u unprivilegedScan) ScanNoting(root string, spec tamper.Spec) (es []tamper.Entry, notes tamper.ScanNotes, err error) {
	testenv.Unprivileged(u.t, func() { es, notes, err = tamper.ScanNoting(root, spec) })
	return es, notes, err
}

// searchableByAll lets every user search the host root and its parent (a
// test's temporary directories are 0700), so that an unprivileged scan
// meets only the permissions a test sets under the root.
func (h *tamperHost) searchableByAll() {
	h.t.Helper()
	for _, d := range []string{filepath.Dir(h.root), h.root} {
		if err := os.Chmod(d, 0o755); err != nil {
			h.t.Fatal(err)
		}
	}
}

// startUnprivileged is h.start with the check's scan run as a process
// without the DAC capabilities (unprivilegedScan).
func (h *tamperHost) startUnprivileged(bootID string, memos *report.Store) *nodeTamperedCheck {
	c := h.start(bootID, memos)
	c.env.Helper = unprivilegedScan{t: h.t}
	return c
}

// A protected file the scan cannot reach, for another reason than that it
// is not there, is unreadable, never removed: after the baseline a
// directory on the way that the scan may not search (EACCES) is the file
// modified, "unreadable: lstat: permission denied", not "removed" (a false
// finding that stays until a clear); at the baseline a symlink loop on the
// way (ELOOP) is Unknown naming the path, never a False that vouches for
// it. Before, filepath.Glob read either as no match: the file absent.
func TestNodeTamperedAPathItCannotReachIsNotRemoved(t *testing.T) {
	h := newTamperHost(t)
	h.searchableByAll()
	c := h.startUnprivileged("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	if err := os.Chmod(h.path("/etc/kubernetes"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(h.path("/etc/kubernetes"), 0o755) })
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/kubernetes/kubelet.conf modified")
	if strings.Contains(res.Message, "removed") {
		t.Errorf("a file that is there reported removed: %q", res.Message)
	}
	if fs := c.keeper.State().Findings; len(fs) != 1 || fs[0].Detail != "unreadable: lstat: permission denied" {
		t.Errorf("findings %+v, want the file unreadable, with why", fs)
	}

	h2 := newTamperHost(t)
	if err := os.Rename(h2.path("/var/lib/kubelet"), h2.path("/var/lib/kubelet.real")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("kubelet", h2.path("/var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	c2 := h2.start("boot-1", report.NewStore("boot-1"))
	res = h2.probe(c2, report.StatusUnknown, report.ReasonCheckFailed, "cannot read 1 protected path(s), no other change since this boot's baseline (")
	if !strings.HasSuffix(res.Message, ": /var/lib/kubelet/config.yaml (lstat: too many levels of symbolic links)") {
		t.Errorf("message %q: want the path and why", res.Message)
	}
}

// A protected directory the scan can stat but not list (EACCES on its
// listing) is the finding, unreadable with why; the files in it are not
// reported removed: nobody read whether they are there. Before, each file
// of the baseline under it was a "removed" finding beside the directory's.
func TestNodeTamperedFilesInADirectoryItCannotListAreNotRemoved(t *testing.T) {
	h := newTamperHost(t)
	h.searchableByAll()
	c := h.startUnprivileged("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	if err := os.Chmod(h.path("/etc/cni/net.d"), 0o311); err != nil { // search, no listing
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(h.path("/etc/cni/net.d"), 0o755) })
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/cni/net.d modified")
	if fs := c.keeper.State().Findings; len(fs) != 1 || fs[0].Detail != "unreadable: open: permission denied" {
		t.Errorf("findings %+v, want the directory unreadable, with why, and nothing under it", fs)
	}
}

// A reload (or a restart within the boot) that narrows the protected paths
// compares where the baseline's paths and the new ones both reach; a
// pattern's directory the scan then cannot list (EACCES) hides the
// baseline's files there, which both reach: they are not reported removed,
// as with the paths unchanged (TestNodeTamperedFilesInADirectoryItCannotListAreNotRemoved),
// and the directory is the finding. Before, the directory (no pattern's
// match: /etc/cni/net.d for /etc/cni/net.d/*.conflist) was left out of the
// comparison as a path the baseline's scope does not cover, and each CNI
// file under it was a "removed" finding, held until a clear.
func TestNodeTamperedNarrowedPathsAndADirectoryItCannotList(t *testing.T) {
	for _, how := range []string{"unchanged", "reload", "restart"} {
		t.Run(how, func(t *testing.T) {
			h := newTamperHost(t)
			h.searchableByAll()
			h.write("/etc/cni/net.d/10-other.conflist", "{}\n")
			h.paths = []string{"/var/lib/kubelet/config.yaml", "/etc/cni/net.d/*.conflist", "/etc/kubernetes/kubelet.conf"}
			memos := report.NewStore("boot-1")
			c := h.startUnprivileged("boot-1", memos)
			h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "4 protected paths unchanged")

			// Narrowed: the kubelet's configuration protected no more ("unchanged":
			// the same paths, the finding the narrowed ones must match).
			if how != "unchanged" {
				h.paths = []string{"/etc/cni/net.d/*.conflist", "/etc/kubernetes/kubelet.conf"}
				if how == "reload" {
					h.keeper = c.keeper
				}
				c = h.startUnprivileged("boot-1", memos)
				h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "4 protected paths unchanged")
			}

			if err := os.Chmod(h.path("/etc/cni/net.d"), 0o311); err != nil { // search, no listing
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(h.path("/etc/cni/net.d"), 0o755) })
			res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/cni/net.d added")
			if strings.Contains(res.Message, "removed") {
				t.Errorf("files nobody read reported removed: %q", res.Message)
			}
			if fs := c.keeper.State().Findings; len(fs) != 1 || fs[0].Detail != "unreadable: open: permission denied" {
				t.Errorf("findings %+v, want the directory unreadable, with why, and nothing under it", fs)
			}
		})
	}
}

// A symlinked directory on the way to a protected path (/etc/kubernetes ->
// /srv/k8s-a) retargeted to another directory (/srv/k8s-b, by rename, as
// `ln -sfn` does): the scan follows the link, and so must the watch. The
// retarget wakes the check, whose run watches the new target: a static pod
// written there then wakes it (real inotify). Before, the directories were
// watched through the link once, on the old target's inodes: the retarget
// sent no notification and a file written in the new target waited for the
// interval's scan.
func TestNodeTamperedWatchFollowsARetargetedSymlinkOnTheWay(t *testing.T) {
	watchFollowsARetarget(t, linkRetarget{
		dirs:  []string{"/srv/k8s-a", "/srv/k8s-b"},
		links: map[string]string{"/etc/kubernetes": "../srv/k8s-a"},
		link:  "/etc/kubernetes", to: "../srv/k8s-b", retargeted: "the symlink on the way retargeted",
		written: "a static pod written in the new target",
	})
}

// A tolerated directory (tolerate_gpu's /etc/containerd/conf.d on a GPU
// node) that the scan cannot list hides what is in it: its files are not
// reported removed (nobody read whether they are there), so the directory
// is the finding, tolerated or not. Before, its change was tolerated (it
// set nothing), and a protected drop-in removed from it with the directory
// made unlistable set no finding: NodeTampered was Unknown (CheckFailed),
// its message "no other change since this boot's baseline", though another
// path of a tolerated path's directory stays protected (README).
func TestNodeTamperedAnUnlistableToleratedDirectoryIsAFinding(t *testing.T) {
	h := newTamperHost(t)
	h.searchableByAll()
	h.gpu = true
	h.protect = []string{"/etc/containerd"}
	h.write("/etc/containerd/config.toml", "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n")
	h.write("/etc/containerd/conf.d/50-mirror.toml", "[plugins]\n")
	c := h.startUnprivileged("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "9 protected paths unchanged")

	h.now = h.now.Add(time.Minute)
	if err := os.Remove(h.path("/etc/containerd/conf.d/50-mirror.toml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(h.path("/etc/containerd/conf.d"), 0o311); err != nil { // search, no listing
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(h.path("/etc/containerd/conf.d"), 0o755) })
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/containerd/conf.d modified")
	if fs := c.keeper.State().Findings; len(fs) != 1 || fs[0].Detail != "unreadable: open: permission denied" {
		t.Errorf("findings %+v, want the directory unreadable, with why", fs)
	}

	// Listable again: the drop-in's removal is a finding too, and the
	// toolkit's own change of the directory (its mode) stays tolerated.
	h.now = h.now.Add(time.Minute)
	if err := os.Chmod(h.path("/etc/containerd/conf.d"), 0o775); err != nil {
		t.Fatal(err)
	}
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "2 finding(s): /etc/containerd/conf.d/50-mirror.toml removed")
	if tol := c.keeper.State().Tolerated; !slices.ContainsFunc(tol, func(f tamper.Finding) bool {
		return f.Path == "/etc/containerd/conf.d" && f.Kind == tamper.Chmod
	}) {
		t.Errorf("tolerated %+v, want the directory's mode change", tol)
	}
}

// A directory that holds protected files and is itself a symlink
// (/var/lib/kubelet -> /data/kubelet, README's layout of a kubelet moved
// to a data disk; the scan follows it, as the kubelet does) is watched
// through the link: a change of the kubelet's config.yaml wakes the check
// within seconds, and after the link is retargeted (the retarget wakes
// it: the directory holding the link is watched) so does a change in the
// new target. Before, the watch was set without following the link at its
// name (ENOTDIR, "cannot watch these directories" logged), and a change of
// a default protected file there waited for the interval's scan (5 min).
func TestNodeTamperedWatchFollowsAWatchedDirectoryThatIsASymlink(t *testing.T) {
	h := newTamperHost(t)
	for _, d := range []string{"/data/kubelet", "/data/kubelet-2"} {
		h.write(d+"/config.yaml", "kind: KubeletConfiguration\n")
	}
	if err := os.RemoveAll(h.path("/var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../data/kubelet", h.path("/var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	h.protect = []string{"/var/lib/kubelet/kubeadm-flags.env"}
	h.logs = &testenv.SyncBuffer{}
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.gate = nil
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
	woken, stop := watchWakes(c)
	defer stop()
	awaitWatching(t, woken)

	h.now = h.now.Add(time.Minute)
	h.write("/data/kubelet/config.yaml", "kind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}}\n")
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatalf("config.yaml written through the linked /var/lib/kubelet: no wake-up within 10s; log:\n%s", h.logs)
	}
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /var/lib/kubelet/config.yaml modified")
	if l := h.logs.String(); strings.Contains(l, "cannot watch") {
		t.Errorf("a directory was not watched:\n%s", l)
	}

	h.retarget("/var/lib/kubelet", "../../data/kubelet-2")
	awaitWake(t, woken, "/var/lib/kubelet retargeted")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "")
	awaitWatching(t, woken) // the new target watched
	h.write("/data/kubelet-2/kubeadm-flags.env", "KUBELET_KUBEADM_ARGS=--anonymous-auth=true\n")
	awaitWake(t, woken, "kubeadm-flags.env written in the new target")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/var/lib/kubelet/kubeadm-flags.env added")
}

// A symlink met on the way through another's target (/etc/kubernetes ->
// static/kubernetes, /etc/static -> ../srv/gen-1: a generated /etc that
// switches generations by retargeting one link) is followed as the scan
// follows it: its retarget wakes the check, whose run watches the new
// generation, where a static pod written then wakes it. Before, only the
// links on the watched directory's own path were watched: /etc/static's
// retarget is no protected path's, it woke nothing, and the new
// generation's changes waited for the interval's scan.
func TestNodeTamperedWatchFollowsALinkInALinksTarget(t *testing.T) {
	watchFollowsARetarget(t, linkRetarget{
		dirs:  []string{"/srv/gen-1/kubernetes", "/srv/gen-2/kubernetes"},
		links: map[string]string{"/etc/kubernetes": "static/kubernetes", "/etc/static": "../srv/gen-1"},
		link:  "/etc/static", to: "../srv/gen-2", retargeted: "/etc/static retargeted",
		written: "a static pod written in the new generation",
	})
}

// linkRetarget is a story of the link-following watch tests: /etc/kubernetes
// (protected: its manifests) reached through links, one of them retargeted.
type linkRetarget struct {
	dirs       []string          // each holds manifests/etcd.yaml; the last is the new target
	links      map[string]string // link -> target, /etc/kubernetes among them
	link, to   string            // the link retargeted, and to what
	retargeted string            // the wake-up awaited after the retarget
	written    string            // the wake-up awaited after evil.yaml is written in the new target
}

// watchFollowsARetarget runs a linkRetarget story: the check watches
// through the links; the retarget wakes it and its run (still intact)
// watches the new target; a static pod written there wakes it and is a
// finding (real inotify).
func watchFollowsARetarget(t *testing.T, s linkRetarget) {
	t.Helper()
	h := newTamperHost(t)
	for _, d := range s.dirs {
		h.write(d+"/manifests/etcd.yaml", "kind: Pod\n")
	}
	if err := os.RemoveAll(h.path("/etc/kubernetes")); err != nil {
		t.Fatal(err)
	}
	for link, target := range s.links {
		if err := os.Symlink(target, h.path(link)); err != nil {
			t.Fatal(err)
		}
	}
	h.paths = []string{"/etc/kubernetes/manifests"}
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.gate = nil
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "2 protected paths unchanged")
	woken, stop := watchWakes(c)
	defer stop()
	awaitWatching(t, woken)

	h.retarget(s.link, s.to)
	awaitWake(t, woken, s.retargeted)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "2 protected paths unchanged")
	awaitWatching(t, woken) // the new target's directories watched
	h.write(s.dirs[len(s.dirs)-1]+"/manifests/evil.yaml", "kind: Pod\n")
	awaitWake(t, woken, s.written)
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/kubernetes/manifests/evil.yaml added")
}

// A symlink on the way to a protected path whose target is not there yet
// (/etc/kubernetes/pki -> ../../srv/pki, the data disk's directory created
// later) is watched where its target would appear: creating the target
// wakes the check, whose run watches it, and a protected file written there
// is a finding within seconds. Before, the watch stopped at the link's
// nearest existing ancestor on the link's side (/etc/kubernetes), which the
// target's creation does not notify: the file waited for the interval's
// scan (5 min).
func TestNodeTamperedWatchFollowsADanglingSymlinkWhoseTargetAppears(t *testing.T) {
	h := newTamperHost(t)
	if err := os.MkdirAll(h.path("/srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../srv/pki", h.path("/etc/kubernetes/pki")); err != nil {
		t.Fatal(err)
	}
	h.paths = []string{"/etc/kubernetes/kubelet.conf", "/etc/kubernetes/pki/ca.crt"}
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.gate = nil
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "1 protected paths unchanged")
	woken, stop := watchWakes(c)
	defer stop()
	awaitWatching(t, woken)

	if err := os.Mkdir(h.path("/srv/pki"), 0o755); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, woken, "the dangling symlink's target created")
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "1 protected paths unchanged")
	awaitWatching(t, woken) // the target's directory watched
	h.write("/srv/pki/ca.crt", "cert\n")
	awaitWake(t, woken, "a protected file written in the new target")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/kubernetes/pki/ca.crt added")
}

// A node out of inotify instances (inotify_init1 fails: EMFILE at
// fs.inotify.max_user_instances, common on a node with many pods) still has a
// bind mount over a protected file wake the check through the mount table.
// Before, Watch returned when file notifications were unavailable, before
// its mount watcher was started: the mount waited for the interval's scan.
func TestNodeTamperedMountWakesWithoutFileNotifications(t *testing.T) {
	h := newTamperHost(t)
	h.logs = &testenv.SyncBuffer{}
	h.write("/srv/evil", "apiVersion: v1\nclusters: [{cluster: {server: https://evil}}]\n")
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	orig := newFileWatcher
	newFileWatcher = func(string) (*tamper.Watcher, error) {
		return nil, os.NewSyscallError("inotify_init1", unix.EMFILE)
	}
	t.Cleanup(func() { newFileWatcher = orig })
	woken, stop := watchWakes(c)
	defer stop()
	// The warning is logged once the mount table was read: a mount after
	// it is a change of that reading.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(h.logs.String(), "file notifications unavailable"); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning within 10s that file notifications are unavailable; log:\n%s", h.logs.String())
		}
		runtime.Gosched()
	}
	p := h.path("/etc/kubernetes/kubelet.conf")
	if err := unix.Mount(h.path("/srv/evil"), p, "", unix.MS_BIND, ""); err != nil {
		testenv.Skip(t, "cannot mount (root in a mount namespace that allows it): "+err.Error())
	}
	t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
	awaitWake(t, woken, "a bind mount over a protected file without file notifications")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/etc/kubernetes/kubelet.conf modified")
}

// File notifications that were unavailable at the start (a node out of
// inotify instances) are opened again on the retry timer: once they can be,
// a write to a protected file wakes the check at once again, and the return
// is logged once. Before, a failed open was never retried: the node's
// protected files waited for the interval's scan until the daemon restarted.
func TestNodeTamperedFileNotificationsOpenedAgain(t *testing.T) {
	h := newTamperHost(t)
	h.logs = &testenv.SyncBuffer{}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	orig, min0, max0 := newFileWatcher, minWatchRetry, maxWatchRetry
	var fails atomic.Int32
	newFileWatcher = func(root string) (*tamper.Watcher, error) {
		if fails.Add(1) <= 3 {
			return nil, os.NewSyscallError("inotify_init1", unix.EMFILE)
		}
		return orig(root)
	}
	minWatchRetry, maxWatchRetry = 10*time.Millisecond, 40*time.Millisecond
	t.Cleanup(func() { newFileWatcher, minWatchRetry, maxWatchRetry = orig, min0, max0 })
	woken, stop := watchWakes(c)
	defer stop()
	// The open after three failures watches the directories the probe
	// handed over and wakes the check for them (their scan came before
	// their watch).
	awaitWake(t, woken, "file notifications opened again")
	if n := fails.Load(); n != 4 {
		t.Errorf("%d opens, want 4 (3 failed)", n)
	}
	h.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\nclusters: [{cluster: {server: https://evil}}]\n")
	awaitWake(t, woken, "a write to a protected file after file notifications came back")
	logs := h.logs.String()
	if n := strings.Count(logs, "file notifications unavailable"); n != 1 {
		t.Errorf("the same open error logged %d times, want once:\n%s", n, logs)
	}
	if !strings.Contains(logs, "file notifications available again") {
		t.Errorf("the return not logged:\n%s", logs)
	}
}

// File notifications that stopped (a read error on the inotify descriptor)
// are opened again on the retry timer, and their return is logged as it is
// after a failed open: the journal's "file notifications stopped; ... until
// they can be opened again" is followed by "file notifications available
// again". A later stop with the same error, after that return, is logged
// again. Before, the return was logged only after a failed open: a stop's
// warning was the journal's last word, as if they never came back.
func TestNodeTamperedFileNotificationsStoppedAndBackAreLogged(t *testing.T) {
	h := newTamperHost(t)
	h.logs = &testenv.SyncBuffer{}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	orig, min0, max0 := newFileWatcher, minWatchRetry, maxWatchRetry
	opened := make(chan *tamper.Watcher, 4)
	newFileWatcher = func(root string) (*tamper.Watcher, error) {
		w, err := orig(root)
		if err == nil {
			opened <- w
		}
		return w, err
	}
	minWatchRetry, maxWatchRetry = 10*time.Millisecond, 40*time.Millisecond
	t.Cleanup(func() { newFileWatcher, minWatchRetry, maxWatchRetry = orig, min0, max0 })
	_, stop := watchWakes(c)
	defer stop()
	for i := 1; i <= 2; i++ {
		// A read error ends the watcher's Run (here its descriptor
		// closed); the retry opens another.
		(<-opened).Close()
		for deadline := time.Now().Add(10 * time.Second); strings.Count(h.logs.String(), "file notifications available again") < i; {
			if time.Now().After(deadline) {
				t.Fatalf("stop %d: no return logged within 10s:\n%s", i, h.logs.String())
			}
			runtime.Gosched()
		}
		logs := h.logs.String()
		if n := strings.Count(logs, "file notifications stopped"); n != i {
			t.Fatalf("stop %d: the stop logged %d times, want %d:\n%s", i, n, i, logs)
		}
		if n := strings.Count(logs, "file notifications available again"); n != i {
			t.Fatalf("stop %d: the return logged %d times, want %d:\n%s", i, n, i, logs)
		}
	}
}

// A stop of file notifications that ran for the longest retry wait or more
// is a new outage: its first retry waits the shortest wait again (1 min),
// as README promises ("opened again 1 min later, the wait doubling at each
// failure up to 10 min"), not the wait an earlier outage reached. Before,
// the wait was never reset: after failed opens at the start had taken it to
// 10 min, every later stop waited 10 min for its reopen.
func TestNodeTamperedFileNotificationsRetryStartsAgainAfterARun(t *testing.T) {
	h := newTamperHost(t)
	h.logs = &testenv.SyncBuffer{}
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	orig, min0, max0 := newFileWatcher, minWatchRetry, maxWatchRetry
	var fails atomic.Int32
	opened := make(chan *tamper.Watcher, 1)
	newFileWatcher = func(root string) (*tamper.Watcher, error) {
		if fails.Add(1) <= 3 {
			return nil, os.NewSyscallError("inotify_init1", unix.EMFILE)
		}
		w, err := orig(root)
		if err == nil {
			opened <- w
		}
		return w, err
	}
	// Three failed opens wait 10, 20 and 40 ms: the wait is at its longest.
	minWatchRetry, maxWatchRetry = 10*time.Millisecond, 40*time.Millisecond
	t.Cleanup(func() { newFileWatcher, minWatchRetry, maxWatchRetry = orig, min0, max0 })
	_, stop := watchWakes(c)
	defer stop()
	w := <-opened
	// The watcher runs the longest wait and more (a time that passes: no
	// event to await), then stops.
	time.Sleep(2 * maxWatchRetry)
	w.Close()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(h.logs.String(), "file notifications stopped"); {
		if time.Now().After(deadline) {
			t.Fatalf("no stop logged within 10s:\n%s", h.logs.String())
		}
		runtime.Gosched()
	}
	logs := h.logs.String()
	line := logs[strings.Index(logs, "file notifications stopped"):]
	line = line[:strings.IndexByte(line, '\n')]
	if !strings.Contains(line, "retry_in=10ms") {
		t.Errorf("the stop after a run of 80ms waits other than the shortest wait (10ms):\n%s", line)
	}
}

// A directory a pattern's wildcard matches that is a symlink to a
// directory ("/etc/systemd/system/*.d/*.conf" with kubelet.service.d ->
// /srv/dropins): the scan's glob follows it and reads the drop-ins in its
// target, so the watch follows it too (real files, real inotify). A drop-in
// written in a target that holds no protected file yet (empty, or other
// files only), and one written in the new target after the link is
// retargeted to an empty directory, each wake the check within seconds; so
// does a change of a drop-in the target holds, and the retarget itself (the
// directory holding the link is watched). The link relative, or absolute
// out of the host root, where the kernel follows it from the daemon's "/",
// as the scan reads it. Before, WildcardDirs left out a match that is a
// link (its lstat is no directory): a drop-in written in a target with no
// protected file woke nothing and waited for the interval's scan (5 min).
func TestNodeTamperedWatchFollowsAWildcardMatchThatIsASymlink(t *testing.T) {
	const link, added = "/etc/systemd/system/kubelet.service.d", "/etc/systemd/system/kubelet.service.d/99-evil.conf"
	for _, kind := range []string{"relative", "absolute out of the root"} {
		for _, c := range []struct {
			name string
			// holds: the target's files at the start (a name ending in
			// ".conf" is protected through the link).
			holds []string
			// story: the changes after the watch is set, each awaited
			// as a wake-up; then the run's finding.
			story func(s wildLinkStory)
		}{
			{"a drop-in written in an empty target", nil, func(s wildLinkStory) {
				writeFile(s.t, s.target("/dropins/99-evil.conf"), "[Service]\nExecStart=/evil\n")
				awaitWake(s.t, s.woken, "a drop-in written in the link's empty target")
				s.h.probe(s.c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): "+added+" added")
			}},
			{"a drop-in written in a target holding other files", []string{"README"}, func(s wildLinkStory) {
				writeFile(s.t, s.target("/dropins/99-evil.conf"), "[Service]\nExecStart=/evil\n")
				awaitWake(s.t, s.woken, "a drop-in written in the link's target that held other files")
				s.h.probe(s.c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): "+added+" added")
			}},
			{"a drop-in of the target changed", []string{"10-kubeadm.conf"}, func(s wildLinkStory) {
				writeFile(s.t, s.target("/dropins/10-kubeadm.conf"), "[Service]\nExecStart=/evil\n")
				awaitWake(s.t, s.woken, "a drop-in in the link's target changed")
				s.h.probe(s.c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): "+link+"/10-kubeadm.conf modified")
			}},
			{"the link retargeted to an empty directory, then a drop-in written there", []string{"README"}, func(s wildLinkStory) {
				if err := os.MkdirAll(s.target("/dropins-2"), 0o755); err != nil {
					s.t.Fatal(err)
				}
				s.h.retarget(link, s.linkTo("/dropins-2"))
				awaitWake(s.t, s.woken, "the link retargeted")
				s.h.probe(s.c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged")
				awaitWatching(s.t, s.woken) // the new target watched
				writeFile(s.t, s.target("/dropins-2/99-evil.conf"), "[Service]\nExecStart=/evil\n")
				awaitWake(s.t, s.woken, "a drop-in written in the link's new target")
				s.h.probe(s.c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): "+added+" added")
			}},
		} {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				h := newTamperHost(t)
				h.protect = []string{"/etc/systemd/system/*.d/*.conf"}
				h.logs = &testenv.SyncBuffer{}
				// target is a path of this process where the link leads.
				// linkTo is what a link to such a directory says.
				base, linkBase := h.path("/srv"), "../../../srv"
				if kind != "relative" {
					base = t.TempDir()
					linkBase = base
				}
				target := func(p string) string { return base + p }
				linkTo := func(dir string) string { return linkBase + dir }
				if err := os.MkdirAll(target("/dropins"), 0o755); err != nil {
					t.Fatal(err)
				}
				for _, f := range c.holds {
					writeFile(t, target("/dropins/"+f), "[Service]\n")
				}
				if err := os.MkdirAll(h.path("/etc/systemd/system/multi-user.target.wants"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(linkTo("/dropins"), h.path(link)); err != nil {
					t.Fatal(err)
				}
				c0 := h.start("boot-1", report.NewStore("boot-1"))
				want := 5 + len(slices.DeleteFunc(slices.Clone(c.holds), func(f string) bool { return !strings.HasSuffix(f, ".conf") }))
				h.probe(c0, report.StatusFalse, report.ReasonNodeIntact, fmt.Sprintf("%d protected paths unchanged", want))
				woken, stop := watchWakes(c0)
				defer stop()
				awaitWatching(t, woken)
				c.story(wildLinkStory{t: t, h: h, c: c0, woken: woken, target: target, linkTo: linkTo})
				if l := h.logs.String(); strings.Contains(l, "cannot watch") {
					t.Errorf("a directory was not watched:\n%s", l)
				}
			})
		}
	}
}

// wildLinkStory is what a story of
// TestNodeTamperedWatchFollowsAWildcardMatchThatIsASymlink works with: the
// host, its check, the check's wake-ups, where a path of the link's side
// is in this process (target("/dropins")), and what a link to such a
// directory says (linkTo("/dropins-2")).
type wildLinkStory struct {
	t      *testing.T
	h      *tamperHost
	c      *nodeTamperedCheck
	woken  <-chan struct{}
	target func(string) string
	linkTo func(string) string
}

// On a node out of inotify watches (fs.inotify.max_user_watches spent),
// the directories the check cannot watch are logged with why, and what to
// raise: the test runs itself again in a user namespace of its own whose
// watches are capped at 2 (/proc/sys/user/max_inotify_watches there: the
// host's limit is untouched), real inotify, the check's default paths
// (four directories to watch). Before, the line named the directories
// alone, the same for a directory root may not read and for a node out of
// watches.
func TestNodeTamperedSaysWhyItCannotWatch(t *testing.T) {
	const env = "AUTOPILOT_HEALTH_TEST_IN_USERNS"
	if os.Getenv(env) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNodeTamperedSaysWhyItCannotWatch$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), env+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}}
		out, err := cmd.CombinedOutput()
		if err != nil && len(out) == 0 {
			testenv.Skip(t, "cannot start a process in a user namespace of its own: "+err.Error())
		}
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("in its user namespace: %v\n%s", err, out)
		}
		return
	}
	if err := os.WriteFile("/proc/sys/user/max_inotify_watches", []byte("2\n"), 0o644); err != nil {
		t.Fatalf("capping the namespace's inotify watches: %v", err)
	}
	h := newTamperHost(t)
	h.logs = &testenv.SyncBuffer{}
	c := h.start("boot-1", report.NewStore("boot-1"))
	c.gate = nil
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	woken, stop := watchWakes(c)
	defer stop()
	// Set logs what it cannot watch before it wakes the check for what
	// it could.
	awaitWatching(t, woken)
	l := h.logs.String()
	if !strings.Contains(l, "cannot watch these directories") || !strings.Contains(l, `err="no space left on device: the inotify watches of the daemon's user are spent (sysctl fs.inotify.max_user_watches)"`) {
		t.Fatalf("log:\n%s\nwant the directories it cannot watch with why (ENOSPC) and the sysctl", l)
	}
}

// Two files whose names are not UTF-8 (a Latin-1 "café" and "cafè": the
// bytes 0xE9 and 0xE8), created under a protected directory on the real
// filesystem: the tamper document names each as the condition's message
// does, `\xNN` for a byte that is not UTF-8, and tells them apart. Before,
// encoding/json wrote both bytes as U+FFFD: the document showed two
// findings of one name, "00-caf\ufffd.conflist", that matched neither the
// message's `00-caf\xe9.conflist` nor the file. `status`'s evidence names
// them so too.
func TestTamperDocumentNamesFilesNotUTF8AsTheMessageDoes(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline")
	h.write("/etc/cni/net.d/00-caf\xe9.conflist", "{}")
	h.write("/etc/cni/net.d/00-caf\xe8.conflist", "{}")
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "2 finding(s): ")
	store := report.NewStore("boot-1")
	store.Set(report.Condition{Type: "NodeTampered", Status: res.Status, Reason: res.Reason, Message: res.Message}, h.now)
	got, _ := store.Get("NodeTampered")
	d := report.NewDetails()
	d.Replace("NodeTampered", res.Details)
	docs, err := d.Documents(h.now, report.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tamper struct {
			Changes []struct {
				Path string `json:"path"`
			} `json:"changes"`
		} `json:"tamper"`
	}
	if err := json.Unmarshal([]byte(docs[report.AnnotationPrefix+"tamper"]), &doc); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, ch := range doc.Tamper.Changes {
		paths = append(paths, ch.Path)
	}
	for _, want := range []string{`/etc/cni/net.d/00-caf\xe9.conflist`, `/etc/cni/net.d/00-caf\xe8.conflist`} {
		if !slices.Contains(paths, want) {
			t.Errorf("tamper document names %q, want %q among them", paths, want)
		}
		if !strings.Contains(got.Message, want) {
			t.Errorf("message %q, want it to name %q", got.Message, want)
		}
	}
	// `status` shows the check's evidence (Details.Evidence, marshalled
	// by the daemon's status API and the status command): the same names.
	ev, err := json.Marshal(d.Evidence("NodeTampered"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`00-caf\\xe9.conflist`, `00-caf\\xe8.conflist`} {
		if !strings.Contains(string(ev), want) {
			t.Errorf("status evidence %s, want it to name %s", ev, want)
		}
	}
}

// A baseline_after glob of any length (no key bounds it; a bracket
// expression matches one character however long) is cut in the pending
// message as a path is (clipPath), so the message keeps its end, "(at most
// 3m)", in the condition and in the tamper report's baselinePending (cut
// to 256 bytes from its end); so does the unsettled note that names it.
// Before, the report's message ended inside the glob.
func TestNodeTamperedPendingOfALongGlobKeepsItsEnd(t *testing.T) {
	h := newTamperHost(t)
	c := h.start("boot-1", report.NewStore("boot-1"))
	glob := "/etc/never/[" + strings.Repeat("k", 16<<10) + "]"
	c.gate, c.maxWait = []string{glob}, 3*time.Minute
	for range 3 {
		res := h.probe(c, report.StatusUnknown, report.ReasonBaselinePending, "waiting for /etc/never/[kkk")
		if !strings.HasSuffix(res.Message, "(at most 3m)") {
			t.Fatalf("the pending message (%d bytes) ends %q", len(res.Message), res.Message[max(len(res.Message)-40, 0):])
		}
		if p := c.keeper.Report().BaselinePending; !strings.HasSuffix(p, "(at most 3m)") {
			t.Fatalf("the report's baselinePending (%d bytes) ends %q", len(p), p[max(len(p)-40, 0):])
		}
	}
	res := h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "(baseline taken unsettled after 3m: nothing matched /etc/never/[kkk")
	if len(res.Message) > 1024 {
		t.Errorf("the unsettled note names the whole glob: %d bytes", len(res.Message))
	}
}
