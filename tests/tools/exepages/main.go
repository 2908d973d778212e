// Command exepages tells where a process's resident pages of its own binary
// are, by ELF section, and where the page faults into the binary landed
// (README, Cost: "What the daemon's RssFile is").
//
//	exepages PID
//	    the pages of the file /proc/PID/exe that PID has mapped (RssFile's
//	    part of its binary, from /proc/PID/pagemap), by section, and the
//	    anonymous (copied-on-write) pages of its writable mapping apart
//	perf record -c 1 -e minor-faults -e syscalls:sys_enter_madvise -d -p PID -o perf.data -- sleep 300
//	perf script -i perf.data -F time,event,addr,trace 2>/dev/null | exepages -faults BIN
//	    the faults into BIN's sections after its last trim (a madvise of its
//	    first mapping): each page counted once, by section and by 20 s; BIN
//	    must be a non-relocatable executable (ELF type EXEC, as `make build`
//	    makes the daemon): perf gives addresses, not file offsets
//	exepages -touch FILE
//	    maps FILE privately, reads one byte of 100 pages 37 pages apart, and
//	    counts the pages the kernel mapped (its fault-around), without and
//	    then with MADV_RANDOM (the second pass on the page cache the first
//	    one read)
package main

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	faults := flag.String("faults", "", "read `perf script` output on stdin; BIN is the binary it faulted into")
	touchFile := flag.String("touch", "", "count the pages mapped by touching 100 pages of `FILE`")
	flag.Parse()
	var err error
	switch {
	case *touchFile != "":
		err = touch(*touchFile)
	case *faults != "":
		err = countFaults(*faults)
	case flag.NArg() == 1:
		err = resident(flag.Arg(0))
	default:
		fmt.Fprintln(os.Stderr, "usage: exepages PID | exepages -faults BIN < perf-script-output | exepages -touch FILE")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "exepages:", err)
		os.Exit(1)
	}
}

type section struct {
	name string
	// lo, hi: its addresses (link-time), pages rounded; off, offEnd: its
	// place in the file, the same way.
	lo, hi, off, offEnd uint64
	resident            int
}

// sections returns the allocated sections of the ELF file, by address,
// and whether the file is an executable of type EXEC (its addresses are
// the ones it runs at).
func sections(path string) ([]*section, bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	var out []*section
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Addr != 0 && s.Type != elf.SHT_NOBITS {
			out = append(out, &section{name: s.Name, lo: s.Addr &^ 4095, hi: s.Addr + s.Size, off: s.Offset &^ 4095, offEnd: s.Offset + s.Size})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	return out, f.Type == elf.ET_EXEC, nil
}

// find returns the section at addr (byOffset: at that offset in the file).
func find(secs []*section, addr uint64, byOffset bool) *section {
	for _, s := range secs {
		lo, hi := s.lo, s.hi
		if byOffset {
			lo, hi = s.off, s.offEnd
		}
		if addr >= lo && addr < hi {
			return s
		}
	}
	return nil
}

func report(secs []*section) {
	total := 0
	for _, s := range secs {
		total += s.resident
	}
	fmt.Printf("%d pages (%.2f MiB)\n", total, mib(total))
	for _, s := range secs {
		if s.resident > 0 {
			fmt.Printf("  %-18s %6d pages %7.2f MiB\n", s.name, s.resident, mib(s.resident))
		}
	}
}

func mib(pages int) float64 { return float64(pages) * 4096 / (1 << 20) }

func resident(pid string) error {
	exe := "/proc/" + pid + "/exe"
	secs, _, err := sections(exe)
	if err != nil {
		return err
	}
	anon := 0
	var st unix.Stat_t
	if err := unix.Stat(exe, &st); err != nil {
		return err
	}
	pm, err := os.Open("/proc/" + pid + "/pagemap")
	if err != nil {
		return err
	}
	defer pm.Close()
	maps, err := os.Open("/proc/" + pid + "/maps")
	if err != nil {
		return err
	}
	defer maps.Close()
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// 00400000-00b68000 r-xp 00000000 fe:00 10019029 /path/to/exe
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		// The binary's mappings: its device and inode (the path may be
		// one of another mount namespace).
		maj, mnr, _ := strings.Cut(f[3], ":")
		dmaj, err1 := strconv.ParseUint(maj, 16, 32)
		dmnr, err2 := strconv.ParseUint(mnr, 16, 32)
		ino, err3 := strconv.ParseUint(f[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || unix.Mkdev(uint32(dmaj), uint32(dmnr)) != st.Dev || ino != st.Ino {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(f[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || b <= a {
			continue
		}
		entries, err := pagemap(pm, a, b)
		if err != nil {
			return err
		}
		for i, e := range entries {
			switch {
			case e&(1<<63) == 0: // not present
			case e&(1<<61) == 0: // present, not the file's: copied on write
				anon++
			default:
				if s := find(secs, off+uint64(i)*4096, true); s != nil {
					s.resident++
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	report(secs)
	fmt.Printf("anonymous (copied-on-write) pages in the binary's mappings, not counted above: %d\n", anon)
	return nil
}

// countFaults reads `perf script -F time,event,addr,trace` lines:
//
//	20005.961124: syscalls:sys_enter_madvise: start: 0x00400000, len_in: ...
//	20006.012345: minor-faults: 7fa83a1c2000
func countFaults(bin string) error {
	secs, exec, err := sections(bin)
	if err != nil {
		return err
	}
	if !exec || len(secs) == 0 {
		return fmt.Errorf("%s: not an executable of type EXEC with sections: perf's addresses cannot be placed in it", bin)
	}
	first := secs[0].lo // the first mapping's start, which a trim advises first
	type fault struct {
		t    float64
		addr uint64
	}
	var fs []fault
	trim := -1.0
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		t, err := strconv.ParseFloat(strings.TrimSuffix(f[0], ":"), 64)
		if err != nil {
			continue
		}
		switch ev := strings.TrimSuffix(f[1], ":"); {
		case strings.HasSuffix(ev, "sys_enter_madvise") && len(f) >= 4:
			if a, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSuffix(f[3], ","), "0x"), 16, 64); err == nil && a == first {
				trim = t
			}
		case strings.Contains(ev, "faults"):
			if a, err := strconv.ParseUint(f[2], 16, 64); err == nil {
				fs = append(fs, fault{t, a})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if trim < 0 {
		fmt.Println("no trim found: counting every fault")
		trim = 0
	}
	seen := map[uint64]bool{}
	by20 := map[int]int{}
	for _, f := range fs {
		s := find(secs, f.addr, false)
		if f.t < trim || s == nil || seen[f.addr&^4095] {
			continue
		}
		seen[f.addr&^4095] = true
		s.resident++
		by20[int((f.t-trim)/20)]++
	}
	if len(seen) == 0 {
		return fmt.Errorf("no fault of the %d read landed in %s's sections after %.3f", len(fs), bin, trim)
	}
	fmt.Printf("faults into the binary's sections after the trim at %.3f, each page once: ", trim)
	report(secs)
	keys := make([]int, 0, len(by20))
	for k := range by20 {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	fmt.Print("by 20 s after the trim:")
	for _, k := range keys {
		fmt.Printf(" %d-%ds %d;", k*20, k*20+20, by20[k])
	}
	fmt.Println()
	return nil
}

// pagemap returns the /proc/PID/pagemap entries (pm) of the pages from
// address a to b.
func pagemap(pm *os.File, a, b uint64) ([]uint64, error) {
	buf := make([]byte, (b-a)/4096*8)
	if _, err := pm.ReadAt(buf, int64(a/4096*8)); err != nil {
		return nil, err
	}
	out := make([]uint64, len(buf)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(buf[i*8:])
	}
	return out, nil
}

func touch(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := int(st.Size()) &^ 4095
	if size < 100*37*4096 {
		return fmt.Errorf("%s: %d bytes, fewer than 100*37 pages", path, size)
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return err
	}
	defer pm.Close()
	for _, advice := range []struct {
		name string
		adv  int
	}{{"no advice", -1}, {"MADV_RANDOM", unix.MADV_RANDOM}} {
		b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		if advice.adv >= 0 {
			if err := unix.Madvise(b, advice.adv); err != nil {
				return err
			}
		}
		var sum byte
		for i := range 100 {
			sum += b[(i*37+5)*4096+100]
		}
		addr := uint64(uintptr(unsafe.Pointer(&b[0])))
		entries, err := pagemap(pm, addr, addr+uint64(size))
		unix.Munmap(b)
		if err != nil {
			return err
		}
		n := 0
		for _, e := range entries {
			if e&(1<<63) != 0 { // present
				n++
			}
		}
		fmt.Printf("%s: 100 pages touched, %d mapped (byte sum %d)\n", advice.name, n, sum)
	}
	return nil
}
