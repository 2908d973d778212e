package checks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
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
// than max_age, is not valid JSON (a torn write by a stuck writer), or was
// present earlier in this boot and is gone. While it has not existed in this
// boot (a node without the sync loop) the condition is Unknown,
// NodeInfoNotFound. "Seen in this boot" is kept in the state file (Env.Memos),
// so a daemon restart within the boot does not forget it.
type nodeInfoCheck struct {
	env    *Env
	path   string
	maxAge time.Duration

	seen bootValue[nodeInfoSeen]
}

// nodeInfoSeen is the saved form of what the check knows.
type nodeInfoSeen struct {
	Seen bool `json:"seen"`
}

func newNodeInfoCheck(env *Env) (Check, error) {
	c := env.Config.Checks.NodeInfoStale
	return &nodeInfoCheck{env: env, path: c.Path, maxAge: c.MaxAge.Duration,
		seen: bootValue[nodeInfoSeen]{key: NodeInfoKey}}, nil
}

// markSeen records that the file exists in this boot.
func (c *nodeInfoCheck) markSeen() { c.seen.set(c.env.Memos, nodeInfoSeen{Seen: true}) }

func (c *nodeInfoCheck) wasSeen() bool { return c.seen.get().Seen }

func (c *nodeInfoCheck) Probe(ctx context.Context) (Result, error) {
	c.seen.restore(c.env.Memos)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	f, err := os.Open(c.env.Path(c.path))
	if errors.Is(err, fs.ErrNotExist) {
		if c.wasSeen() {
			return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoMissing,
				Message: fmt.Sprintf("%s was present earlier in this boot and is gone", c.path)}, nil
		}
		msg := fmt.Sprintf("%s has not existed in this boot (no node-info sync loop on this node yet)", c.path)
		if c.env.Memos == nil { // the one-shot check: what was seen before it is not known
			msg = fmt.Sprintf("%s does not exist (no node-info sync loop on this node?)", c.path)
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNodeInfoNotFound, Message: msg}, nil
	}
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Result{}, err
	}
	if fi.IsDir() {
		return Result{}, fmt.Errorf("%s is a directory", c.path)
	}
	c.markSeen()
	data, err := io.ReadAll(io.LimitReader(f, maxNodeInfo+1))
	if err != nil {
		return Result{}, err
	}
	mtime := fi.ModTime()
	age := c.env.Now().Sub(mtime)
	when := fmt.Sprintf("last written %s, %s ago", mtime.UTC().Format(time.RFC3339), age.Round(time.Second))
	switch {
	case len(data) > maxNodeInfo:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoInvalid,
			Message: fmt.Sprintf("%s is larger than %d bytes, not a node-info file (%s)", c.path, maxNodeInfo, when)}, nil
	case !json.Valid(data):
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoInvalid,
			Message: fmt.Sprintf("%s is not valid JSON (%d bytes; a torn write?) (%s)", c.path, len(data), when)}, nil
	case age > c.maxAge:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeInfoOutdated,
			Message: fmt.Sprintf("%s is older than %s (%s)", c.path, c.maxAge, when)}, nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonNodeInfoFresh,
		Message: fmt.Sprintf("%s is fresh (%s; max_age %s)", c.path, when, c.maxAge)}, nil
}
