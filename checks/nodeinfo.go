package checks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("NodeInfoStale", newNodeInfoCheck) }

// NodeInfoKey is the name under which NodeInfoStale keeps, in the state
// file, that nodes.json was seen in this boot.
const NodeInfoKey = "nodeinfo"

// maxNodeInfo bounds what the check reads of nodes.json; a larger file is
// reported as not valid JSON.
const maxNodeInfo = 16 << 20

// nodeInfoCheck: nodes.json, rewritten by the node-info sync loop, is older
// than max_age, is not valid JSON (a torn write by a stuck writer), is dated
// in the future (the clock was stepped back and nothing rewrote it), or was
// written earlier in this boot and is gone. The file lives on persistent
// storage, so one left by an earlier boot says nothing about this one: it
// counts as written in this boot once its mtime is at or after the boot time
// (btime in /proc/stat), or once it changed (mtime or inode) since the check
// first found it. Until then (a node without the sync loop, or one whose
// sync loop has not run yet after a reboot) the condition is Unknown,
// NodeInfoNotFound, never a True from the old file's age; but a file left by
// an earlier boot (so the node has a sync loop) that is still not rewritten
// max_age + nodeInfoBootGrace after the boot is NodeInfoOutdated: the sync
// loop is stuck in this boot. An absent file stays Unknown. "Written in
// this boot" is kept in the state file (Env.Memos), so a daemon restart
// within the boot does not forget it.
type nodeInfoCheck struct {
	env    *Env
	path   string
	maxAge time.Duration

	seen bootValue[nodeInfoSeen]

	// What the last run found, in memory only (see bootAge); mu guards
	// it (a run abandoned at its timeout may still be going).
	mu           sync.Mutex
	last         fileStamp     // the file at the last run
	lastUp       time.Duration // CLOCK_BOOTTIME at the last run; 0: no run yet
	lastBootWall time.Time     // the boot's wall time at the last run (the clock less CLOCK_BOOTTIME)
	writtenUp    time.Duration // CLOCK_BOOTTIME of the write of last, where known
	writtenKnown bool
}

// nodeInfoWriteSlack is how far an mtime may lie outside the time between
// two runs and still be a write between them: the kernel stamps a file
// with its coarse clock, a tick behind.
const nodeInfoWriteSlack = 2 * time.Second

// nodeInfoSkew is how far in the future the file's mtime may be and still
// count as now: more than that and its age cannot be told from it (the clock
// was stepped back since it was written).
const nodeInfoSkew = time.Minute

// nodeInfoBootGrace is how long after max_age from the boot time the sync
// loop may take to write the file a first time in a boot (it needs the
// kubelet and the CNI up). A file left by an earlier boot that is not
// rewritten by then is NodeInfoOutdated: the node has a sync loop, and it is
// stuck.
const nodeInfoBootGrace = 10 * time.Minute

// nodeInfoSeen is the saved form of what the check knows.
type nodeInfoSeen struct {
	// Path is the file this is about (absent in a state file of an
	// earlier version: taken for the configured one). Another path (path
	// changed by a reload or a restart) knows nothing yet.
	Path string `json:"path,omitempty"`
	// Seen: the file was written in this boot.
	Seen bool `json:"seen"`
	// First is the file as the check first found it while not Seen; a
	// change to it is a write in this boot.
	First fileStamp `json:"first,omitzero"`
}

// fileStamp tells one write of a file from another.
type fileStamp struct {
	MtimeNs int64  `json:"mtime_ns"`
	Ino     uint64 `json:"ino"`
}

func stampOf(fi fs.FileInfo) fileStamp {
	s := fileStamp{MtimeNs: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.Ino = st.Ino
	}
	return s
}

func newNodeInfoCheck(env *Env) (Check, error) {
	c := env.Config.Checks.NodeInfoStale
	return &nodeInfoCheck{env: env, path: c.Path, maxAge: c.MaxAge.Duration,
		seen: bootValue[nodeInfoSeen]{key: NodeInfoKey}}, nil
}

// markSeen records that the file was written in this boot.
func (c *nodeInfoCheck) markSeen() { c.seen.set(c.env.Memos, nodeInfoSeen{Path: c.path, Seen: true}) }

func (c *nodeInfoCheck) wasSeen() bool { return c.seen.get().Seen }

// forgetOtherPath drops what was kept about another file than the one
// configured: path was changed by a reload, or by a restart that loaded
// the state file.
func (c *nodeInfoCheck) forgetOtherPath() {
	if p := c.seen.get().Path; p != "" && p != c.path {
		c.seen.set(c.env.Memos, nodeInfoSeen{})
	}
}

func (c *nodeInfoCheck) Probe(ctx context.Context) (Result, error) {
	c.seen.restore(c.env.Memos)
	c.forgetOtherPath()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	// Without blocking: a FIFO at the path is refused below, not waited
	// on for a writer.
	f, fi, err := openNoWait(c.env.Path(c.path))
	if errors.Is(err, fs.ErrNotExist) {
		if c.wasSeen() {
			return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoMissing,
				Message: fmt.Sprintf("%s was written earlier in this boot and is gone", c.path)}, nil
		}
		msg := fmt.Sprintf("%s does not exist and has not been written in this boot (no node-info sync loop on this node yet)", c.path)
		if c.env.Memos == nil { // the one-shot check: what was seen before it is not known
			msg = fmt.Sprintf("%s does not exist (no node-info sync loop on this node?)", c.path)
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNodeInfoNotFound, Message: msg}, nil
	}
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	if fi.IsDir() {
		return Result{}, fmt.Errorf("%s is a directory", c.path)
	}
	if !fi.Mode().IsRegular() {
		return Result{}, fmt.Errorf("%s is not a regular file (%s)", c.path, fi.Mode().Type())
	}
	now := c.env.Now()
	bootAge, byBoot := c.bootAge(stampOf(fi), fi.ModTime(), now)
	if !c.wasSeen() {
		if r, written, err := c.writtenThisBoot(fi, now); !written || err != nil {
			return r, err
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, maxNodeInfo+1))
	if err != nil {
		return Result{}, err
	}
	mtime := fi.ModTime()
	age := now.Sub(mtime)
	if byBoot {
		age = bootAge
	}
	// The messages name times, never an age that grows with each run: a
	// message that changes is a write of the Node's status (report.Store.Set,
	// the reporter), every run, for as long as the file stays as it is.
	when := "last written " + mtime.UTC().Format(time.RFC3339)
	switch {
	case len(data) > maxNodeInfo:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoInvalid,
			Message: fmt.Sprintf("%s is larger than %d bytes, not a node-info file (%s)", c.path, maxNodeInfo, when)}, nil
	case !json.Valid(data):
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoInvalid,
			Message: fmt.Sprintf("%s is not valid JSON (%d bytes; a torn write?) (%s)", c.path, len(data), when)}, nil
	case age < -nodeInfoSkew:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoInvalid,
			Message: fmt.Sprintf("%s is dated %s, more than %s ahead of the clock: its age cannot be told (the clock was stepped back?) until the sync loop writes it again",
				c.path, mtime.UTC().Format(time.RFC3339), nodeInfoSkew)}, nil
	case age > c.maxAge:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoOutdated,
			Message: fmt.Sprintf("%s is older than %s (%s)", c.path, c.maxAge, when)}, nil
	}
	// Not even the mtime: the sync loop rewrites the file more often than
	// the check runs, and a False whose message changes each run is a
	// Node status write each run for the whole boot.
	return Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh,
		Message: fmt.Sprintf("%s is fresh (written within max_age %s)", c.path, c.maxAge)}, nil
}

// bootAge tells how long ago the file was written by CLOCK_BOOTTIME, which
// a step of the clock does not move, where the daemon saw the write: the
// file changed (mtime or inode) since the last run, and its mtime, on the
// clock as it was at that run or is at this one (a step in between), falls
// between the two runs. Its age then counts on from that write, whatever
// the clock is stepped to later: a step forward does not make it look
// older than max_age, nor a step back dated ahead, until the sync loop
// writes it again (a run later). ok is false where the write was not seen
// (the first run, a file put in place with an older mtime: renamed from
// elsewhere, touch -d): the mtime against the clock decides.
func (c *nodeInfoCheck) bootAge(st fileStamp, mtime, now time.Time) (age time.Duration, ok bool) {
	up, err := c.env.Sys.SinceBoot()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || up <= 0 {
		c.lastUp, c.writtenKnown = 0, false
		return 0, false
	}
	bootWall := now.Add(-up)
	if st != c.last {
		c.last, c.writtenKnown = st, false
		if c.lastUp > 0 && up >= c.lastUp {
			for _, base := range []time.Time{bootWall, c.lastBootWall} {
				if w := mtime.Sub(base); w >= c.lastUp-nodeInfoWriteSlack && w <= up+nodeInfoWriteSlack {
					c.writtenUp, c.writtenKnown = min(w, up), true
					break
				}
			}
		}
	}
	c.lastUp, c.lastBootWall = up, bootWall
	if !c.writtenKnown {
		return 0, false
	}
	return up - c.writtenUp, true
}

// writtenThisBoot decides whether the file, not yet known to be written in
// this boot, is: it is when it changed since the check first found it, or
// when its mtime is at or after the boot time and not in the future. It
// records a yes; for a no it returns the result: Unknown, or NodeInfoOutdated
// for a file from an earlier boot once max_age + nodeInfoBootGrace have
// passed since the boot.
func (c *nodeInfoCheck) writtenThisBoot(fi fs.FileInfo, now time.Time) (Result, bool, error) {
	st := stampOf(fi)
	switch first := c.seen.get().First; {
	case first == (fileStamp{}):
		c.seen.set(c.env.Memos, nodeInfoSeen{Path: c.path, First: st})
	case first != st:
		c.markSeen()
		return Result{}, true, nil
	}
	mtime := fi.ModTime()
	if ahead := mtime.Sub(now); ahead > nodeInfoSkew {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNodeInfoNotFound,
			Message: fmt.Sprintf("%s is dated %s, more than %s ahead of the clock: not known to be written in this boot (the clock was stepped back?) until the sync loop writes it",
				c.path, mtime.UTC().Format(time.RFC3339), nodeInfoSkew)}, false, nil
	}
	boot, err := c.env.BootTime()
	if err != nil {
		return Result{}, false, err
	}
	if !mtime.Before(boot) {
		c.markSeen()
		return Result{}, true, nil
	}
	// since less the grace, not max_age plus it: the largest max_age a
	// duration holds plus the grace overflowed to a negative duration, and
	// the file was NodeInfoOutdated at once (past this test, max_age + the
	// grace is less than since, and the message's sum holds).
	if since := now.Sub(boot); since-nodeInfoBootGrace > c.maxAge {
		// The file says this node has a sync loop, and it has not
		// written in this boot for longer than it may take to start.
		// (No time since boot in the message: it would change each run.)
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoOutdated,
			Message: fmt.Sprintf("%s is from before this boot (last written %s, boot at %s) and has not been written in the more than %s since boot (max_age %s + %s to start after a boot): the node-info sync loop has not run in this boot",
				c.path, mtime.UTC().Format(time.RFC3339), boot.UTC().Format(time.RFC3339), c.maxAge+nodeInfoBootGrace, c.maxAge, nodeInfoBootGrace)}, false, nil
	}
	return Result{Status: report.StatusUnknown, Reason: report.ReasonNodeInfoNotFound,
		Message: fmt.Sprintf("%s is from before this boot (last written %s, boot at %s) and has not been written in this boot (no node-info sync loop on this node yet?)",
			c.path, mtime.UTC().Format(time.RFC3339), boot.UTC().Format(time.RFC3339))}, false, nil
}
