package rawsys

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// ReadFileNoPoll reads a file whole from a first buffer smaller than it,
// at its limit and without one, refuses one a byte over its limit, and
// names a missing file as os would.
func TestReadFileNoPoll(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	want := "0123456789"
	if err := os.WriteFile(p, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{-1, 10, 64} {
		if b, err := ReadFileNoPoll(p, 0, 3, limit); err != nil || string(b) != want {
			t.Errorf("limit %d: %q, %v; want %q", limit, b, err, want)
		}
	}
	if b, err := ReadFileNoPoll(p, 0, 3, 9); !errors.Is(err, ErrTooLarge) {
		t.Errorf("limit 9: %q, %v; want ErrTooLarge", b, err)
	}
	var pe *os.PathError
	if _, err := ReadFileNoPoll(p+"-gone", 0, 3, -1); !errors.As(err, &pe) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v; want a PathError of ErrNotExist", err)
	}
}
