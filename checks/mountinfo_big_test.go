package checks

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// DiskUsageHigh's read of the mount table (readMountinfo: unix.Read into
// 16 KiB, grown while the kernel has more) on a node with many mounts: real
// tmpfs mounts in a private mount namespace of the test's thread, a table
// of more than 16 KiB, 64 KiB and 1 MiB, read from procfs as the check
// reads it. Every mount is seen, once, and so is every mount that stays
// while others are mounted and unmounted during the reads (the kernel
// makes the table in pieces, one read at a time).
func TestMountinfoReadOfALargeAndChangingTable(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "needs root to mount")
	}
	errc := make(chan error, 1)
	go func() {
		// This thread goes with the namespace: never unlocked.
		runtime.LockOSThread()
		errc <- mountinfoTable(t)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func mountinfoTable(t *testing.T) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The mounts under a tmpfs of the namespace's own, all let go by one
	// lazy unmount (the directories never reach the test's temp dir).
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	table := "/proc/thread-self/mountinfo"
	mounted := 0
	mountTo := func(n int) error {
		for ; mounted < n; mounted++ {
			p := filepath.Join(dir, strconv.Itoa(mounted))
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=4k"); err != nil {
				return fmt.Errorf("mount %s: %w", p, err)
			}
		}
		return nil
	}
	seen := func(what string, b []byte, n int) error {
		ms, err := parseMountinfo(b)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		count := make(map[string]int)
		for _, m := range ms {
			if filepath.Dir(m.MountPoint) == dir {
				count[filepath.Base(m.MountPoint)]++
			}
		}
		for i := range n {
			if c := count[strconv.Itoa(i)]; c != 1 {
				return fmt.Errorf("%s (%d bytes, %d mounts): mount %d seen %d times, want once", what, len(b), len(ms), i, c)
			}
		}
		return nil
	}
	for _, size := range []int{16 << 10, 64 << 10, 1 << 20} {
		for {
			b, err := readMountinfo(table)
			if err != nil {
				return err
			}
			if err := seen(fmt.Sprintf("a table on the way to %d bytes", size), b, mounted); err != nil {
				return err
			}
			if len(b) > size {
				t.Logf("a table of %d bytes, %d tmpfs of the test's: every one seen", len(b), mounted)
				break
			}
			if err := mountTo(mounted + max(16, (size-len(b))/120+8)); err != nil {
				return err
			}
		}
	}
	// The table changing during the reads: another thread in the same
	// namespace mounts and unmounts tmpfs next to the ones that stay.
	ns, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ns)
	churn := filepath.Join(dir, "churn")
	if err := os.Mkdir(churn, 0o755); err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var churned atomic.Int64
	churnErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // never unlocked: the thread goes with the namespace
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			churnErr <- err
			return
		}
		if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
			churnErr <- fmt.Errorf("setns: %w", err)
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			churned.Add(1)
			p := filepath.Join(churn, strconv.Itoa(i%64))
			os.Mkdir(p, 0o755)
			if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=4k"); err != nil {
				churnErr <- err
				return
			}
			if i >= 32 {
				if err := unix.Unmount(filepath.Join(churn, strconv.Itoa((i-32)%64)), unix.MNT_DETACH); err != nil {
					churnErr <- err
					return
				}
			}
		}
	}()
	var rerr error
	for r := 0; r < 10 && rerr == nil; r++ {
		b, err := readMountinfo(table)
		if err != nil {
			rerr = err
			break
		}
		rerr = seen(fmt.Sprintf("read %d during the churn", r), b, mounted)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d mounts and unmounts beside the reads", churned.Load())
	select {
	case err := <-churnErr:
		return fmt.Errorf("churn: %w", err)
	default:
	}
	return rerr
}
