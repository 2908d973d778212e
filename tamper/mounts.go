package tamper

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path"
	"strings"

	"github.com/syself/autopilot-health/internal/hostio"
	"golang.org/x/sys/unix"
)

// MountsFile is the mount table MountWatcher polls: this process's
// mount namespace, where the scan reads the protected paths (the packaged
// units' namespaces receive the host's mounts).
var MountsFile = "/proc/self/mountinfo"

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
	fd       int
	root     string
	relevant func(hostPath string) bool
	// prev are the relevant mounts of the last reading (relevantMounts).
	prev map[string]string
}

// NewMountWatcher opens the mount table and reads it: a mount made after
// it returns is reported by Run. relevant says which mount points (host
// paths under root) are reported.
func NewMountWatcher(root string, relevant func(hostPath string) bool) (*MountWatcher, error) {
	fd, err := unix.Open(MountsFile, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: MountsFile, Err: err}
	}
	m := &MountWatcher{fd: fd, root: root, relevant: relevant}
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
		cur, err := m.read()
		if err != nil {
			return err
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
// mount point as a host path.
func (m *MountWatcher) read() (map[string]string, error) {
	if _, err := unix.Seek(m.fd, 0, 0); err != nil {
		return nil, &os.PathError{Op: "seek", Path: MountsFile, Err: err}
	}
	var buf bytes.Buffer
	chunk := make([]byte, 64<<10)
	for {
		n, err := unix.Read(m.fd, chunk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: MountsFile, Err: err}
		}
		if n == 0 {
			break
		}
		buf.Write(chunk[:n])
	}
	out := map[string]string{}
	for line := range strings.Lines(buf.String()) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := path.Clean(hostio.UnescapeMountinfo(f[4]))
		hp, ok := underRoot(m.root, mp)
		if !ok || !m.relevant(hp) {
			continue
		}
		out[f[0]+" "+f[3]+" "+f[4]] = hp
	}
	return out, nil
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
