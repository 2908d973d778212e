package tamper

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/hostio"
	"golang.org/x/sys/unix"
)

// MountsFile is the mount table MountWatcher polls: this process's
// mount namespace, where the scan reads the protected paths (the packaged
// units' namespaces receive the host's mounts).
var MountsFile = "/proc/self/mountinfo"

// MinMountReading is the least time between two readings of the mount
// table: a reading of a node's (thousands of pod and container mounts)
// takes milliseconds, and a storm of mounts is read at most four times a
// second.
const MinMountReading = 250 * time.Millisecond

// MountWatcher follows the mount table of this process's mount namespace.
// A mount sends the directories it covers no file notification: a
// filesystem or a bind mount over a protected file or directory (or over a
// directory on the way to one) changes what the scan reads without a word
// to inotify, and so does its unmount. The kernel marks the mount table's
// poll (POLLPRI) on every change; the table is read again then, and its
// relevant mount points compared with the last reading's, so that mounts
// elsewhere (a pod's volumes, a container's root) cost a reading and wake
// nothing.
type MountWatcher struct {
	fd   int
	root string
	spec Spec
	// ways are, at the last reading, the patterns' fixed parts under
	// root and where each leads through the symlinks on its way
	// (resolveWays), as mountinfo writes a mount point (mayBeRelevant).
	ways []way
	// fixed are the patterns' fixed parts (resolveWays); kernel and host
	// its resolutions' memos, kept for the next reading's.
	fixed        []fixedPart
	kernel, host map[string]resolved
	// seen are the ways of this reading (resolveWays), for their
	// uniqueness.
	seen map[way]bool
	// prev are the relevant mounts of the last reading (read); buf is
	// the reading's buffer, kept for the next.
	prev map[string]string
	buf  []byte
	// malformed are the lines of the last reading that were split and
	// did not split (a line the kernel does not write), firstMalformed
	// the first of them.
	malformed      int
	firstMalformed *hostio.MalformedMountinfoError
	// OnReading, where set before Run, is called after each of Run's
	// readings with its malformed lines (Malformed).
	OnReading func(malformed int, first *hostio.MalformedMountinfoError)
}

// Malformed returns the malformed lines of the last reading, which are
// skipped: how many, and the first (nil where none).
func (m *MountWatcher) Malformed() (int, *hostio.MalformedMountinfoError) {
	return m.malformed, m.firstMalformed
}

// NewMountWatcher opens the mount table and reads it: a mount made after
// it returns is reported by Run. The mount points reported are those (host
// paths under root) where a change can change what spec protects
// (Spec.Relevant: a protected path, one in a protected tree, a directory
// on the way to one), by their names or by where a symlinked directory on
// their way leads (resolveWays: a path of this process where it leads out
// of root).
func NewMountWatcher(root string, spec Spec) (*MountWatcher, error) {
	fd, err := unix.Open(MountsFile, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: MountsFile, Err: err}
	}
	m := &MountWatcher{fd: fd, root: root, spec: spec}
	if m.prev, err = m.read(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return m, nil
}

// Run calls fn with the mount point (a host path) of each relevant mount
// added or removed since the last reading, until ctx is done (nil), or the
// table cannot be polled or read (the error). It releases the table when
// it returns.
func (m *MountWatcher) Run(ctx context.Context, fn func(hostPath string)) error {
	defer unix.Close(m.fd)
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("eventfd", err)
	}
	defer unix.Close(stop)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			unix.Write(stop, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		case <-done:
		}
	}()
	var last time.Time
	for {
		fds := []unix.PollFd{{Fd: int32(m.fd), Events: unix.POLLPRI}, {Fd: int32(stop), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return os.NewSyscallError("poll", err)
		}
		if fds[1].Revents != 0 || ctx.Err() != nil {
			return nil
		}
		if fds[0].Revents&(unix.POLLPRI|unix.POLLERR) == 0 {
			continue
		}
		// A storm of mounts (pods starting) is read MinMountReading
		// apart: the changes made meanwhile are in the next reading.
		if wait := MinMountReading - time.Since(last); wait > 0 {
			quiet := []unix.PollFd{{Fd: int32(stop), Events: unix.POLLIN}}
			if _, err := unix.Poll(quiet, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
				return os.NewSyscallError("poll", err)
			}
			if quiet[0].Revents != 0 || ctx.Err() != nil {
				return nil
			}
		}
		last = time.Now()
		cur, err := m.read()
		if err != nil {
			return err
		}
		if m.OnReading != nil {
			m.OnReading(m.Malformed())
		}
		for k, p := range cur {
			if _, ok := m.prev[k]; !ok {
				fn(p)
			}
		}
		for k, p := range m.prev {
			if _, ok := cur[k]; !ok {
				fn(p)
			}
		}
		m.prev = cur
	}
}

// read reads the mount table from its start and returns the mounts whose
// mount point is relevant: the line's mount ID, root and mount point -> the
// mount point as a host path (as this process's path where a link led out
// of root). A node's table holds thousands of pod and container mounts: a
// line is split only where its mount point can be on the way to or under a
// pattern's fixed part, or where it leads (ways).
func (m *MountWatcher) read() (map[string]string, error) {
	m.resolveWays()
	if _, err := unix.Seek(m.fd, 0, 0); err != nil {
		return nil, &os.PathError{Op: "seek", Path: MountsFile, Err: err}
	}
	m.buf = m.buf[:0]
	for {
		if len(m.buf) == cap(m.buf) {
			m.buf = append(m.buf, make([]byte, max(64<<10, cap(m.buf)))...)[:len(m.buf)]
		}
		n, err := unix.Read(m.fd, m.buf[len(m.buf):cap(m.buf)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: MountsFile, Err: err}
		}
		if n == 0 {
			break
		}
		m.buf = m.buf[:len(m.buf)+n]
	}
	out := map[string]string{}
	m.malformed, m.firstMalformed = 0, nil
	for n, line := range hostio.MountinfoLines(m.buf) {
		// Split by the one mountinfo reader (at each space, as the kernel
		// writes the fields; no allocation), only the lines whose mount
		// point may be relevant; a line the kernel does not write is
		// skipped, and counted (Malformed).
		if !m.mayBeRelevant(hostio.MountinfoMountPoint(line)) {
			continue
		}
		f, ok := hostio.SplitMountinfo(line)
		if !ok {
			if m.malformed++; m.firstMalformed == nil {
				m.firstMalformed = &hostio.MalformedMountinfoError{Line: n, Text: string(line)}
			}
			continue
		}
		mp := path.Clean(hostio.UnescapeMountinfo(string(f.MountPoint)))
		hp, ok := underRoot(m.root, mp)
		if !ok || !m.spec.Relevant(hp) {
			if !m.throughLink(mp) {
				continue
			}
			if !ok {
				hp = mp
			}
		}
		out[string(f.ID)+" "+string(f.Root)+" "+string(f.MountPoint)] = hp
	}
	return out, nil
}

// mayBeRelevant is false for a mount point (as mountinfo writes it) that
// is neither on the way to a pattern's fixed part, or to where it leads,
// nor under it: neither is a prefix of the other. An escaped name is left
// to Relevant and throughLink.
func (m *MountWatcher) mayBeRelevant(raw []byte) bool {
	if bytes.IndexByte(raw, '\\') >= 0 {
		return true
	}
	for _, w := range m.ways {
		// string(raw[:n]) == at: compared without a copy
		if n := min(len(raw), len(w.at)); string(raw[:n]) == w.at[:n] {
			return true
		}
	}
	return false
}

// way is a pattern's fixed part (base, a host path) and a path it leads
// to in this process's mount namespace (at, as mountinfo names a mount
// point); linked where at is not base under root.
type way struct {
	base, at string
	linked   bool
}

// fixedPart is what resolveWays resolves of a pattern's fixed part
// (base): the directory whose links are followed (dir, a host path; in,
// the same under root), and the name after it (last, "" where the whole
// fixed part is followed); lexical is base under root. wild are the
// pattern's names after base but its last ("/etc/systemd/system/*.d/*.conf":
// [*.d]): the directories the scan's glob lists there, and follows where
// they are links.
type fixedPart struct {
	base, dir, in, last, lexical string
	wild                         []string
}

// resolveWays sets the ways of this reading. A symlinked directory on the
// way to a protected path (/var/lib/kubelet -> /data/kubelet) is followed
// by the scan, as by the kubelet, and a mount over the path it leads to
// shows in mountinfo under the link's target (/data/kubelet/config.yaml),
// not the pattern's name: each fixed part is resolved at each reading (a
// link retargeted since leads elsewhere), twice where root is not "/":
// as the kernel resolves it under this process's "/" (an absolute link
// leads out of root: what the scan reads) and as the host does (an
// absolute link is a host path, under root). A pattern's last name is not
// followed where it has no wildcard: the scan records a link there as the
// link, and a mount over its target changes nothing it reads. Past the
// fixed part, the directories a pattern's wildcard passes through
// (/etc/systemd/system/kubelet.service.d for
// "/etc/systemd/system/*.d/*.conf") are listed at each reading, and each
// match (and each name after it but the last) is resolved the same way:
// the scan's glob follows a link there (kubelet.service.d ->
// /srv/dropins) and reads what a mount over its target holds. At most
// hostio.MaxEntries such paths are resolved in a reading, as the scan
// reads at most as many.
func (m *MountWatcher) resolveWays() {
	if m.fixed == nil {
		for _, p := range m.spec.Patterns {
			f := fixedPart{base: hostio.GlobBase(p)}
			f.dir, f.lexical = f.base, hostio.HostJoin(m.root, f.base)
			if !strings.ContainsAny(p, `*?[\`) && f.base != "/" {
				f.dir, f.last = path.Dir(f.base), path.Base(f.base)
			}
			f.in = hostio.HostJoin(m.root, f.dir)
			if f.last == "" {
				names := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
				fixed := strings.Split(strings.Trim(f.base, "/"), "/")
				if f.base == "/" {
					fixed = nil
				}
				if len(names) > len(fixed)+1 {
					f.wild = names[len(fixed) : len(names)-1]
				}
			}
			m.fixed = append(m.fixed, f)
		}
	}
	m.ways = m.ways[:0]
	if m.seen == nil {
		m.seen = map[way]bool{}
	}
	clear(m.seen)
	add := func(base, at string, linked bool) {
		w := way{base: base, at: at, linked: linked}
		if m.seen[w] {
			return
		}
		m.seen[w] = true
		m.ways = append(m.ways, w)
	}
	for _, f := range m.fixed {
		add(f.base, f.lexical, false)
	}
	// what each prefix resolved to in this reading, one map for each
	// meaning
	if m.kernel == nil {
		m.kernel, m.host = map[string]resolved{}, map[string]resolved{}
	}
	clear(m.kernel)
	clear(m.host)
	inRoot := m.root != "" && m.root != "/"
	for _, f := range m.fixed {
		if at := resolveIn("/", f.in, m.kernel).cur; at != f.in {
			add(f.base, path.Join(at, f.last), true)
		}
		if !inRoot {
			continue
		}
		if at := resolveIn(m.root, f.dir, m.host).cur; at != f.dir {
			add(f.base, path.Join(m.root, at, f.last), true)
		}
	}
	// The wildcard parts: each level's paths (host paths), a directory
	// listed where the pattern's name there has a wildcard. A match the
	// listing says is a directory, not a link (plain), leads where its
	// directory does, which a way already covers: it is not resolved.
	budget := hostio.MaxEntries
	type match struct {
		p     string
		plain bool
	}
	var level, next []match
	for _, f := range m.fixed {
		level = append(level[:0], match{p: f.base})
		for _, name := range f.wild {
			next = next[:0]
			for _, d := range level {
				if !strings.ContainsAny(name, `*?[\`) {
					next = append(next, match{p: path.Join(d.p, name)})
					continue
				}
				for _, e := range listDir(hostio.HostJoin(m.root, d.p)) {
					t := e.Type()
					if t&^(fs.ModeDir|fs.ModeSymlink|fs.ModeIrregular) != 0 {
						continue // no directory: the glob lists nothing there
					}
					if ok, _ := path.Match(name, e.Name()); ok {
						next = append(next, match{p: path.Join(d.p, e.Name()), plain: t == fs.ModeDir})
					}
				}
			}
			level, next = next, level
			for _, s := range level {
				// A plain directory costs no resolution, and does not
				// count: the cap is on the paths resolved.
				if s.plain {
					continue
				}
				if budget--; budget < 0 {
					return
				}
				d, in := s.p, hostio.HostJoin(m.root, s.p)
				if at := resolveIn("/", in, m.kernel).cur; at != in {
					add(d, at, true)
				}
				if !inRoot {
					continue
				}
				if at := resolveIn(m.root, d, m.host).cur; at != d {
					add(d, path.Join(m.root, at), true)
				}
			}
		}
	}
}

// listDir returns the entries of directory p (a path of this process),
// with their types as the listing gives them (no stat); none where it is
// no directory or cannot be listed. It opens p without blocking (a FIFO
// matched by a wildcard) and follows a link on its way, as the scan's
// glob lists it.
func listDir(p string) []fs.DirEntry {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	es, _ := f.ReadDir(-1)
	return es
}

// throughLink reports whether mount point mp (a path of this process)
// is, through a symlinked directory on the way to a pattern's fixed part,
// on the way to it or under it where the pattern reaches (Spec.Relevant
// of the same path by the pattern's name). "/" and root itself are on
// the way to everything and are not taken, as Relevant takes neither.
func (m *MountWatcher) throughLink(mp string) bool {
	if mp == "/" || mp == path.Clean(m.root) {
		return false
	}
	for _, w := range m.ways {
		if !w.linked {
			continue
		}
		if rest, ok := strings.CutPrefix(mp, w.at); ok && (rest == "" || rest[0] == '/' || w.at == "/") {
			if m.spec.Relevant(path.Join(w.base, rest)) {
				return true
			}
			continue
		}
		if strings.HasPrefix(w.at, mp+"/") {
			return true
		}
	}
	return false
}

// underRoot is mount point mp as a host path under root, and whether it
// is under root at all.
func underRoot(root, mp string) (string, bool) {
	if root == "" || root == "/" {
		return mp, true
	}
	root = path.Clean(root)
	switch {
	case mp == root:
		return "/", true
	case strings.HasPrefix(mp, root+"/"):
		return mp[len(root):], true
	}
	return "", false
}
