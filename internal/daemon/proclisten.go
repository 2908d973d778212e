package daemon

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// maxProcNetUnix bounds what is read of /proc/net/unix (a line is about
// 60 bytes and a path).
const maxProcNetUnix = 8 << 20

// ListeningSockets is the paths of the Unix stream sockets that process
// pid listens on, as the kernel lists them (/proc/net/unix: a path bound,
// the listening flag, matched to pid's descriptors by inode), sorted; nil
// where they cannot be read (another user's process, a process gone). A
// path whose file was removed since the bind is listed all the same: the
// kernel keeps the name the socket was bound to. The clients of the
// daemon's sockets ask it of the process that holds the state directory's
// lock where nothing answers on the sockets the configuration names: the
// daemon may serve others (the socket keys need a restart to change).
func ListeningSockets(pid int) []string {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return nil
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	if len(inodes) == 0 {
		return nil
	}
	f, err := os.Open(procNetUnix)
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseUnixListeners(io.LimitReader(f, maxProcNetUnix), inodes)
}

// procNetUnix is the kernel's list of Unix sockets (of this process's
// network namespace, the daemon's on a node); a variable for tests.
var procNetUnix = "/proc/net/unix"

// parseUnixListeners is the paths of the listening Unix stream sockets in
// r (/proc/net/unix) whose inode is in inodes, sorted, each once. A line
// is "Num RefCount Protocol Flags Type St Inode Path": Flags 00010000 is
// __SO_ACCEPTCON (listening), Type 0001 SOCK_STREAM; an abstract socket's
// path starts with "@", an unbound one has none.
func parseUnixListeners(r io.Reader, inodes map[string]bool) []string {
	var paths []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[3] != "00010000" || fields[4] != "0001" || !inodes[fields[6]] {
			continue
		}
		if p := afterFields(sc.Text(), 7); strings.HasPrefix(p, "/") {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	return slices.Compact(paths)
}

// afterFields is line after its first n space-separated fields and the one
// space after them: /proc/net/unix's path as the kernel wrote it (one space
// after the inode), its own spaces kept, two in a row or one at its end.
func afterFields(line string, n int) string {
	i := 0
	for range n {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		for i < len(line) && line[i] != ' ' {
			i++
		}
	}
	if i < len(line) {
		i++
	}
	return line[i:]
}
