package checks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/rawsys"
	"strconv"
	"strings"
	"time"
)

// LVM runs LVM's report commands; injectable for tests.
type LVM interface {
	// Report runs `lvm <command> --reportformat json ...` (command vgs or
	// lvs) and returns its standard output. ErrNoLVM: LVM is not
	// installed (or turned off), so the node has no volume groups to watch.
	// An lvm that exits non-zero after writing its JSON report (vgs exits 5
	// when one volume group cannot be read but reports the others) returns
	// the report and an error saying so.
	Report(ctx context.Context, command string, args ...string) ([]byte, error)
}

// ErrNoLVM says there is no LVM on this node to ask.
var ErrNoLVM = errors.New("no LVM")

// realLVM runs the host's lvm binary (the spec's one host tool).
type realLVM struct {
	env *Env
	run LVMRunner
}

func (e *Env) lvm() LVM {
	if e.LVM != nil {
		return e.LVM
	}
	return realLVM{env: e, run: e.Helper} // nil without a helper: in process
}

func (r realLVM) Report(ctx context.Context, command string, args ...string) ([]byte, error) {
	c := r.env.Config.Checks.DiskUsageHigh
	if c.LVMCommand == "" || (r.env.Config.HostRoot != "" && r.env.Config.HostRoot != "/") {
		// Off, or a host root elsewhere (a fixture tree): lvm would
		// report the devices of the machine it runs on, not the root's.
		return nil, ErrNoLVM
	}
	if _, err := os.Stat(c.LVMCommand); errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoLVM
	}
	if r.run != nil {
		return r.run.RunLVM(ctx, c.LVMCommand, c.LVMTimeout.Duration, command, args...)
	}
	return hostio.RunLVM(ctx, c.LVMCommand, c.LVMTimeout.Duration, command, args...)
}

// LVMRunner runs an LVM report command: in process (hostio.RunLVM), or
// through the privileged helper.
type LVMRunner interface {
	RunLVM(ctx context.Context, lvm string, timeout time.Duration, command string, args ...string) ([]byte, error)
}

// VGUsage is one LVM volume group in the storage report.
type VGUsage struct {
	Name      string `json:"name"`
	SizeBytes uint64 `json:"sizeBytes"`
	FreeBytes uint64 `json:"freeBytes"`
	// AllocatedPercent is the share of extents given to logical volumes,
	// rounded up.
	AllocatedPercent int             `json:"allocatedPercent"`
	ThinPools        []ThinPoolUsage `json:"thinPools,omitempty"`
	// OverThreshold: its extents, or a thin pool's data or metadata, are
	// over the check's threshold, or a thin pool is unhealthy (set
	// by DiskUsageHigh's Probe; not in the report: Problem).
	OverThreshold bool `json:"-"`
}

// Problem reports whether the volume group or one of its thin pools is
// over its threshold or unhealthy.
func (v VGUsage) Problem() bool { return v.OverThreshold }

// ThinPoolUsage is one thin pool of a volume group.
type ThinPoolUsage struct {
	Name            string  `json:"name"`
	SizeBytes       uint64  `json:"sizeBytes"`
	DataPercent     float64 `json:"dataPercent"`
	MetadataPercent float64 `json:"metadataPercent"`
	// Inactive: the pool is not active (lv_attr's 5th character is not
	// 'a'), so LVM reports no use for it.
	Inactive bool `json:"inactive,omitempty"`
	// Health: lv_attr's 9th character for a thin pool, "failed" (F),
	// "out of data space" (D) or "metadata read-only" (M); "" when healthy.
	Health string `json:"health,omitempty"`
	// Unmeasured: active and healthy, yet LVM reports no data or metadata
	// use (lvs could not ask device-mapper): the check says it is not
	// checked.
	Unmeasured bool `json:"unmeasured,omitempty"`
}

// thinPoolHealth names lv_attr's 9th character (volume health) for a thin
// pool, as lvs(8) describes it.
var thinPoolHealth = map[byte]string{'F': "failed", 'D': "out of data space", 'M': "metadata read-only"}

// lvmReport is the shape of `--reportformat json`: {"report": [{"vg": [...]}]}
// with every value a string.
type lvmReport struct {
	Report []map[string][]map[string]string `json:"report"`
}

func parseLVMReport(b []byte, section string) ([]map[string]string, error) {
	var r lvmReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("LVM %s report: %w", section, err)
	}
	if len(r.Report) == 0 {
		return nil, fmt.Errorf("LVM %s report: no \"report\" entries", section)
	}
	var rows []map[string]string
	for _, rep := range r.Report {
		rows = append(rows, rep[section]...)
	}
	return rows, nil
}

func lvmUint(row map[string]string, key string) (uint64, error) {
	v, ok := row[key]
	if !ok {
		return 0, fmt.Errorf("no %s", key)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a number of bytes or extents", key, v)
	}
	return n, nil
}

// ParseVGs reads `vgs --reportformat json --units b --nosuffix` with the
// fields of vgsArgs.
func ParseVGs(b []byte) ([]VGUsage, error) {
	rows, err := parseLVMReport(b, "vg")
	if err != nil {
		return nil, err
	}
	out := make([]VGUsage, 0, len(rows))
	for i, row := range rows {
		vg := VGUsage{Name: row["vg_name"]}
		var extents, free uint64
		var errs []error
		for _, f := range []struct {
			key string
			dst *uint64
		}{{"vg_size", &vg.SizeBytes}, {"vg_free", &vg.FreeBytes}, {"vg_extent_count", &extents}, {"vg_free_count", &free}} {
			n, err := lvmUint(row, f.key)
			*f.dst = n
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil || vg.Name == "" || free > extents {
			if err == nil {
				err = fmt.Errorf("name %q, %d free of %d extents", vg.Name, free, extents)
			}
			return nil, fmt.Errorf("LVM vg report, volume group %d: %w", i+1, err)
		}
		vg.AllocatedPercent = percentUp(extents-free, free)
		out = append(out, vg)
	}
	return out, nil
}

// ThinPool is a thin pool with its volume group's name.
type ThinPool struct {
	VG string
	ThinPoolUsage
}

// ParseThinPools reads `lvs --reportformat json --units b --nosuffix` with
// the fields of lvsArgs and returns the thin pools (segment type
// thin-pool); other volumes are skipped.
func ParseThinPools(b []byte) ([]ThinPool, error) {
	rows, err := parseLVMReport(b, "lv")
	if err != nil {
		return nil, err
	}
	var out []ThinPool
	for i, row := range rows {
		if row["segtype"] != "thin-pool" {
			continue
		}
		p := ThinPool{VG: row["vg_name"], ThinPoolUsage: ThinPoolUsage{Name: row["lv_name"]}}
		size, err := lvmUint(row, "lv_size")
		if err == nil && (p.VG == "" || p.Name == "") {
			err = fmt.Errorf("volume group %q, name %q", p.VG, p.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("LVM lv report, volume %d: %w", i+1, err)
		}
		p.SizeBytes = size
		// lv_attr: type, permissions, allocation, fixed minor, state (5th,
		// 'a' active), device open, target type, zero, health (9th), skip.
		attr := row["lv_attr"]
		if len(attr) < 9 {
			return nil, fmt.Errorf("LVM lv report, thin pool %s/%s: lv_attr %q is not LVM's attribute string", p.VG, p.Name, attr)
		}
		p.Inactive = attr[4] != 'a'
		p.Health = thinPoolHealth[attr[8]]
		data, meta := row["data_percent"], row["metadata_percent"]
		switch {
		case p.Inactive:
			// LVM knows the use of active pools only.
		case data == "" && meta == "":
			p.Unmeasured = p.Health == "" // a failed pool has no use to report
		default:
			for _, f := range []struct {
				v   string
				dst *float64
			}{{data, &p.DataPercent}, {meta, &p.MetadataPercent}} {
				x, err := strconv.ParseFloat(f.v, 64)
				if err != nil || math.IsNaN(x) || x < 0 || x > 100 {
					return nil, fmt.Errorf("LVM lv report, thin pool %s/%s: %q is not a percentage", p.VG, p.Name, f.v)
				}
				*f.dst = x
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// lvmRead is what the LVM part learnt.
type lvmRead struct {
	// Asked: LVM is installed and was asked (not ErrNoLVM).
	Asked bool
	// VGs is the volume groups with their thin pools; nil when vgs gave no
	// report.
	VGs []VGUsage
	// Errs: what could not be read, and non-zero exits whose report was used.
	Errs []error
}

// readLVM asks LVM for the node's volume groups and their thin pools.
func readLVM(ctx context.Context, l LVM) lvmRead {
	b, err := l.Report(ctx, "vgs", hostio.LVMReportArgs["vgs"]...)
	if errors.Is(err, ErrNoLVM) {
		return lvmRead{}
	}
	r := lvmRead{Asked: true}
	if err != nil {
		r.Errs = append(r.Errs, err)
		if b == nil {
			return r
		}
	}
	vgs, err := ParseVGs(b)
	if err != nil {
		r.Errs = append(r.Errs, err)
		return r
	}
	r.VGs = vgs
	if len(vgs) == 0 {
		return r
	}
	b, err = l.Report(ctx, "lvs", hostio.LVMReportArgs["lvs"]...)
	if err != nil {
		r.Errs = append(r.Errs, err)
		if b == nil {
			return r
		}
	}
	pools, err := ParseThinPools(b)
	if err != nil {
		r.Errs = append(r.Errs, err)
		return r
	}
	for _, p := range pools {
		for i := range vgs {
			if vgs[i].Name == p.VG {
				vgs[i].ThinPools = append(vgs[i].ThinPools, p.ThinPoolUsage)
			}
		}
	}
	return r
}

// lvmRefresh is the longest LVM's report is reused (askLVM).
const lvmRefresh = 10 * time.Minute

// lvmAnswer is a report of LVM's and what the node's logical volumes were
// when it was made.
type lvmAnswer struct {
	read  lvmRead
	lvs   string
	at    time.Time
	pools bool
}

// askLVM asks LVM for the volume groups and thin pools, or reuses its last
// answer when nothing it reports can have changed: the same logical volumes
// active in the kernel with the same sizes (lvmVolumes), the same metadata
// backups (lvmBackups: LVM writes one after each change of a volume group's
// metadata on this host, a volume created inactive or a volume group
// extended included), no thin pool (whose use moves with every write to its
// volumes), no error, and at most lvmRefresh old (what neither shows: a
// change made from another host of a shared volume group, or with backups
// turned off). Asking runs lvm twice (vgs, then lvs when there is a
// volume group): 10-50 ms of the node's CPU every 2 minutes, and most nodes
// have no LVM at all.
func (c *diskUsageCheck) askLVM(ctx context.Context) lvmRead {
	lvs, lvsErr := lvmVolumes(c.env.Path("/sys/block"))
	if lvsErr == nil {
		lvs += lvmBackups(c.env.Path(hostio.LVMSystemDir + "/backup"))
	}
	now := c.env.Now()
	if last := c.lvmLast; last != nil && lvsErr == nil && lvs == last.lvs && !last.pools && now.Sub(last.at) < lvmRefresh {
		return last.read
	}
	l, wait := c.env.lvm(), c.lvmWait()
	a := callEach(ctx, c.lvmStuck, wait, []string{"lvm"}, func(string) (lvmRead, error) {
		return readLVM(ctx, l), nil
	})[0]
	r := a.v
	if a.stuck {
		r = lvmRead{Asked: true, Errs: []error{fmt.Errorf("LVM (no report within %s: lvm hung; asked again once it returns)", wait)}}
	}
	c.lvmLast = nil
	if lvsErr == nil && r.Asked && len(r.Errs) == 0 && r.VGs != nil {
		a := &lvmAnswer{read: r, lvs: lvs, at: now}
		for _, vg := range r.VGs {
			a.pools = a.pools || len(vg.ThinPools) > 0
		}
		c.lvmLast = a
	}
	return r
}

// lvmVolumes lists the logical volumes the kernel has active: the
// device-mapper devices under sysBlock whose dm/uuid starts with "LVM-"
// (thin pools' and thin volumes' included), with their sizes.
func lvmVolumes(sysBlock string) (string, error) {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "dm-") {
			continue
		}
		dir := sysBlock + "/" + e.Name()
		uuid, err := rawsys.ReadPseudoFile(dir+"/dm/uuid", attrMax)
		if err != nil {
			return "", err // a device going away: ask LVM
		}
		if !bytes.HasPrefix(uuid, []byte("LVM-")) {
			continue
		}
		size, err := rawsys.ReadPseudoFile(dir+"/size", attrMax)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s %s %s\n", e.Name(), bytes.TrimSpace(uuid), bytes.TrimSpace(size))
	}
	return b.String(), nil
}

// lvmBackups lists LVM's metadata backups (one file a volume group, written
// anew after each change of its metadata) with their sizes and times; ""
// when there are none or the directory cannot be read.
func lvmBackups(dir string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "backup %s %d %d\n", e.Name(), fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}
