package rawsys

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ReadPseudoDir lists what os.ReadDir lists: a sysfs and a procfs
// directory (raw), a directory of a disk (by os), and a missing one's
// error is ErrNotExist.
func TestReadPseudoDirListsAsOsReadDir(t *testing.T) {
	disk := t.TempDir()
	for _, n := range []string{"b", "a", "dm-0"} {
		if err := os.WriteFile(filepath.Join(disk, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"/sys/block", "/sys/class/net", "/proc/self/fd", disk} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, e := range ents {
			want = append(want, e.Name())
		}
		got, err := ReadPseudoDir(dir)
		if err != nil {
			t.Fatalf("ReadPseudoDir(%s): %v", dir, err)
		}
		if dir == "/proc/self/fd" { // each listing's own descriptor differs
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("ReadPseudoDir(%s) = %q, want %q", dir, got, want)
		}
	}
	if _, err := ReadPseudoDir(filepath.Join(disk, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing directory: %v, want ErrNotExist", err)
	}
}
