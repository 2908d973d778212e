package trim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/syself/autopilot-health/internal/testenv"
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

// touchEnv makes the test binary a process that trims its binary's pages,
// touches up to 100 pages of its read-only mappings 64 KiB apart (a
// fault-around's span) and prints how many it touched and how many KiB
// their resident set grew by (TestMain): "plain" as it is,
// "registered" after NoFaultAround.
const touchEnv = "TRIM_TOUCH"

func TestMain(m *testing.M) {
	if mode := os.Getenv(touchEnv); mode != "" {
		fmt.Println(touchAndMeasure(mode == "registered"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var sink byte

func touchAndMeasure(register bool) string {
	if register {
		if _, err := NoFaultAround(); err != nil {
			return "error " + err.Error()
		}
	}
	cands, err := readOnly("/proc/self/exe", "/proc/self/smaps")
	if err != nil || len(cands) == 0 {
		return fmt.Sprintf("error: read-only mappings %v, %v", cands, err)
	}
	if _, err := StartupPages(); err != nil {
		return "error " + err.Error()
	}
	rss := func() (kib int) {
		for _, m := range cands {
			kib += rssKiB(m)
		}
		return kib
	}
	before := rss()
	n := 0
	for _, m := range cands {
		for a := m.start; a < m.end && n < 100; a += 64 << 10 {
			sink += *(*byte)(unsafe.Add(nil, a)) // the mapping's address
			n++
		}
	}
	return fmt.Sprintf("%d %d", n, rss()-before)
}

// rssKiB returns the resident set of the mapping that starts at m.start.
func rssKiB(m mapping) int {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return -1
	}
	in := false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, _, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			start, err := strconv.ParseUint(lo, 16, 64)
			in = err == nil && start == m.start
			continue
		}
		if in && f[0] == "Rss:" && len(f) > 1 {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return -1
}

// With NoFaultAround, a page touched in the binary's code or read-only data
// maps that page; without it, the kernel maps the 64 KiB around it. Each in a
// process of its own (the registration lasts the process's life).
func TestNoFaultAround(t *testing.T) {
	if ok, err := IsExecELF("/proc/self/exe"); !ok || err != nil {
		t.Skip("the test binary is not an ELF executable of type EXEC (PIE?)")
	}
	got := map[string]int{}
	for _, mode := range []string{"plain", "registered"} {
		line := testenv.HelperProcess(t, touchEnv+"="+mode)
		var n, kib int
		if _, err := fmt.Sscanf(line, "%d %d", &n, &kib); err != nil || n < 20 {
			t.Fatalf("%s: the process said %q", mode, line)
		}
		t.Logf("%s: %d pages touched, the mappings grew by %d KiB", mode, n, kib)
		got[mode] = kib / n
	}
	// 4 KiB a page touched, 8 at most (the loop's own reads); 64 KiB
	// without (fault-around), 16 at least.
	if got["registered"] > 8 {
		t.Errorf("registered: %d KiB a page touched, want 4 (fault-around still on)", got["registered"])
	}
	if got["plain"] < 16 {
		t.Errorf("plain: %d KiB a page touched: fault-around is off on this machine, the test shows nothing", got["plain"])
	}
}
