package trim

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
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
// touches the first page of up to 100 of the 64 KiB windows of its
// read-only mappings (a fault-around's span) and prints how many it touched,
// how many of the other 15 pages of those windows are then mapped
// (/proc/self/pagemap's present bit) and of how many (TestMain): "plain" as
// it is, "registered" after NoFaultAround.
const touchEnv = "TRIM_TOUCH"

func TestMain(m *testing.M) {
	if mode := os.Getenv(touchEnv); mode != "" {
		fmt.Println(touchAndMeasure(mode == "registered"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var sink byte

const window = 64 << 10

func touchAndMeasure(register bool) string {
	if register {
		if err := NoFaultAround(); err != nil {
			return "unsupported " + err.Error()
		}
	}
	cands, err := readOnly("/proc/self/exe", "/proc/self/smaps")
	if err != nil || len(cands) == 0 {
		return fmt.Sprintf("error: read-only mappings %v, %v", cands, err)
	}
	var touched []uint64
	for _, m := range cands {
		for a := (m.start + window - 1) &^ (window - 1); a+window <= m.end && len(touched) < 100; a += window {
			touched = append(touched, a)
		}
	}
	if _, err := StartupPages(); err != nil {
		return "error " + err.Error()
	}
	for _, a := range touched {
		sink += *(*byte)(unsafe.Add(nil, a)) // the mapping's address
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return "error " + err.Error()
	}
	defer pm.Close()
	present, of := 0, 0
	entries := make([]byte, 8*window/4096)
	for _, a := range touched {
		if _, err := pm.ReadAt(entries, int64(a/4096*8)); err != nil {
			return "error " + err.Error()
		}
		for i := 1; i < window/4096; i++ { // the touched page's neighbours
			of++
			if binary.LittleEndian.Uint64(entries[8*i:])&(1<<63) != 0 {
				present++
			}
		}
	}
	return fmt.Sprintf("%d %d %d", len(touched), present, of)
}

// With NoFaultAround, a page touched in the binary's code or read-only data
// maps that page; without it, the kernel maps the 64 KiB around it. Each in
// a process of its own (the registration lasts the process's life).
func TestNoFaultAround(t *testing.T) {
	if ok, err := IsExecELF("/proc/self/exe"); !ok || err != nil {
		testenv.Skip(t, "the test binary is not an ELF executable of type EXEC (PIE?)")
	}
	share := map[string]float64{}
	for _, mode := range []string{"plain", "registered"} {
		line := testenv.HelperProcess(t, touchEnv+"="+mode)
		if why, ok := strings.CutPrefix(line, "unsupported "); ok {
			testenv.Skip(t, "this kernel or system call filter refuses: "+why)
		}
		var n, present, of int
		if _, err := fmt.Sscanf(line, "%d %d %d", &n, &present, &of); err != nil || n < 20 || of == 0 {
			t.Fatalf("%s: the process said %q", mode, line)
		}
		t.Logf("%s: %d pages touched, %d of their %d neighbours in the same 64 KiB mapped", mode, n, present, of)
		share[mode] = float64(present) / float64(of)
	}
	if share["plain"] < 0.75 {
		testenv.Skip(t, fmt.Sprintf("fault-around maps %.0f %% of the neighbours here without a registration: nothing to show", 100*share["plain"]))
	}
	// The neighbours something else read (the runtime's own code): a few.
	if share["registered"] > 0.25 {
		t.Errorf("registered: %.0f %% of the touched pages' neighbours mapped, want a few (fault-around still on)", 100*share["registered"])
	}
}
