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
	// root is the host root the directories are under.
	root string
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
// would appear. The directory that holds a symlink on the way to one is
// watched too (a retarget of the link notifies it), and a name that leads
// to another directory than the one it was watched on is watched anew. It
// returns the directories it watches now and did not before (added: a
// change made there before this call sent no notification, so whoever
// scanned them before it reads them again), and those that could not be
// watched.
func (w *Watcher) Set(dirs []string) (added, failed []string) {
	want := map[string]dirID{}
	links := map[string]bool{} // host paths checked for a symlink
	for _, d := range dirs {
		var id dirID
		for {
			fi, err := os.Stat(hostio.HostJoin(w.root, d))
			if err == nil {
				id = idOf(fi)
			}
			if err == nil && fi.IsDir() || d == "/" || !errors.Is(err, fs.ErrNotExist) {
				break
			}
			d = path.Dir(d)
		}
		want[d] = id
		for p := d; p != "/" && p != "." && !links[p]; p = path.Dir(p) {
			links[p] = true
			if fi, err := os.Lstat(hostio.HostJoin(w.root, p)); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
				if _, ok := want[path.Dir(p)]; !ok {
					want[path.Dir(p)] = dirID{} // its identity is checked when it is a dirs' own
				}
			}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
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
			failed = append(failed, d)
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
	return added, failed
}

// Event is one notification: the host path it concerns ("" when the queue
// overflowed and events were lost).
type Event struct {
	Path     string
	Overflow bool
	// Gone: the watched directory Path was removed, renamed or unmounted;
	// its watch is dropped and the next Set watches what is there now.
	Gone bool
}

// Run reads notifications until ctx is done and calls fn for each.
func (w *Watcher) Run(ctx context.Context, fn func(Event)) error {
	stop := context.AfterFunc(ctx, func() { w.f.Close() })
	defer stop()
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
			gone := len(names) > 0 && ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0
			if gone {
				// A moved directory keeps its watch (it follows the
				// inode): drop it, its names are watched anew by Set.
				if ev.Mask&unix.IN_IGNORED == 0 {
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
				fn(Event{Path: path.Join(d, name)})
			}
		}
	}
}

// Close releases the inotify instance.
func (w *Watcher) Close() error { return w.f.Close() }
