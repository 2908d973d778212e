package checks

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// DiskUsageHigh's read of the mount table (readMountinfo: unix.Read into
// 16 KiB, grown while the kernel has more) on a node with many mounts: real
// tmpfs mounts in a mount namespace of the test's own (the test runs itself
// again in a child process made with CLONE_NEWNS: a namespace of one of the
// test process's threads would change /proc/self for the whole package
// were that thread the main one), a table of more than 16 KiB, 64 KiB and
// 1 MiB, read from /proc/self/mountinfo as the check reads it. Every mount
// is seen, once, and so is every mount that stays while others are mounted
// and unmounted during the reads (the kernel makes the table in pieces,
// one read at a time).
func TestMountinfoReadOfALargeAndChangingTable(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "needs root to mount")
	}
	const env = "AUTOPILOT_HEALTH_TEST_IN_MOUNTNS"
	if os.Getenv(env) == "" {
		testenv.StartsProcesses(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestMountinfoReadOfALargeAndChangingTable$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), env+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("in its mount namespace: %v\n%s", err, out)
		}
		t.Logf("in its mount namespace:\n%s", out)
		return
	}
	if err := mountinfoTable(t); err != nil {
		t.Fatal(err)
	}
}

func mountinfoTable(t *testing.T) error {
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
	table := "/proc/self/mountinfo"
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
	// The table changing during the reads: another goroutine mounts and
	// unmounts tmpfs next to the ones that stay.
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
