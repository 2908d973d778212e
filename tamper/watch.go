package tamper

import (
	"context"
	"errors"
	"github.com/syself/autopilot-health/internal/hostio"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchMask: every change to an entry of a watched directory (content,
// attributes, creation, removal, rename) and to the directory itself. A
// watched name that is a symlink to a directory is followed, as every
// other link on the way is: the names handed over are directories the
// scan reaches through their links (a protected path that is itself a
// link is recorded as the link, and is never one), and the directory
// holding the link is watched for its retarget (Set).
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Watcher follows file notifications (inotify) on a set of directories.
// Notifications are a fast path only: a scan still runs on every check
// interval, for what they miss (a queue overflow, a directory created and
// filled between two scans, a filesystem that sends none).
type Watcher struct {
	f  *os.File
	fd int
	mu sync.Mutex
	// wds: watch descriptor -> the host directories it watches. Two names
	// of one directory (a symlinked directory on the way, a bind mount) are
	// one inode, and the kernel gives them one descriptor: it is removed
	// when neither name is watched any more, and its notifications are
	// reported under each name.
	wds map[int][]string
	dir map[string]int
	// ids: the directory (device, inode) each name of dir was watched on.
	// A name that leads to another directory now (a symlink on the way
	// retargeted) is watched anew: the kernel's watch stays on the inode.
	ids map[string]dirID
	// links: the symlinks on the way to the watched directories, whose
	// directories are watched: a change of one (a retarget) is Link.
	links map[string]bool
	// root is the host root the directories are under.
	root string
	// closed: Close ran; the descriptor number may be another file's now,
	// and nothing uses it.
	closed bool
}

// NewWatcher starts an inotify instance for directories under root.
func NewWatcher(root string) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	// Non-blocking: os.File reads through the runtime poller, and Close
	// ends a blocked Read.
	return &Watcher{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, wds: map[int][]string{}, dir: map[string]int{}, ids: map[string]dirID{}, root: root}, nil
}

// dirID is a directory's device and inode.
type dirID struct{ dev, ino uint64 }

func idOf(fi fs.FileInfo) dirID {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return dirID{dev: uint64(st.Dev), ino: st.Ino}
	}
	return dirID{}
}

// Set makes the watched directories dirs (host paths): a directory that does
// not exist is watched through its nearest existing ancestor, where it
// would appear (a dangling symlink's target through the nearest existing
// ancestor of where it resolves). The directory that holds a symlink on the way to one is
// watched too (a retarget of the link notifies it), and a name that leads
// to another directory than the one it was watched on is watched anew. It
// returns the directories it watches now and did not before (added: a
// change made there before this call sent no notification, so whoever
// scanned them before it reads them again), and those that could not be
// watched with why, sorted by directory (one Set's failures compare
// equal to the last's when nothing changed).
func (w *Watcher) Set(dirs []string) (added []string, failed []WatchFailure) {
	want := map[string]dirID{}
	links := map[string]bool{} // the symlinks met on the way to dirs
	memo := map[string]resolved{}
	addLinks := func(ls []string) {
		for _, l := range ls {
			links[l] = true
			if _, ok := want[path.Dir(l)]; !ok {
				want[path.Dir(l)] = dirID{} // its identity is checked when it is a dirs' own
			}
		}
	}
	for _, d := range dirs {
		var id dirID
		missing := "" // the name below d that is not there
		for {
			fi, err := os.Stat(hostio.HostJoin(w.root, d))
			if err == nil {
				id = idOf(fi)
			}
			if err == nil && fi.IsDir() || d == "/" || !errors.Is(err, fs.ErrNotExist) {
				break
			}
			missing, d = d, path.Dir(d)
		}
		want[d] = id
		addLinks(w.linksOnTheWay(d, memo))
		if missing == "" {
			continue
		}
		// A dangling symlink: its target appears elsewhere, where it would
		// be, and that creation notifies no directory on the link's side.
		// The nearest existing ancestor of where it resolves is watched,
		// and the name there on the way to it is a Link.
		if fi, err := os.Lstat(hostio.HostJoin(w.root, missing)); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		r := w.resolve(missing, memo)
		addLinks(r.links)
		for t := r.cur; t != "/"; t = path.Dir(t) {
			fi, err := os.Stat(hostio.HostJoin(w.root, path.Dir(t)))
			if err == nil && fi.IsDir() {
				links[t] = true
				if cur, ok := want[path.Dir(t)]; !ok || cur == (dirID{}) {
					want[path.Dir(t)] = idOf(fi)
				}
				break
			}
			if !errors.Is(err, fs.ErrNotExist) {
				break
			}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, nil
	}
	w.links = links
	for d, wd := range w.dir {
		id, ok := want[d]
		if !ok || id != (dirID{}) && id != w.ids[d] {
			delete(w.dir, d)
			delete(w.ids, d)
			if names := slices.DeleteFunc(w.wds[wd], func(n string) bool { return n == d }); len(names) > 0 {
				w.wds[wd] = names // another name of the same directory keeps the watch
				continue
			}
			unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.wds, wd)
		}
	}
	for d := range want {
		if _, ok := w.dir[d]; ok {
			continue
		}
		wd, err := unix.InotifyAddWatch(w.fd, hostio.HostJoin(w.root, d), watchMask)
		if err != nil {
			failed = append(failed, WatchFailure{Dir: d, Err: err})
			continue
		}
		w.dir[d], w.wds[wd] = wd, append(w.wds[wd], d)
		if id := want[d]; id != (dirID{}) {
			w.ids[d] = id
		} else if fi, err := os.Stat(hostio.HostJoin(w.root, d)); err == nil {
			w.ids[d] = idOf(fi)
		}
		added = append(added, d)
	}
	slices.Sort(added)
	slices.SortFunc(failed, func(a, b WatchFailure) int { return strings.Compare(a.Dir, b.Dir) })
	return added, failed
}

// WatchFailure is a directory Set could not watch (a host path), and
// inotify_add_watch's error (an errno, comparable: ENOSPC where the
// user's inotify watches, fs.inotify.max_user_watches, are spent).
type WatchFailure struct {
	Dir string
	Err error
}

// maxLinks bounds the symlinks followed resolving one watched directory
// (the kernel's own bound, MAXSYMLINKS): a loop ends there.
const maxLinks = 40

// linksOnTheWay returns the symlinks (host paths) the kernel follows
// resolving host path d: those on its own path, and those on the way
// through their targets (/etc/kubernetes -> static/kubernetes, with
// /etc/static -> /srv/gen-1: both). Retargeting any of them leads d to
// another directory. memo holds what a prefix of d resolved to (one Set's
// directories share most of theirs: each name is read once).
func (w *Watcher) linksOnTheWay(d string, memo map[string]resolved) []string {
	return w.resolve(d, memo).links
}

// resolve is where host path d leads (linksOnTheWay): the directory the
// kernel reaches, and the symlinks it follows on the way.
func (w *Watcher) resolve(d string, memo map[string]resolved) resolved {
	return resolveIn(w.root, d, memo)
}

// resolveIn is where host path d leads under root, as the host follows
// it (an absolute link's target is a host path, under root too): the path
// reached (no symlink on it) and the symlinks followed to reach it. A name
// that is not there, or no link, is taken as it is. memo holds what a
// prefix of d resolved to, under the same root.
func resolveIn(root, d string, memo map[string]resolved) resolved {
	d = path.Clean("/" + d)
	// The longest prefix of d resolved before (d[:end], a whole name),
	// then the names after it, each prefix kept: substrings of d.
	r, from := resolved{cur: "/"}, 1
	for end := len(d); end > 1; end = strings.LastIndexByte(d[:end], '/') {
		if m, ok := memo[d[:end]]; ok {
			r, from = m, end+1
			break
		}
	}
	for from < len(d) {
		end := strings.IndexByte(d[from:], '/')
		if end < 0 {
			end = len(d)
		} else {
			end += from
		}
		r = step(root, r, d[from:end])
		memo[d[:end]] = r
		from = end + 1
	}
	return r
}

// resolved is where a path's resolution stands: the directory reached
// (no symlink in it) and the symlinks followed to reach it.
type resolved struct {
	cur   string
	links []string
}

// step resolves name in r.cur under root, following a symlink there
// through its target, maxLinks in all.
func step(root string, r resolved, name string) resolved {
	// path.Join(r.cur, name), r.cur clean, with one copy (a reading of
	// the mount table resolves its patterns' directories each time)
	var next string
	switch {
	case name == "..":
		next = path.Dir(r.cur)
	case r.cur == "/":
		next = "/" + name
	default:
		next = r.cur + "/" + name
	}
	if len(r.links) >= maxLinks {
		return resolved{cur: next, links: r.links}
	}
	var st unix.Stat_t
	if err := unix.Lstat(hostio.HostJoin(root, next), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return resolved{cur: next, links: r.links}
	}
	links := append(slices.Clip(r.links), next)
	target, err := os.Readlink(hostio.HostJoin(root, next))
	if err != nil {
		return resolved{cur: next, links: links}
	}
	t := resolved{cur: r.cur, links: links}
	if path.IsAbs(target) {
		t.cur = "/"
	}
	for _, c := range strings.Split(target, "/") {
		if c != "" && c != "." {
			t = step(root, t, c)
		}
	}
	return t
}

// Event is one notification: the host path it concerns ("" when the queue
// overflowed and events were lost).
type Event struct {
	Path string
	// Link: Path is a symlink on the way to a watched directory
	// (linksOnTheWay), or the name where a dangling one's target would
	// appear.
	Link     bool
	Overflow bool
	// Gone: the watched directory Path was removed, renamed or unmounted;
	// its watch is dropped and the next Set watches what is there now.
	Gone bool
}

// Run reads notifications until ctx is done and calls fn for each. It
// closes the watcher when it returns, at a read error too: nothing reads
// its queue any more.
func (w *Watcher) Run(ctx context.Context, fn func(Event)) error {
	stop := context.AfterFunc(ctx, func() { w.Close() })
	defer stop()
	defer w.Close()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 && off+unix.SizeofInotifyEvent+int(ev.Len) <= n {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = strings.TrimRight(string(raw), "\x00")
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				fn(Event{Overflow: true})
				continue
			}
			w.mu.Lock()
			names := slices.Clone(w.wds[int(ev.Wd)])
			links := w.links
			gone := len(names) > 0 && ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0
			if gone {
				// A moved directory keeps its watch (it follows the
				// inode): drop it, its names are watched anew by Set.
				if ev.Mask&unix.IN_IGNORED == 0 && !w.closed {
					unix.InotifyRmWatch(w.fd, uint32(ev.Wd))
				}
				delete(w.wds, int(ev.Wd))
				for _, d := range names {
					if w.dir[d] == int(ev.Wd) {
						delete(w.dir, d)
						delete(w.ids, d)
					}
				}
			}
			w.mu.Unlock()
			for _, d := range names {
				if gone {
					fn(Event{Path: d, Gone: true})
					continue
				}
				p := path.Join(d, name)
				fn(Event{Path: p, Link: name != "" && links[p]})
			}
		}
	}
}

// Close releases the inotify instance (once: a second Close is
// os.ErrClosed).
func (w *Watcher) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	return w.f.Close()
}
