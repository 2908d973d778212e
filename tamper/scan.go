package tamper

import (
	"path"
	"slices"
	"strings"
)

// ChangeKind says how a protected path differs from the baseline.
type ChangeKind string

const (
	Added    ChangeKind = "added"
	Removed  ChangeKind = "removed"
	Modified ChangeKind = "modified" // content, or the kind of file
	Chmod    ChangeKind = "mode"
	Chown    ChangeKind = "owner"
	Retarget ChangeKind = "link-target"
	// Corrupt: the baseline file itself was unreadable or its digest did
	// not match.
	Corrupt ChangeKind = "baseline-corrupt"
	// OverLimit: the protected paths grew past the scan's cap; paths past
	// it are not compared.
	OverLimit ChangeKind = "over-limit"
)

// Diff returns how cur differs from base, both sorted by path: one change per
// path (the first that applies of content, link target, mode, owner). A
// path of base under one cur holds as unreadable (a directory that could
// not be listed) is not reported removed: nobody read whether it is there,
// and the unreadable path is itself a difference.
func Diff(base, cur []Entry) []Difference {
	var blind []string
	for _, e := range cur {
		if e.Kind == KindUnreadable {
			blind = append(blind, e.Path+"/")
		}
	}
	var out []Difference
	i, j := 0, 0
	for i < len(base) || j < len(cur) {
		switch {
		case j == len(cur) || i < len(base) && base[i].Path < cur[j].Path:
			p := base[i].Path
			if !slices.ContainsFunc(blind, func(b string) bool { return strings.HasPrefix(p, b) }) {
				out = append(out, Difference{Path: p, Kind: Removed})
			}
			i++
		case i == len(base) || cur[j].Path < base[i].Path:
			out = append(out, Difference{Path: cur[j].Path, Kind: Added})
			j++
		default:
			if k, ok := differ(base[i], cur[j]); ok {
				out = append(out, Difference{Path: cur[j].Path, Kind: k})
			}
			i++
			j++
		}
	}
	return out
}

// DiffWithin is Diff for a scan with spec cut at the cap at host path at
// (a *LimitError's At): a baseline path the cut scan did not reach is not
// reported removed; one it reached and did not find is.
func DiffWithin(spec Spec, at string, base, cur []Entry) []Difference {
	var out []Difference
	for _, d := range Diff(base, cur) {
		if d.Kind != Removed || spec.ReadBefore(d.Path, at) {
			out = append(out, d)
		}
	}
	return out
}

// Difference is one path that differs from the baseline.
type Difference struct {
	Path string
	Kind ChangeKind
}

func differ(a, b Entry) (ChangeKind, bool) {
	switch {
	case a.Kind != b.Kind || a.SHA256 != b.SHA256 || a.Size != b.Size || a.TooLarge != b.TooLarge:
		return Modified, true
	case a.Target != b.Target:
		return Retarget, true
	case a.Mode != b.Mode:
		return Chmod, true
	case a.UID != b.UID || a.GID != b.GID:
		return Chown, true
	}
	return "", false
}

// Dirs returns the host directories whose notifications cover the protected
// paths: every directory in the entries (a protected tree) and the parent of
// every entry and of every pattern's fixed prefix (where an added file
// appears).
func Dirs(spec Spec, entries []Entry) []string {
	set := map[string]bool{}
	for _, p := range spec.Patterns {
		set[fixedPrefixDir(p)] = true
	}
	for _, e := range entries {
		if e.Kind == KindDir {
			set[e.Path] = true
		}
		set[path.Dir(e.Path)] = true
	}
	out := make([]string, 0, len(set))
	for d := range set {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// fixedPrefixDir: the directory of a pattern up to its first component with
// a glob character ("/etc/systemd/system/*.d/x.conf" -> "/etc/systemd/system").
func fixedPrefixDir(p string) string {
	parts := strings.Split(path.Clean(p), "/")
	for i, c := range parts {
		if strings.ContainsAny(c, `*?[\`) {
			return path.Clean("/" + strings.Join(parts[:i], "/"))
		}
	}
	return path.Dir(path.Clean(p))
}
