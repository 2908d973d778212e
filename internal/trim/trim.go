// Package trim lets go of the pages of a process's own binary that its
// start-up touched (the daemon's and its privileged helper's), and that a
// burst of requests touched (the helper's, after each).
package trim

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// StartupPages tells the kernel that the pages of the daemon's own
// binary that start-up touched (package initialisation, configuration, the
// first run of every check), or whatever else since the last call, need
// not stay mapped: madvise(MADV_DONTNEED) on
// the executable's read-only mappings (code, read-only data) after the first
// pass. They are clean copies of the file, so nothing is lost: a page the
// daemon uses again faults back in from the page cache (a minor fault), the
// others stop counting in its resident set (README, Cost). Only a
// non-relocatable executable (ELF type EXEC, what `make build` makes) is
// trimmed, and only mappings without anonymous (copied-on-write) pages.
// It returns how many bytes it advised.
func StartupPages() (int, error) {
	return Mappings("/proc/self/exe", "/proc/self/smaps")
}

// Mappings trims the read-only mappings of exeLink listed in smapsPath.
func Mappings(exeLink, smapsPath string) (int, error) {
	cands, err := readOnly(exeLink, smapsPath)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, m := range cands {
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.start), uintptr(m.end-m.start), unix.MADV_DONTNEED); errno != 0 {
			return total, errno
		}
		total += int(m.end - m.start)
	}
	return total, nil
}

// mapping is an address range of the process.
type mapping struct{ start, end uint64 }

// readOnly returns the read-only mappings of exeLink's file (code,
// read-only data) listed in smapsPath, those without anonymous pages; none
// unless the file is an ELF executable of type EXEC.
func readOnly(exeLink, smapsPath string) ([]mapping, error) {
	exe, err := os.Readlink(exeLink)
	if err != nil {
		return nil, err
	}
	if ok, err := IsExecELF(exeLink); err != nil || !ok {
		return nil, err
	}
	f, err := os.Open(smapsPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var cands []mapping
	var cur *mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if bytes.IndexByte(fields[0], '-') > 0 && !bytes.HasSuffix(fields[0], []byte{':'}) {
			// A mapping: 00400000-00f2c000 r-xp 00000000 fe:00 10019029 /path/to/exe
			cur = nil
			if len(fields) < 6 || string(fields[5]) != exe {
				continue
			}
			if perm := string(fields[1]); perm != "r-xp" && perm != "r--p" {
				continue
			}
			lo, hi, _ := bytes.Cut(fields[0], []byte{'-'})
			start, err1 := strconv.ParseUint(string(lo), 16, 64)
			end, err2 := strconv.ParseUint(string(hi), 16, 64)
			if err1 != nil || err2 != nil || end <= start {
				continue
			}
			cands = append(cands, mapping{start, end})
			cur = &cands[len(cands)-1]
			continue
		}
		if cur != nil && string(fields[0]) == "Anonymous:" && (len(fields) < 2 || string(fields[1]) != "0") {
			// Pages copied on write (relocations): not the file's.
			cands = cands[:len(cands)-1]
			cur = nil
		}
	}
	return cands, sc.Err()
}

// IsExecELF reports whether the file is a little-endian ELF executable of
// type EXEC (linked at fixed addresses: no relocated pages).
func IsExecELF(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var h [18]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return false, nil
		}
		return false, err
	}
	return string(h[:4]) == "\x7fELF" && h[5] == 1 && binary.LittleEndian.Uint16(h[16:]) == 2, nil
}
