package hostio

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseMountinfo(t *testing.T) {
	es, err := ParseMountinfo([]byte("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n" +
		"\n" +
		"37 35 98:1 / /a\\134b\\011c rw shared:2 master:1 propagate_from:3 - fuse.a\\040b /dev/x\\040y ro\n" +
		// An empty source is an empty field; no super options.
		"38 35 0:5 / /x\u00a0y\vz rw - tmpfs \n" +
		"39 35 0:6 /a\\04 /- rw - - x\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []MountinfoEntry{
		{ID: "36", Parent: "35", Device: "98:0", Root: "/mnt1", MountPoint: "/mnt2", Options: "rw,noatime", Optional: []string{"master:1"},
			FSType: "ext3", Source: "/dev/root", SuperOptions: "rw,errors=continue"},
		{ID: "37", Parent: "35", Device: "98:1", Root: "/", MountPoint: "/a\\b\tc", Options: "rw", Optional: []string{"shared:2", "master:1", "propagate_from:3"},
			FSType: "fuse.a b", Source: "/dev/x y", SuperOptions: "ro"},
		{ID: "38", Parent: "35", Device: "0:5", Root: "/", MountPoint: "/x\u00a0y\vz", Options: "rw", FSType: "tmpfs"},
		{ID: "39", Parent: "35", Device: "0:6", Root: "/a\\04", MountPoint: "/-", Options: "rw", FSType: "-", Source: "x"},
	}
	if !slices.EqualFunc(es, want, entryEqual) {
		t.Errorf("got %+v\nwant %+v", es, want)
	}
	for _, bad := range []string{
		"1 2 3",
		"36 35 98:0 / /x rw shared:1 ext4 /dev/sda rw",
		"36 35 98:0 / /x rw - ext4",
		"36 35 98:0 / /x rw -",
		"36 35 98:0 / /x rw - ",
		"36 35 98:0 / /x rw -  /dev/sda rw",
		"36  98:0 / /x rw - ext4 /dev/sda rw",
		" 36 35 98:0 / /x rw - ext4 /dev/sda rw",
		"36 35 98:0 / /x - ext4 /dev/sda rw",
	} {
		_, err := ParseMountinfo([]byte("36 35 98:0 / / rw - ext4 /dev/sda rw\n\n" + bad + "\n"))
		var me *MalformedMountinfoError
		if !errors.As(err, &me) || me.Line != 3 || me.Text != bad || !strings.HasPrefix(err.Error(), "mountinfo line 3: malformed: ") {
			t.Errorf("ParseMountinfo(... %q) err = %v", bad, err)
		}
	}
}

func entryEqual(a, b MountinfoEntry) bool {
	return a.ID == b.ID && a.Parent == b.Parent && a.Device == b.Device && a.Root == b.Root && a.MountPoint == b.MountPoint &&
		a.Options == b.Options && slices.Equal(a.Optional, b.Optional) && a.FSType == b.FSType && a.Source == b.Source && a.SuperOptions == b.SuperOptions
}

// SplitMountinfo allocates nothing: the pod-volume lookup and the mount
// watcher split every line of a node's table of thousands of mounts.
func TestSplitMountinfoAllocatesNothing(t *testing.T) {
	line := []byte("1003 22 252:32 / /var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pvc-x/mount rw,relatime shared:1002 - ext4 /dev/rbd2 rw,stripe=16")
	if n := testing.AllocsPerRun(100, func() {
		for _, l := range MountinfoLines(line) {
			if _, ok := SplitMountinfo(l); !ok {
				t.Fatal("not split")
			}
		}
	}); n != 0 {
		t.Errorf("%v allocations a line", n)
	}
}

// FuzzMountinfoReader: any table is entries or an error naming a line,
// never a panic, and an entry has no empty field the kernel never writes
// empty; and a line written by the kernel's rules
// (fs/proc_namespace.c: show_mountinfo) reads back as the mount it was
// written from. The kernel separates the fields by one space each and
// escapes, in the root, the mount point, the source and the filesystem
// type (mangle, seq_path_root), only a space, a tab, a newline and a
// backslash, each as a backslash and three octal digits; any other byte
// (a \v, a \r, U+00A0) is written as it is, and an empty source is an
// empty field. No deliberate difference: what the kernel writes,
// ParseMountinfo reads as the kernel meant it.
func FuzzMountinfoReader(f *testing.F) {
	for _, root := range []string{"node-a", "protectsystem-strict"} {
		b, err := os.ReadFile("../../checks/testdata/roots/" + root + "/proc/self/mountinfo")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b), "/", "/", "/dev/sda1", "ext4", uint8(0), "rw")
	}
	f.Add("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n", "/mnt1", "/mnt2", "/dev/root", "ext3", uint8(1), "rw,errors=continue")
	f.Add("1 1 1:1 / /\\04 rw - x y\n", "/a b\tc\\d", "/x\ny", "", "fuse.a b", uint8(2), "")
	f.Add("", "/pods/a\vb", "/var/lib/x\u00a0y", "/dev/x\ry", "ext4", uint8(0), "ro")
	f.Fuzz(func(t *testing.T, s, root, mp, source, fstype string, opt uint8, super string) {
		es, err := ParseMountinfo([]byte(s))
		var me *MalformedMountinfoError
		switch {
		case err == nil:
			for _, e := range es {
				if e.ID == "" || e.Parent == "" || e.Device == "" || e.Root == "" || e.MountPoint == "" || e.Options == "" || e.FSType == "" {
					t.Fatalf("accepted an entry with an empty field: %+v", e)
				}
			}
		case !errors.As(err, &me) || me.Line < 1 || me.Line > strings.Count(s, "\n")+1:
			t.Fatalf("error %v names no line of the table", err)
		}
		// MountinfoMountPoint, the mount watcher's prefilter, reads the
		// mount point SplitMountinfo reads.
		for _, l := range MountinfoLines([]byte(s)) {
			if f, ok := SplitMountinfo(l); ok && string(MountinfoMountPoint(l)) != string(f.MountPoint) {
				t.Fatalf("line %q: MountinfoMountPoint %q, SplitMountinfo %q", l, MountinfoMountPoint(l), f.MountPoint)
			}
		}
		// The kernel's line of one mount: a path is absolute and no C
		// string holds a NUL; a filesystem type is never empty; the
		// super options are a list of options without a space.
		abs := func(p string) string { return "/" + strings.TrimPrefix(strings.ReplaceAll(p, "\x00", ""), "/") }
		root, mp = abs(root), abs(mp)
		source, fstype = strings.ReplaceAll(source, "\x00", ""), strings.ReplaceAll(fstype, "\x00", "")
		if fstype == "" {
			fstype = "ext4"
		}
		super = strings.NewReplacer(" ", "", "\n", "", "\x00", "").Replace(super)
		optional := []string{"shared:1", "master:2", "propagate_from:3", "unbindable"}[:opt%5]
		line := strings.Join(append(append([]string{"36", "35", "98:0", EscapeMountinfo(root), EscapeMountinfo(mp), "rw,noatime"},
			optional...), "-", EscapeMountinfo(fstype), EscapeMountinfo(source), super), " ") + "\n"
		want := MountinfoEntry{ID: "36", Parent: "35", Device: "98:0", Root: root, MountPoint: mp, Options: "rw,noatime",
			Optional: optional, FSType: fstype, Source: source, SuperOptions: super}
		if len(optional) == 0 {
			want.Optional = nil
		}
		es, err = ParseMountinfo([]byte(line))
		if err != nil || len(es) != 1 || !entryEqual(es[0], want) {
			t.Fatalf("the kernel's line %q: read %+v, %v; want %+v", line, es, err, want)
		}
	})
}
