package daemon

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func rssFileKB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// The test binary trims its own start-up pages, as the daemon does after
// its first pass: its file-backed resident set shrinks, and it keeps
// running (this test goes on calling code that was dropped).
func TestTrimStartupPages(t *testing.T) {
	before := rssFileKB(t)
	n, err := trimStartupPages()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFileKB(t)
	if n == 0 || after >= before {
		t.Fatalf("advised %d bytes; RssFile %d kB before, %d kB after", n, before, after)
	}
	t.Logf("advised %d bytes; RssFile %d kB -> %d kB", n, before, after)
	// Still works: a configuration, metrics, a scrape.
	_ = testConfig(t)
}

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
		if ok, err := isExecELF(p); ok || err != nil {
			t.Errorf("%s: isExecELF = %v, %v", name, ok, err)
		}
	}
	if ok, err := isExecELF("/proc/self/exe"); !ok || err != nil {
		t.Errorf("the test binary: isExecELF = %v, %v", ok, err)
	}
}
