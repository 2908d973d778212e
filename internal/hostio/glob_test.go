package hostio

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// globTree builds under root a fixture tree of names that glob characters
// meet: a bracket, a star, a backslash, a question mark and a dash in
// names, dots, nested directories, a file where a directory could be,
// symlinks to a directory, to a file and to nothing, and a symlink loop
// (ELOOP, the one path glob reports unreadable where filepath.Glob reads
// no match).
func globTree(f *testing.F, root string) {
	for _, d := range []string{"a/b/c", "a/bc", "a/[x]/y", `a/q\z`, "a/*/s", "b/a-b", "b/.hid/c", "c?d/e", "ab/ab/ab"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for _, p := range []string{"a/b/c/f.conf", "a/b/x.conf", "a/f", "a/[x]/y/z", `a/q\z/w`, "a/*/s/t", "b/a-b/k", "b/.hid/c/d", "b/.e", "c?d/e/g", "ab/ab/ab/ab", "file"} {
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	for link, target := range map[string]string{"a/ld": "b", "a/lf": "f", "a/dangling": "none", "b/loop": "loop", "ab/up": ".."} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			f.Fatal(err)
		}
	}
}

// FuzzGlobIsFilepathGlob: hostio's glob returns what filepath.Glob returns
// (the same matches in the same order, the same bad-pattern error) for any
// pattern under a fixture tree; the paths it could not read are only
// those a symlink loop makes unreadable (ELOOP), never one that is not
// there or not a directory (ENOENT, ENOTDIR: no match, as filepath.Glob).
func FuzzGlobIsFilepathGlob(f *testing.F) {
	for _, p := range []string{"a/*", "a/*/*", "*/*/*", "a/[x]/*", `a/\[x]/*`, `a/q\\z/*`, `a/q\z/*`, "a/[*]/s", `a/\*/*`,
		"a/b/", "a/*/", "a/**", "**/*", "a/b/c/*.conf", "b/.*", "b/*", "b/loop/*", "b/*/*", "c?d/*", "c\\?d/*", "a/[", "a/[]", "a/[^b]*",
		"a/[a-c]*/*", "a/b/c/f.conf", "nothere/*", "nothere/x/*", "file/*", "file/x/*", "a/f/*", "a/f/x/[a-z]", "a/lf/*", "a/ld/*", "a/dangling/*", "ab/up/*/*", "*/up/a/*", "ab/*/ab/*",
		"a//b/*", "./a/*", "a/./*", "a/b/../*", "a/\\", "a/[\\]]", "?/?/?", "a/b?/*", ""} {
		f.Add(p)
	}
	root := f.TempDir()
	globTree(f, root)
	f.Fuzz(func(t *testing.T, p string) {
		// Within the tree: ".." would read the machine, and a path past
		// a few components only repeats the same steps.
		if strings.Contains(p, "..") || strings.Count(p, "/") > 8 || len(p) > 64 || strings.ContainsRune(p, 0) {
			return
		}
		pattern := root + "/" + p
		want, wantErr := filepath.Glob(pattern)
		got, failed, gotErr := glob(pattern)
		if !errors.Is(gotErr, wantErr) && (gotErr == nil || wantErr == nil || gotErr.Error() != wantErr.Error()) {
			t.Fatalf("glob(%q): error %v, filepath.Glob's %v", p, gotErr, wantErr)
		}
		if wantErr == nil && !slices.Equal(got, want) {
			t.Fatalf("glob(%q) = %q, filepath.Glob = %q", p, got, want)
		}
		for _, fl := range failed {
			if !strings.Contains(fl.path, "loop") {
				t.Fatalf("glob(%q): %s unreadable (%v): only the symlink loop is", p, fl.path, fl.err)
			}
		}
	})
}
