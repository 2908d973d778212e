package trim

import (
	"os"
	"path/filepath"
	"testing"
)

// A file that is not an ELF executable of type EXEC (a script, a
// position-independent executable) is not trimmed.
func TestTrimOnlyExecELF(t *testing.T) {
	dir := t.TempDir()
	for name, head := range map[string]string{
		"script": "#!/bin/sh\necho hello world\n",
		"pie":    "\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00",
		"short":  "\x7fELF",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(head), 0o755); err != nil {
			t.Fatal(err)
		}
		if ok, err := IsExecELF(p); ok || err != nil {
			t.Errorf("%s: IsExecELF = %v, %v", name, ok, err)
		}
	}
	if ok, err := IsExecELF("/proc/self/exe"); !ok || err != nil {
		t.Errorf("the test binary: IsExecELF = %v, %v", ok, err)
	}
}

// What a trim costs: the helper trims after each burst of the daemon's
// requests, every 2 to 5 minutes. Each iteration reads the test binary's
// smaps, advises its read-only mappings and faults back in what the loop
// touches.
func BenchmarkStartupPages(b *testing.B) {
	if ok, err := IsExecELF("/proc/self/exe"); !ok || err != nil {
		b.Skip("the test binary is not an ELF executable of type EXEC (PIE?): nothing to trim")
	}
	for b.Loop() {
		if n, err := StartupPages(); err != nil || n == 0 {
			b.Fatalf("trimmed %d bytes: %v", n, err)
		}
	}
}
