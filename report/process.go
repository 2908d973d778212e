package report

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// processCollector serves the process_* metrics of client_golang's process
// collector (same names, help and types) at a fraction of its cost per
// scrape: that one parses /proc/stat (for the boot time), /proc/self/stat,
// /proc/self/limits and /proc/self/net/netstat on every scrape, about two
// thirds of a scrape's CPU (BenchmarkScrape). Here the start time is read
// once, CPU and limits come from getrusage and getrlimit, memory from
// /proc/self/statm, and the network counters from the IpExt lines of
// /proc/self/net/netstat read into a reused buffer. A text scrape has its
// values appended to text made once (runtimeCollector).
type processCollector struct {
	runtimeSnapshot
	start   float64
	procDir string // /proc/self

	// Used with mu held.
	buf   []byte
	dents []byte         // a buffer for the entries of /proc/self/fd
	files map[string]int // open descriptors of the files read
}

// The values of processCollector.vals, one per family.
const (
	procCPU = iota
	procOpenFDs
	procMaxFDs
	procVsize
	procMaxVsize
	procRSS
	procStart
	procIn
	procOut
	procValues
)

func newProcessCollector() *processCollector {
	c := &processCollector{procDir: "/proc/self"}
	c.vals, c.present, c.take = make([]float64, procValues), make([]bool, procValues), c.readValues
	f := func(at int, name, help string, kind valueKind) {
		c.fams = append(c.fams, newRuntimeFamily(name, help, kind, at, prometheus.NewDesc(name, help, nil, nil)))
	}
	f(procCPU, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", kindCounter)
	f(procOpenFDs, "process_open_fds", "Number of open file descriptors.", kindGauge)
	f(procMaxFDs, "process_max_fds", "Maximum number of open file descriptors.", kindGauge)
	f(procVsize, "process_virtual_memory_bytes", "Virtual memory size in bytes.", kindGauge)
	f(procMaxVsize, "process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", kindGauge)
	f(procRSS, "process_resident_memory_bytes", "Resident memory size in bytes.", kindGauge)
	f(procStart, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", kindGauge)
	f(procIn, "process_network_receive_bytes_total", "Number of bytes received by the process over the network.", kindCounter)
	f(procOut, "process_network_transmit_bytes_total", "Number of bytes sent by the process over the network.", kindCounter)
	// The start time, as client_golang computes it (the process's start in
	// clock ticks after the boot time of /proc/stat), once: it does not change.
	c.start = float64(time.Now().UnixNano()) / 1e9
	if p, err := procfs.Self(); err == nil {
		if st, err := p.Stat(); err == nil {
			if t, err := st.StartTime(); err == nil {
				c.start = t
			}
		}
	}
	return c
}

// readValues takes a snapshot of the values into c.vals and c.present.
// c.mu is held.
func (c *processCollector) readValues() {
	clear(c.present)
	set := func(i int, v float64) { c.vals[i], c.present[i] = v, true }
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		set(procCPU, float64(ru.Utime.Nano()+ru.Stime.Nano())/1e9)
	}
	if b, err := c.read("statm"); err == nil {
		if size, res, ok := parseStatm(b); ok {
			page := float64(os.Getpagesize())
			set(procVsize, float64(size)*page)
			set(procRSS, float64(res)*page)
		}
	}
	set(procStart, c.start)
	if n, err := c.countFDs(); err == nil {
		set(procOpenFDs, float64(n))
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil {
		set(procMaxFDs, float64(lim.Cur))
	}
	if unix.Getrlimit(unix.RLIMIT_AS, &lim) == nil {
		set(procMaxVsize, float64(lim.Cur))
	}
	if b, err := c.read("net/netstat"); err == nil {
		in, out := parseNetstatOctets(b)
		set(procIn, in)
		set(procOut, out)
	}
}

// read reads a small /proc file into the collector's buffer (valid until
// the next read). The file stays open: a read from offset 0 makes the
// kernel render it anew, without an open and a close per scrape.
func (c *processCollector) read(name string) ([]byte, error) {
	if c.files == nil {
		c.files = map[string]int{}
	}
	fd, ok := c.files[name]
	if !ok {
		var err error
		fd, err = unix.Open(c.procDir+"/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		c.files[name] = fd
	}
	if c.buf == nil {
		c.buf = make([]byte, 0, 8192)
	}
	b := c.buf[:0]
	for {
		if len(b) == cap(b) {
			if cap(b) >= 1<<20 {
				break // bounded: a /proc file this size is not the one we know
			}
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Pread(fd, b[len(b):cap(b)], int64(len(b)))
		if err != nil {
			unix.Close(fd)
			delete(c.files, name)
			return nil, err
		}
		want := cap(b) - len(b)
		b = b[:len(b)+n]
		if n < want {
			// A /proc file renders whole into a read as large as the
			// buffer: a short read is its end. (Reading on would make
			// the kernel render it again to find the offset.)
			break
		}
	}
	c.buf = b
	return b, nil
}

// countFDs counts the entries of /proc/self/fd. The directory stays open
// and is read again from its start each time (the kernel lists the
// descriptors open at that read), without an open, a close and a string per
// entry per scrape. The count includes the descriptor reading the
// directory, as client_golang's does (it opens the directory to count).
func (c *processCollector) countFDs() (int, error) {
	const name = "fd/"
	if c.files == nil {
		c.files = map[string]int{}
	}
	fd, ok := c.files[name]
	if !ok {
		var err error
		fd, err = unix.Open(c.procDir+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		c.files[name] = fd
	}
	if c.dents == nil {
		c.dents = make([]byte, 8192)
	}
	fail := func(err error) (int, error) {
		unix.Close(fd)
		delete(c.files, name)
		return 0, err
	}
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return fail(err)
	}
	count := 0
	for {
		n, err := unix.Getdents(fd, c.dents)
		if err != nil {
			return fail(err)
		}
		if n <= 0 {
			return count, nil
		}
		count += countDirents(c.dents[:n])
	}
}

// countDirents counts the entries of a getdents64 buffer but . and ..
func countDirents(b []byte) int {
	count := 0
	// struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen (2),
	// d_type (1), d_name (NUL-terminated).
	const nameAt = 19
	for len(b) >= nameAt {
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < nameAt || reclen > len(b) {
			break
		}
		name := b[nameAt:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if string(name) != "." && string(name) != ".." {
			count++
		}
		b = b[reclen:]
	}
	return count
}

// parseStatm returns the first two fields of /proc/PID/statm: the virtual
// size and the resident set, in pages.
func parseStatm(b []byte) (size, resident uint64, ok bool) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, 0, false
	}
	size, err1 := strconv.ParseUint(string(f[0]), 10, 64)
	resident, err2 := strconv.ParseUint(string(f[1]), 10, 64)
	return size, resident, err1 == nil && err2 == nil
}

// parseNetstatOctets returns InOctets and OutOctets of the IpExt lines of
// /proc/PID/net/netstat (a header line of names, then a line of values);
// 0 for one that is missing or malformed, as client_golang reports it.
func parseNetstatOctets(b []byte) (in, out float64) {
	var names [][]byte
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		rest, ok := bytes.CutPrefix(line, []byte("IpExt: "))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if i >= len(f) {
				break
			}
			v, err := strconv.ParseFloat(string(f[i]), 64)
			if err != nil {
				continue
			}
			switch string(n) {
			case "InOctets":
				in = v
			case "OutOctets":
				out = v
			}
		}
		break
	}
	return in, out
}
