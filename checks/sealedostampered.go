package checks

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

func init() { Register("SealedOSTampered", newSealedOSCheck) }

// sealedOSCheck: the root hash the kernel enforces for each sealed OS layer
// (its dm-verity table, read over the device-mapper ioctls) against the hash
// recorded at provisioning (checks.SealedOSTampered.recorded_hashes; format
// in tamper.ParseRecorded). A mismatch, a recorded layer without its verity
// device, or a recorded file that changed since it was first read in this
// boot is a finding that stays until an operator clears it. No verity
// device and no recorded file: Unknown, NothingToCheck.
type sealedOSCheck struct {
	env      *Env
	recorded string
	dm       tamper.DM
	keeper   *tamper.Keeper
	// loadLogged: the keeper returns the same load error at every run;
	// it is logged once (as NodeTampered's).
	loadLogged sync.Once
}

func newSealedOSCheck(env *Env) (Check, error) {
	c := env.Config.Checks.SealedOSTampered
	dm := env.DM
	switch {
	case dm != nil:
	case env.Helper != nil:
		dm = env.Helper.DM(env.Path(c.DMControl))
	default:
		dm = tamper.DMControl{Path: env.Path(c.DMControl)}
	}
	return &sealedOSCheck{env: env, recorded: c.RecordedHashes, dm: dm, keeper: tamperKeeper(env)}, nil
}

func (c *sealedOSCheck) Probe(ctx context.Context) (Result, error) {
	now := c.env.Now()
	if err := c.keeper.Load(now); err != nil {
		c.loadLogged.Do(func() {
			if c.keeper.ReadOnly() {
				c.env.Log.Warn("cannot read the daemon's tamper state; the recorded root hashes are compared as read now", "file", c.keeper.Path(), "err", err)
				return
			}
			c.env.Log.Error("tamper state unreadable; it is itself a finding of NodeTampered", "file", c.keeper.Path(), "err", err)
		})
	}
	targets, err := c.dm.VerityTargets()
	noDM := errors.Is(err, tamper.ErrNoDeviceMapper)
	if err != nil && !noDM {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	// enforced is each device's root hash: the first verity target's, or
	// the first that differs from the recorded one (read below); a layer
	// is compared with every verity target of its table, and its table
	// must hold nothing else (tables).
	enforced := map[string]string{}
	tables := map[string]deviceTable{}
	for _, t := range targets {
		d := tables[t.Device]
		d.hashes = append(d.hashes, t.Table.RootHash)
		d.targets = max(d.targets, t.Targets)
		tables[t.Device] = d
		if _, dup := enforced[t.Device]; !dup {
			enforced[t.Device] = t.Table.RootHash
		}
	}
	rec, recErr := c.readRecorded()
	recMissing := errors.Is(recErr, fs.ErrNotExist)
	boot := c.keeper.BootID()

	st := c.keeper.State()
	// clearedSince: an operator's clear since st was read (each clear is
	// a new *Clear): what this run read before it is neither recorded nor
	// reported after it, as NodeTampered's record does not either.
	clearedSince := func(s *tamper.State) bool { return s.Cleared != st.Cleared }
	var expected map[string]string
	var findings []tamper.Finding
	finding := func(layer string, kind tamper.ChangeKind, detail string) {
		findings = append(findings, tamper.Finding{Condition: tamper.CondSealed, Path: layer, Kind: kind, At: now.UTC(), BootID: boot, Detail: detail})
	}
	if st.Sealed != nil && st.Sealed.BootID == boot {
		// Read earlier in this boot: compare with what was first seen.
		expected = st.Sealed.Recorded
		switch {
		case recMissing:
			finding(c.recorded, tamper.RecordAltered, "removed since it was first read in this boot")
		case recErr != nil:
			finding(c.recorded, tamper.RecordAltered, "no longer readable: "+recErr.Error())
		default:
			// One finding of the file, its layers' differences in its
			// detail: a finding per layer, all of the same path, would
			// each differ from the path's latest and be added again at
			// every run (State.AddFinding).
			var diffs []string
			for _, l := range sortedUnion(expected, rec) {
				if rec[l] != expected[l] {
					diffs = append(diffs, fmt.Sprintf("layer %s: first read in this boot as %q, now %q", l, expected[l], rec[l]))
				}
			}
			if len(diffs) > 0 {
				finding(c.recorded, tamper.RecordAltered, strings.Join(diffs, "; "))
			}
		}
	} else {
		switch {
		case recErr != nil && !recMissing:
			return Result{}, fmt.Errorf("recorded root hashes %s: %w", c.recorded, recErr)
		case recMissing && len(enforced) > 0:
			return Result{}, fmt.Errorf("the kernel enforces verity root hashes for %s, but %s does not exist: nothing recorded to compare them with",
				strings.Join(slices.Sorted(maps.Keys(enforced)), ", "), c.recorded)
		case !recMissing:
			expected = rec
			c.keeper.Update(func(s *tamper.State) bool {
				if clearedSince(s) {
					return false // read afresh by the run the clear wakes
				}
				s.Sealed = &tamper.SealedSeen{BootID: boot, Recorded: maps.Clone(rec)}
				return true
			})
		}
	}
	if len(expected) == 0 && len(enforced) > 0 {
		return Result{}, fmt.Errorf("the kernel enforces verity root hashes for %s, but %s records no layer: nothing to compare them with",
			strings.Join(slices.Sorted(maps.Keys(enforced)), ", "), c.recorded)
	}
	if len(expected) == 0 && len(enforced) == 0 {
		c.keeper.SetLayers(nil)
		why := "no device-mapper verity device"
		if noDM {
			why = fmt.Sprintf("no device-mapper (%v)", err)
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Message: fmt.Sprintf("no sealed OS layers on this node: %s, and no layer recorded in %s", why, c.recorded),
			Details: c.details()}, nil
	}
	for l, d := range tables {
		if want := expected[l]; want != "" {
			for _, h := range d.hashes {
				if h != want {
					enforced[l] = h
					break
				}
			}
		}
	}
	var layers []tamper.LayerReport
	for _, l := range sortedUnion(expected, enforced) {
		lr := tamper.LayerReport{Name: l, Expected: expected[l], Enforced: enforced[l], Status: "match"}
		d := tables[l]
		switch {
		case expected[l] == "":
			lr.Status = "not recorded"
		case enforced[l] == "":
			lr.Status = "missing"
			finding(l, tamper.LayerMissing, "recorded, but no verity device of that name is active")
		case enforced[l] != expected[l]:
			lr.Status = "mismatch"
			finding(l, tamper.HashMismatch, fmt.Sprintf("recorded %s, enforced %s", expected[l], enforced[l]))
		case d.targets > len(d.hashes):
			lr.Status = "mismatch"
			finding(l, tamper.HashMismatch, fmt.Sprintf("the table of %s has %d targets, %d of them verity: part of the device is not verified", l, d.targets, len(d.hashes)))
		}
		layers = append(layers, lr)
	}
	c.keeper.SetLayers(layers)
	var added []tamper.Finding
	cleared := false
	if err := c.keeper.Update(func(s *tamper.State) bool {
		if cleared = clearedSince(s); cleared {
			return false
		}
		for _, f := range findings {
			if s.AddFinding(f) {
				added = append(added, f)
			}
		}
		return len(added) > 0
	}); err != nil {
		c.env.Log.Error("saving the tamper state failed", "file", c.keeper.Path(), "err", err)
	}
	for _, f := range added {
		c.env.Log.Warn("sealed OS layer does not match its recorded root hash", "layer", f.Path, "finding", f.Kind, "detail", f.Detail)
	}
	if cleared {
		// Cleared while this run read the tables and the record: the
		// node as it is after the clear is what this run reports.
		return c.Probe(ctx)
	}
	return c.result(layers), nil
}

func (c *sealedOSCheck) readRecorded() (map[string]string, error) {
	f, err := tamper.OpenRegular(c.env.PathNoFollow(c.recorded))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return tamper.ParseRecorded(f)
}

func (c *sealedOSCheck) details() []report.Detail {
	return []report.Detail{{Domain: "tamper", Field: "tamper", Value: c.keeper.Report()}}
}

func (c *sealedOSCheck) result(layers []tamper.LayerReport) Result {
	st := c.keeper.State()
	fs := st.FindingsFor(tamper.CondSealed)
	if len(fs) > 0 {
		reason := report.ReasonRootHashMismatch
		switch fs[len(fs)-1].Kind {
		case tamper.LayerMissing:
			reason = report.ReasonSealedLayerMissing
		case tamper.RecordAltered:
			reason = report.ReasonRecordedHashAltered
		}
		var parts []string
		for i := len(fs) - 1; i >= 0 && len(parts) < 5; i-- {
			parts = append(parts, fmt.Sprintf("%s %s (%s)", fs[i].Path, fs[i].Kind, fs[i].Detail))
		}
		return Result{Status: report.StatusTrue, Reason: reason, Details: c.details(),
			Message: fmt.Sprintf("%d finding(s): %s; stays set until an operator clears it (autopilot-health tamper clear)", len(fs), strings.Join(parts, "; "))}
	}
	var ok []string
	for _, l := range layers {
		if l.Status == "match" {
			ok = append(ok, l.Name+" "+l.Enforced)
		}
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonSealedOSIntact, Details: c.details(),
		Message: fmt.Sprintf("%d sealed layer(s) enforce their recorded root hash: %s", len(ok), strings.Join(ok, ", "))}
}

// deviceTable is what the check compares of one device's live table: the
// root hash of each verity target, and how many targets it has in all
// (0: not known).
type deviceTable struct {
	hashes  []string
	targets int
}

func sortedUnion(a, b map[string]string) []string {
	set := map[string]bool{}
	for k := range a {
		set[k] = true
	}
	for k := range b {
		set[k] = true
	}
	return slices.Sorted(maps.Keys(set))
}
