package checks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("DiskUsageHigh", newDiskUsageCheck) }

// diskUsageCheck statfs()es every writable, block-backed filesystem of the
// host (from /proc/self/mountinfo under the host root) and compares space and
// inode use with the thresholds. Space is computed as df does: used / (used +
// available to unprivileged users), rounded up.
type diskUsageCheck struct {
	env         *Env
	spacePct    int
	inodesPct   int
	excludeMP   *regexp.Regexp
	excludeType *regexp.Regexp
}

func newDiskUsageCheck(env *Env) (Check, error) {
	c := env.Config.Checks.DiskUsageHigh
	mp, err := regexp.Compile(c.MountPointsExclude)
	if err != nil {
		return nil, err
	}
	ft, err := regexp.Compile(c.FSTypesExclude)
	if err != nil {
		return nil, err
	}
	return &diskUsageCheck{env: env, spacePct: c.SpacePercent, inodesPct: c.InodesPercent, excludeMP: mp, excludeType: ft}, nil
}

// Mount is one line of /proc/<pid>/mountinfo.
type Mount struct {
	MountPoint string
	FSType     string
	Source     string
	Device     string // major:minor
	ReadOnly   bool
}

// ParseMountinfo parses the format of proc(5) /proc/<pid>/mountinfo.
func ParseMountinfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 6 || sep < 0 || len(f) < sep+3 {
			return nil, fmt.Errorf("mountinfo line %d: malformed: %q", n, sc.Text())
		}
		m := Mount{Device: f[2], MountPoint: unescapeOctal(f[4]), FSType: f[sep+1], Source: unescapeOctal(f[sep+2])}
		for _, o := range strings.Split(f[5], ",") {
			m.ReadOnly = m.ReadOnly || o == "ro"
		}
		if len(f) > sep+3 {
			for _, o := range strings.Split(f[sep+3], ",") {
				m.ReadOnly = m.ReadOnly || o == "ro"
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeOctal undoes the kernel's \ooo escaping of spaces, tabs, newlines
// and backslashes in mountinfo paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FSUsage is the use of one filesystem.
type FSUsage struct {
	MountPoint  string `json:"mountPoint"`
	FSType      string `json:"fsType"`
	Source      string `json:"source"`
	SizeBytes   uint64 `json:"sizeBytes"`
	AvailBytes  uint64 `json:"availBytes"`
	UsedPercent int    `json:"usedPercent"`
	Inodes      uint64 `json:"inodes"`
	InodesPct   int    `json:"inodesUsedPercent"`
}

// percentUp returns used/(used+avail) as a percentage, rounded up like df.
func percentUp(used, avail uint64) int {
	total := used + avail
	if total == 0 {
		return 0
	}
	return int((used*100 + total - 1) / total)
}

// Usage returns the use of every filesystem the check watches.
func (c *diskUsageCheck) Usage() ([]FSUsage, []error, error) {
	f, err := os.Open(c.env.Path("/proc/self/mountinfo"))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	mounts, err := ParseMountinfo(f)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	var out []FSUsage
	var errs []error
	for _, m := range mounts {
		if m.ReadOnly || seen[m.Device] || c.excludeType.MatchString(m.FSType) || c.excludeMP.MatchString(m.MountPoint) {
			continue
		}
		seen[m.Device] = true
		var st unix.Statfs_t
		if err := c.env.Sys.Statfs(c.env.Path(m.MountPoint), &st); err != nil {
			errs = append(errs, fmt.Errorf("statfs %s: %w", m.MountPoint, err))
			continue
		}
		bs := uint64(st.Bsize)
		used := (st.Blocks - st.Bfree) * bs
		u := FSUsage{
			MountPoint: m.MountPoint, FSType: m.FSType, Source: m.Source,
			SizeBytes: st.Blocks * bs, AvailBytes: st.Bavail * bs,
			UsedPercent: percentUp(used, st.Bavail*bs),
			Inodes:      st.Files,
		}
		if st.Files > 0 {
			u.InodesPct = percentUp(st.Files-st.Ffree, st.Ffree)
		}
		out = append(out, u)
	}
	return out, errs, nil
}

func (c *diskUsageCheck) Probe(ctx context.Context) (Result, error) {
	usage, errs, err := c.Usage()
	if err != nil {
		return Result{}, err
	}
	if len(usage) == 0 && len(errs) > 0 {
		return Result{}, errors.Join(errs...)
	}
	var space, inodes []string
	for _, u := range usage {
		if u.UsedPercent >= c.spacePct {
			space = append(space, fmt.Sprintf("%s %d%% of space used (threshold %d%%)", u.MountPoint, u.UsedPercent, c.spacePct))
		}
		if u.Inodes > 0 && u.InodesPct >= c.inodesPct {
			inodes = append(inodes, fmt.Sprintf("%s %d%% of inodes used (threshold %d%%)", u.MountPoint, u.InodesPct, c.inodesPct))
		}
	}
	details := []report.Detail{{Domain: "storage", Field: "filesystems", Value: usage}}
	var notes string
	if len(errs) > 0 {
		notes = "; not checked: " + errors.Join(errs...).Error()
		notes = strings.ReplaceAll(notes, "\n", "; ")
	}
	switch {
	case len(space) > 0:
		return Result{Status: report.StatusTrue, Reason: "FilesystemSpaceHigh",
			Message: strings.Join(append(space, inodes...), ", ") + notes, Details: details}, nil
	case len(inodes) > 0:
		return Result{Status: report.StatusTrue, Reason: "FilesystemInodesHigh",
			Message: strings.Join(inodes, ", ") + notes, Details: details}, nil
	}
	return Result{Status: report.StatusFalse, Reason: "DiskUsageOK",
		Message: fmt.Sprintf("%d %s below %d%% space and %d%% inodes%s", len(usage), pluralFS(len(usage)), c.spacePct, c.inodesPct, notes), Details: details}, nil
}

func pluralFS(n int) string {
	if n == 1 {
		return "filesystem"
	}
	return "filesystems"
}
