package scenarios

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/syself/autopilot-health/checks"

	"golang.org/x/sys/unix"
)

// KmsgRecord is one /dev/kmsg record.
type KmsgRecord struct {
	Raw string // "prio,seq,usec,flags;message" without the continuation lines
	Msg string
}

// Usec is the record's kernel time (CLOCK_MONOTONIC, microseconds).
func (r KmsgRecord) Usec() (uint64, error) {
	f := strings.SplitN(r.Raw, ",", 4)
	if len(f) < 4 {
		return 0, fmt.Errorf("kernel record %q: no timestamp", r.Raw)
	}
	u, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kernel record %q: %w", r.Raw, err)
	}
	return u, nil
}

// Wall is the record's wall time: the wall clock now less the kernel time
// since the record was logged (as the daemon dates a record).
func (r KmsgRecord) Wall() (time.Time, error) {
	u, err := r.Usec()
	if err != nil {
		return time.Time{}, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	return now.Add(-(time.Duration(ts.Nano()) - time.Duration(u)*time.Microsecond)), nil
}

// Kmsg reads the kernel log from the moment it was opened.
type Kmsg struct{ fd int }

// OpenKmsg opens /dev/kmsg at its end.
func OpenKmsg() (*Kmsg, error) {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if _, err := unix.Seek(fd, 0, unix.SEEK_END); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Kmsg{fd: fd}, nil
}

func (k *Kmsg) Close() { unix.Close(k.fd) }

// Drain returns the records logged since the last call.
func (k *Kmsg) Drain() []KmsgRecord {
	var out []KmsgRecord
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(k.fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue
		}
		if err != nil || n <= 0 {
			return out
		}
		raw, _, _ := strings.Cut(string(buf[:n]), "\n")
		_, msg, _ := strings.Cut(raw, ";")
		out = append(out, KmsgRecord{Raw: raw, Msg: msg})
	}
}

// Await waits for a record whose message matches re.
func (k *Kmsg) Await(re *regexp.Regexp, d time.Duration) (KmsgRecord, error) {
	deadline := time.Now().Add(d)
	for {
		for _, r := range k.Drain() {
			if re.MatchString(r.Msg) {
				return r, nil
			}
		}
		if time.Now().After(deadline) {
			return KmsgRecord{}, fmt.Errorf("no kernel message matching %q within %v", re, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AwaitPath waits until a path exists.
func AwaitPath(p string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", p, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// AttachLoop attaches a file to a free loop device.
func AttachLoop(file string) (dev string, detach func(), err error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
	unix.Close(ctl)
	if err != nil {
		return "", nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
	}
	dev = fmt.Sprintf("/dev/loop%d", n)
	if err := AwaitPath(dev, 2*time.Second); err != nil {
		return "", nil, err
	}
	lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	ffd, err := unix.Open(file, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(lfd)
		return "", nil, err
	}
	cfg := unix.LoopConfig{Fd: uint32(ffd)}
	copy(cfg.Info.File_name[:], file)
	err = unix.IoctlLoopConfigure(lfd, &cfg)
	unix.Close(ffd)
	if err != nil {
		unix.Close(lfd)
		return "", nil, fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
	}
	return dev, func() {
		_ = unix.IoctlSetInt(lfd, unix.LOOP_CLR_FD, 0)
		unix.Close(lfd)
	}, nil
}

// Ext4 makes an ext4 image of sizeMB in /tmp, attaches it to a loop device
// and mounts it at /mnt/<name> with errors=remount-ro.
func (g *Guest) Ext4(name string, sizeMB int64) (dev, mnt string, cleanup func(), err error) {
	img := "/tmp/" + name + ".img"
	f, err := os.Create(img)
	if err != nil {
		return "", "", nil, err
	}
	if err := f.Truncate(sizeMB << 20); err != nil {
		f.Close()
		return "", "", nil, err
	}
	f.Close()
	if _, err := g.Run("mke2fs", "-q", "-F", "-t", "ext4", img); err != nil {
		return "", "", nil, err
	}
	dev, detach, err := AttachLoop(img)
	if err != nil {
		return "", "", nil, err
	}
	mnt = "/mnt/" + name
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		detach()
		return "", "", nil, err
	}
	if err := unix.Mount(dev, mnt, "ext4", 0, "errors=remount-ro"); err != nil {
		detach()
		return "", "", nil, fmt.Errorf("mount %s on %s: %w", dev, mnt, err)
	}
	return dev, mnt, func() {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		detach()
	}, nil
}

// DirectRead reads size bytes at off with O_DIRECT (past the page cache,
// so the device answers), into page-aligned memory.
func DirectRead(dev string, off int64, size int) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	_, err = unix.Pread(fd, mem[:size], off)
	return err
}

// DirectWrite writes n MiB of a pattern at the start of dev with O_DIRECT.
func DirectWrite(dev string, mib int) error {
	fd, err := unix.Open(dev, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i*7 + 1)
	}
	for i := 0; i < mib; i++ {
		if _, err := unix.Pwrite(fd, mem, int64(i)<<20); err != nil {
			return fmt.Errorf("write MiB %d of %s: %w", i, dev, err)
		}
	}
	return unix.Fsync(fd)
}

// NVMeAdmin sends an admin command to /dev/nvme0 and returns the
// completion's result dword, through the daemon's own NVMe ioctl code.
func NVMeAdmin(opcode uint8, nsid, cdw10, cdw11 uint32, buf []byte) (uint32, error) {
	return checks.NVMeAdminCommand("/dev/nvme0", opcode, nsid, cdw10, cdw11, buf)
}
