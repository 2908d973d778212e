package hostio

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// hiddenMounts splits mountinfo's fields at each space, as the kernel
// writes them: a \v, \r or U+00A0 in a mount point is the path's (the kernel
// escapes only space, tab, newline and backslash), not a separator.
// strings.Fields split there and took "/home/a" for the point of
// "/home/a\u00a0b", and "/srv/x" for the point of "/srv/x\vy".
func TestHiddenMountsSplitAtSpacesOnly(t *testing.T) {
	root := t.TempDir()
	mi := "66 49 0:41 / / ro,relatime shared:1 - tmpfs rootfs rw\n" +
		"90 66 0:47 /systemd/inaccessible/dir /home/a\u00a0b ro,nosuid,nodev,noexec,relatime shared:25 - tmpfs tmpfs rw\n" +
		"91 66 0:47 /systemd/inaccessible/dir /srv/x\vy ro,relatime shared:26 - tmpfs tmpfs rw\n" +
		"92 66 0:47 /systemd/inaccessible/dir /srv/with\\040space ro,relatime shared:27 - tmpfs tmpfs rw\n" +
		"93 66 0:48 /systemd-private-0123-x.service-AbCd/tmp /tmp rw,relatime shared:28 - tmpfs tmpfs rw\n" +
		// Lines the kernel does not write (no "-", an empty field) are
		// skipped, and the lines after them still read.
		"94 66 0:47 /systemd/inaccessible/dir /srv/no-separator ro,relatime shared:29\n" +
		"95 66 0:47 /systemd/inaccessible/dir  /srv/empty-field ro - tmpfs tmpfs rw\n" +
		"96 66 0:47 /systemd/inaccessible/dir /root ro,relatime shared:30 - tmpfs tmpfs rw\n"
	if err := os.MkdirAll(filepath.Join(root, "proc/self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc/self/mountinfo"), []byte(mi), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []hiddenMount{{point: "/home/a\u00a0b"}, {point: "/srv/x\vy"}, {point: "/srv/with space"}, {point: "/tmp", private: true}, {point: "/root"}}
	got, notes := hiddenMounts(root)
	if !slices.Equal(got, want) {
		t.Errorf("hiddenMounts: %+q, want %+q", fmtHidden(got), fmtHidden(want))
	}
	// The two lines the kernel does not write are counted, the first
	// named by its number and text.
	if notes.MalformedMountinfo != 2 || notes.FirstMalformed == nil || notes.FirstMalformed.Line != 6 ||
		notes.FirstMalformed.Text != "94 66 0:47 /systemd/inaccessible/dir /srv/no-separator ro,relatime shared:29" {
		t.Errorf("notes: %d malformed, first %v; want 2, line 6 (94 ...)", notes.MalformedMountinfo, notes.FirstMalformed)
	}
}

func fmtHidden(hs []hiddenMount) []string {
	var out []string
	for _, h := range hs {
		s := h.point
		if h.private {
			s += " (private)"
		}
		out = append(out, s)
	}
	return out
}
