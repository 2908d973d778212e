//go:build integration

package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// hungFS is a FUSE file system mounted over a directory that answers no
// request after its INIT: a stat or a read below the directory blocks in
// the kernel (request_wait_answer) as on a disk that hangs, until
// release, which answers every request with EIO and unmounts it.
type hungFS struct {
	dir      string
	fd       int
	requests atomic.Int32 // requests seen after INIT, unanswered until release
	pending  chan uint64
	once     sync.Once
	released atomic.Bool
}

// fuseDevice is the FUSE device the hung disk is served through.
const fuseDevice = "/dev/fuse"

// fuseNeeded says what a machine without FUSE lacks. The tiers in tests/
// fail, not skip, where a part they need is missing (README, "Tests"): a
// CI machine without it is a broken one, and says which part.
const fuseNeeded = "the hung-kubeconfig-disk tests need FUSE: the device " + fuseDevice + " (a container: --device " + fuseDevice +
	") and the kernel's fuse file system (modprobe fuse), as root"

// mountHungFS mounts a hungFS over dir; released when the test ends.
func mountHungFS(t *testing.T, dir string) *hungFS {
	t.Helper()
	fd, err := unix.Open(fuseDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v: %s", fuseDevice, err, fuseNeeded)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd)
	if err := unix.Mount("autopilot-health-test-hung", dir, "fuse.hung", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Fatalf("mounting FUSE over %s: %v: %s", dir, err, fuseNeeded)
	}
	h := &hungFS{dir: dir, fd: fd, pending: make(chan uint64, 1024)}
	t.Cleanup(h.release)
	buf := make([]byte, 1<<17)
	// INIT: protocol 7.31, writes of 4 KiB.
	if _, err := unix.Read(fd, buf); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 16+64)
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
	binary.LittleEndian.PutUint64(out[8:], binary.LittleEndian.Uint64(buf[8:]))
	binary.LittleEndian.PutUint32(out[16:], 7)
	binary.LittleEndian.PutUint32(out[20:], 31)
	binary.LittleEndian.PutUint32(out[24:], 4096)
	binary.LittleEndian.PutUint32(out[36:], 4096)
	if _, err := unix.Write(fd, out); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := unix.Read(fd, buf); err != nil {
				// ENODEV once unmounted: the connection is gone.
				close(h.pending)
				unix.Close(fd)
				return
			}
			u := binary.LittleEndian.Uint64(buf[8:])
			if h.released.Load() {
				h.answerEIO(u)
				continue
			}
			h.requests.Add(1)
			h.pending <- u
		}
	}()
	return h
}

func (h *hungFS) answerEIO(unique uint64) {
	out := make([]byte, 16)
	binary.LittleEndian.PutUint32(out[0:], 16)
	errno := -int32(syscall.EIO)
	binary.LittleEndian.PutUint32(out[4:], uint32(errno))
	binary.LittleEndian.PutUint64(out[8:], unique)
	unix.Write(h.fd, out) // a FORGET or an INTERRUPT takes no answer
}

// waitRequest waits until something asked the file system (a stat, a
// read): it is now blocked in the kernel.
func (h *hungFS) waitRequest(t *testing.T, limit time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(limit); h.requests.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing asked the hung file system over %s within %s", h.dir, limit)
		}
	}
}

// release answers the requests blocked and those to come with EIO, and
// unmounts the file system.
func (h *hungFS) release() {
	h.once.Do(func() {
		h.released.Store(true)
		for {
			select {
			case u, ok := <-h.pending:
				if !ok {
					return
				}
				h.answerEIO(u)
				continue
			default:
			}
			break
		}
		unix.Unmount(h.dir, unix.MNT_DETACH)
		go func() {
			// Requests queued after the unmount still get their EIO.
			for u := range h.pending {
				h.answerEIO(u)
			}
		}()
	})
}

// nodeCredentialsIn writes into dir a kubeconfig for node, naming its
// client certificate there by path as kubelet.conf does, and returns its
// path.
func nodeCredentialsIn(t *testing.T, s *harness.APIServer, node, dir string) string {
	t.Helper()
	pair := filepath.Join(dir, "kubelet-client-current.pem")
	if err := s.WriteClientCert(pair, "system:node:"+node, []string{"system:nodes"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubelet.conf")
	if err := s.WriteKubeconfig(kc, node, pair); err != nil {
		t.Fatal(err)
	}
	return kc
}

// stopWithin runs stop and fails the test when it has not returned within
// limit; the file system is then released, so that it does return.
func stopWithin(t *testing.T, h *hungFS, limit time.Duration, stop func()) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		h.release()
		<-done
		t.Fatalf("the stop waited for the hung disk under the kubeconfig: not returned within %s, returned %s after the disk answered",
			limit, time.Since(start)-limit)
		return 0
	}
}

// The disk under the kubeconfig hangs while the daemon reports (a stat
// of kubelet.conf in D state: a real FUSE file system that answers
// nothing, mounted over its directory): the write to come fails after
// lookWait (5 s), its loop going on, and the reporter's stop does not wait
// for the disk: the real API server with NodeRestriction.
func TestKubeStopDoesNotWaitForAHungKubeconfigDisk(t *testing.T) {
	_, _, x, h, _ := reporterOnAHungDisk(t, "node-hungdisk-", 1)
	took := stopWithin(t, h, 10*time.Second, x.stop)
	t.Logf("the reporter stopped %.2f s after the stop, the disk under the kubeconfig hung", took.Seconds())
}

// reporterOnAHungDisk starts a reporter for a node of its own (named
// prefix and a token) with the node's credentials in a directory, awaits
// its first write, then hangs a FUSE file system over that directory,
// changes DiskUsageHigh (True, "during") and awaits failures failed
// writes of it (15 s at most after the disk's first request, an error
// then). It returns the API server, the node, the reporter, the disk and
// when the disk was first asked (from then on it hangs).
func reporterOnAHungDisk(t *testing.T, prefix string, failures float64) (*harness.APIServer, string, *running, *hungFS, time.Time) {
	t.Helper()
	s := apiServer(t)
	node := prefix + harness.Token()
	registerNode(t, s, node)
	dir := t.TempDir()
	kc := nodeCredentialsIn(t, s, node, dir)
	x := reporterWritingOn(t, s, kc, node, "a write before the disk hangs", nil)
	h := mountHungFS(t, dir)
	x.store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "during"}, time.Now())
	h.waitRequest(t, 10*time.Second)
	hung := time.Now()
	for deadline := hung.Add(15 * time.Second); x.m.Failures() < failures; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the writes on the hung disk: %v failed within 15 s, want %v", x.m.Failures(), failures)
			break
		}
	}
	return s, node, x, h, hung
}

// The disk under the kubeconfig hangs from the daemon's start (its first
// stat of kubelet.conf does not return): the daemon runs on, and its stop
// (SIGTERM's context) returns without waiting for the disk, its state
// saved. Before, Run waited for that stat: systemctl stop until
// TimeoutStopSec, and a SIGKILL that a task in D state does not answer.
func TestDaemonStopDoesNotWaitForAHungKubeconfigDisk(t *testing.T) {
	s := apiServer(t)
	node := "node-hungstart-" + harness.Token()
	registerNode(t, s, node)
	dir := t.TempDir()
	kc := nodeCredentialsIn(t, s, node, dir)
	h := mountHungFS(t, dir)
	cfg := config.Default()
	cfg.NodeName, cfg.Role, cfg.GPU = node, "worker", "false"
	cfg.StateDir = t.TempDir()
	cfg.Kubernetes.Kubeconfig = kc
	cfg.Runner.FirstRunSpread = config.Duration{}
	noHostSystemd(cfg)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := daemon.New(cfg, quiet(), daemon.Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	h.waitRequest(t, 30*time.Second)
	took := stopWithin(t, h, 20*time.Second, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "state.json")); err != nil {
		t.Errorf("the state was not saved at the stop: %v", err)
	}
	t.Logf("the daemon stopped %.2f s after the stop, the disk under the kubeconfig hung since its start", took.Seconds())
}

// A disk that hung under the kubeconfig answers again: the writers, whose
// backoff's wait has grown while the disk hung (1, 2, 4, 8 s, ...), retry
// at once, and the Node has the condition that changed meanwhile within a
// few seconds of the disk's answer, not at the end of that wait. The real
// API server with NodeRestriction; a real FUSE file system that answers
// nothing for 12 s, then EIO, then is unmounted (the files below it seen
// again).
func TestKubeWritesResumeWhenAHungKubeconfigDiskAnswers(t *testing.T) {
	s, node, x, h, hung := reporterOnAHungDisk(t, "node-hungdisk-back-", 3)
	time.Sleep(time.Until(hung.Add(12 * time.Second))) // the disk's hang: long enough for the backoff to grow past 4 s
	h.release()
	released := time.Now()
	waitNodeFor(t, s, node, 4*time.Second, "the change made while the disk hung, within 4 s of its answer",
		has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	t.Logf("the Node written %.2f s after the disk answered (%v writes failed while it hung)", time.Since(released).Seconds(), x.m.Failures())
}
