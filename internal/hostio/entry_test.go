package hostio

import (
	"os"
	"path/filepath"
	"testing"
)

// A file that grows between readEntry's Lstat and its read is recorded
// with the size of the bytes it digested, so the entry matches a later
// read of the same content. Before, the size was the Lstat's and the
// digest the grown file's: a baseline taken in that moment (a clear's,
// taken at once) found the unchanged file "modified" at the next scan.
func TestReadEntrySizeIsOfTheBytesDigested(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "kubelet.conf")
	if err := os.WriteFile(p, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	afterLstat = func(full string) {
		if err := os.WriteFile(full, []byte("short\nand grown\n"), 0o600); err != nil {
			t.Error(err)
		}
	}
	racy, err := readEntry(root, "/kubelet.conf")
	afterLstat = nil
	if err != nil {
		t.Fatal(err)
	}
	again, err := readEntry(root, "/kubelet.conf")
	if err != nil {
		t.Fatal(err)
	}
	if racy.Size != again.Size || racy.SHA256 != again.SHA256 {
		t.Errorf("the entry read as the file grew: size %d sha256 %s; read again: size %d sha256 %s", racy.Size, racy.SHA256, again.Size, again.SHA256)
	}
}
