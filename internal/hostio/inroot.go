package hostio

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenInRoot opens the host path p under root with openat2's
// RESOLVE_IN_ROOT and the open flags flags, and returns the descriptor: the
// symbolic links on the way resolve as the host resolves them (an absolute
// target under root, not under the daemon's own /; a ".." that would climb
// above root stays at root). refused: the kernel has no openat2 (before
// 5.6) or a filter refuses it (ENOSYS, EPERM); the caller falls back to the
// plain call. An error of openat2 is an fs.PathError of op and p under root.
func OpenInRoot(root, p string, flags uint64, op string) (fd int, refused bool, err error) {
	dir, err := os.Open(root)
	if err != nil {
		return -1, false, err
	}
	defer dir.Close()
	return openat2(int(dir.Fd()), root, p, flags, op)
}

// sysOpenat2 is the system call; a variable for tests (a filter that
// refuses it).
var sysOpenat2 = unix.Openat2

func openat2(dirfd int, root, p string, flags uint64, op string) (fd int, refused bool, err error) {
	how := unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_IN_ROOT}
	rel := strings.TrimLeft(p, "/")
	if rel == "" {
		rel = "."
	}
	for range 8 { // EAGAIN: a rename raced the resolution
		fd, err = sysOpenat2(dirfd, rel, &how)
		if err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	switch {
	case err == unix.ENOSYS || err == unix.EPERM:
		return -1, true, err
	case err != nil:
		return -1, false, &fs.PathError{Op: op, Path: filepath.Join(root, p), Err: err}
	}
	return fd, false, nil
}

// InRoot is the path, as the daemon opens it, of the host path p under the
// host root root, its symbolic links resolved as the host resolves them
// (OpenInRoot): /var/run/cilium/cilium.sock through the host's
// /var/run -> /run is <root>/run/cilium/cilium.sock, not the daemon's own
// /run/cilium/cilium.sock; a kubelet directory the host links elsewhere
// (/var/lib/kubelet -> /data/kubelet) is <root>/data/kubelet. What does
// not exist yet is joined to the longest part of p that does, resolved (a
// socket not made yet is looked for where the host will make it). The
// result is spelled with root as given.
//
// With root "/" (or "") it is p itself, with no system call: the daemon's
// own resolution is the host's. So is p under root lexically (HostJoin)
// where p lies in the kernel's pseudo filesystems /proc, /sys and /dev,
// whose links are relative or the kernel's own (/proc/self), and where
// nothing resolves (root unreadable, openat2 refused: before Linux 5.6).
func InRoot(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	p = path.Clean("/" + p)
	if pseudo(p) {
		return filepath.Join(root, p)
	}
	if r, ok := resolveInRoot(root, p, false); ok {
		return r
	}
	return filepath.Join(root, p)
}

// MountPath is the host path p under root as the kernel writes the mount
// point of a mount there (/proc/self/mountinfo): the real path of what p
// resolves to, its links resolved as the host resolves them (InRoot), at
// root "/" too, and root's own links resolved. With /var/lib/kubelet a
// link to /data/kubelet, /var/lib/kubelet/pods is /data/kubelet/pods at
// root "/", <root>/data/kubelet/pods under another. What does not exist
// yet is joined to the longest part of p that does, resolved. Where
// nothing resolves (root unreadable, openat2 refused: before Linux 5.6),
// p under root lexically (HostJoin). A few system calls: two opens and two
// readlinks for a p that exists.
func MountPath(root, p string) string {
	if root == "" {
		root = "/"
	}
	p = path.Clean("/" + p)
	if r, ok := resolveInRoot(root, p, true); ok {
		return r
	}
	return filepath.Join(root, p)
}

// HostMountPath is MountPath spelled as a host path: where the host path p
// resolves now under root, its links followed as the host follows them,
// without root before it (/data/kubelet/pods for /var/lib/kubelet/pods
// with /var/lib/kubelet a link to /data/kubelet, whatever root is): the
// mount point of a mount there as a host's mount table read under root
// names it (DiskUsageHigh's). At root "/" it is MountPath's, root's own
// links resolved. What does not exist yet is joined to the longest part
// that does; where nothing resolves, p (cleaned).
func HostMountPath(root, p string) string {
	if root == "" || root == "/" {
		return MountPath("/", p)
	}
	p = path.Clean("/" + p)
	r, ok := resolveInRoot(root, p, false)
	if !ok {
		return p
	}
	return path.Clean(hostRel(root, r))
}

// resolveInRoot resolves the host path p (clean, absolute) under root with
// openat2's RESOLVE_IN_ROOT, the longest part of it that exists, and
// returns it spelled with root as given (real false: InRoot) or as the
// kernel names the directory reached (real true: MountPath), with what
// does not exist joined. ok false: nothing resolved.
func resolveInRoot(root, p string, real bool) (string, bool) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false
	}
	defer unix.Close(dir)
	rootReal, ok := fdPath(dir)
	if !ok {
		return "", false
	}
	rest := ""
	for q := p; ; q = path.Dir(q) {
		fd, refused, err := openat2(dir, root, q, unix.O_PATH|unix.O_CLOEXEC, "open")
		if err == nil {
			r, ok := fdPath(fd)
			unix.Close(fd)
			if !ok {
				return "", false
			}
			in, ok := strings.CutPrefix(r, rootReal)
			if !ok || (in != "" && in[0] != '/') {
				return "", false
			}
			if real {
				return filepath.Join("/", r, rest), true
			}
			return filepath.Join(root, in, rest), true
		}
		if refused {
			// The shipped unit's RestrictSUIDSGID=yes answers every
			// openat2 ENOSYS (its mode is in a struct seccomp cannot
			// read), as a kernel before 5.6 does: the same
			// resolution, a name at a time.
			in, rest, ok := walkInRoot(root, p)
			if !ok {
				return "", false
			}
			if real {
				return filepath.Join("/", rootReal, in, rest), true
			}
			return filepath.Join(root, in, rest), true
		}
		// Only a name not there (or a file where a directory was
		// looked for) is looked for higher up.
		if q == "/" || !(os.IsNotExist(err) || isNotDir(err)) {
			return "", false
		}
		rest = path.Join(path.Base(q), rest)
	}
}

// maxLinks is the symbolic links walkInRoot follows in one path, as the
// kernel's (ELOOP beyond).
const maxLinks = 40

// walkInRoot resolves the host path p (clean, absolute) under root as
// openat2's RESOLVE_IN_ROOT does, in user space, a name at a time (lstat
// and readlink of each under root): an absolute link target starts again
// at root, a ".." stays at root. It returns the path reached inside root
// (clean, absolute) and what of p does not exist below it, joined as it
// is. ok false: a name that cannot be read (not an absence), or more than
// maxLinks links. Racy against a rename where openat2 is not (EAGAIN):
// a lookup's answer, not a descriptor to use.
func walkInRoot(root, p string) (in, rest string, ok bool) {
	todo := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur, links := "/", 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, name)
		fi, err := os.Lstat(filepath.Join(root, next))
		if os.IsNotExist(err) || errors.Is(err, unix.ENOTDIR) {
			return cur, path.Join(append([]string{name}, todo...)...), true
		}
		if err != nil {
			return "", "", false
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", "", false
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", "", false
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, "", true
}

func isNotDir(err error) bool {
	pe, ok := err.(*fs.PathError)
	return ok && pe.Err == unix.ENOTDIR
}

// pseudo reports whether the host path p lies in /proc, /sys or /dev.
func pseudo(p string) bool {
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// fdPath is the path the kernel gives the open descriptor fd
// (/proc/self/fd/<fd>); ok false where it has none (deleted, another
// mount namespace's).
func fdPath(fd int) (string, bool) {
	r, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !filepath.IsAbs(r) || strings.HasSuffix(r, " (deleted)") {
		return "", false
	}
	if r == "/" {
		r = ""
	}
	return r, true
}

// InRootNoFollow is InRoot of the directory of p, with p's last name joined
// as it is: for a reader that refuses a link in that place (OpenRegular's
// O_NOFOLLOW), which it then still finds and refuses.
func InRootNoFollow(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	p = path.Clean("/" + p)
	return filepath.Join(InRoot(root, path.Dir(p)), path.Base(p))
}
