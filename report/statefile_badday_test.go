package report

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// README, "Local state": a file of exactly 4 MiB is read, one byte more is
// moved aside; a file cut mid-JSON (a torn copy, a disk that lost its tail)
// is moved aside whole, byte for byte, and nothing of it is restored.
func TestLoadAtTheSizeLimitAndCutMidJSON(t *testing.T) {
	src := t.TempDir()
	s0 := NewStore("b")
	s0.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	if err := s0.Save(src, t0); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(src, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	atLimit := append(bytes.Clone(good), strings.Repeat(" ", maxStateFile-len(good))...)
	for _, tc := range []struct {
		name     string
		data     []byte
		restored int
	}{
		{"exactly 4 MiB", atLimit, 1},
		{"4 MiB and a byte", append(bytes.Clone(atLimit), ' '), 0},
		{"cut mid-JSON", good[:len(good)/2], 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, StateFileName)
			if err := os.WriteFile(p, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			s := NewStore("b")
			res, err := loadWithin(t, s, dir)
			if err != nil || res.Restored != tc.restored {
				t.Fatalf("Load = %+v, %v; want %d restored", res, err, tc.restored)
			}
			if tc.restored > 0 {
				if res.Corrupt != nil {
					t.Fatalf("a file within the limit moved aside: %v", res.Corrupt)
				}
				return
			}
			if res.Corrupt == nil || res.CorruptPath != p+".corrupt" {
				t.Fatalf("Load = %+v; want it moved aside to %s", res, p+".corrupt")
			}
			if b, err := os.ReadFile(res.CorruptPath); err != nil || !bytes.Equal(b, tc.data) {
				t.Errorf("the file moved aside: %d bytes, %v; want the %d read, unchanged", len(b), err, len(tc.data))
			}
			if len(s.All()) != 0 {
				t.Errorf("restored from a file moved aside: %+v", s.All())
			}
		})
	}
}

// A full state_dir (ENOSPC, a small tmpfs) and a read-only one (remounted
// ro): the save fails with the file system's error, the file saved before
// stays whole, no temp file is left to hold the space, and once the
// directory takes writes again the next save holds what the failed ones
// did not write (the store encodes afresh: nothing is lost).
func TestSaveOnAFullAndAReadOnlyDisk(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		testenv.Skip(t, "cannot mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	s := NewStore("b")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	if err := s.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, StateFileName)
	before, _ := os.ReadFile(p)
	// A kept value larger than the tmpfs: the save cannot fit.
	big := strings.Repeat("x", 80<<10)
	s.Keep("big", func() any { return big })
	s.Set(cond("NodeInfoStale", StatusTrue, "NodeInfoOutdated", "old"), t0)
	unchanged := func(what string, want syscall.Errno, err error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: save err %v, want %v", what, err, want)
		}
		if b, _ := os.ReadFile(p); !bytes.Equal(b, before) {
			t.Errorf("%s: the file saved before changed (%d bytes, was %d)", what, len(b), len(before))
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("%s: the directory holds %v; want %s alone", what, names, StateFileName)
		}
	}
	unchanged("full", syscall.ENOSPC, s.Save(dir, t0))
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	unchanged("read-only", syscall.EROFS, s.Save(dir, t0))
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(dir, t0); err != nil {
		t.Fatalf("save once the disk takes writes: %v", err)
	}
	r := NewStore("b")
	if res, err := r.Load(dir); err != nil || res.Restored != 2 || res.Corrupt != nil {
		t.Fatalf("Load after the save that worked = %+v, %v; want both conditions", res, err)
	}
	var got string
	if !r.Memo("big", &got) || got != big {
		t.Errorf("the kept value: %d bytes, want %d", len(got), len(big))
	}
}
