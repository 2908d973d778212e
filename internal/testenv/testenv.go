// Package testenv helps tests that need a part of the machine (root, a
// system tool) decide what to do when it is missing.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// CI reports whether the tests run in CI (CI=true), where every tier is
// meant to run.
func CI() bool { return os.Getenv("CI") == "true" }

// Skip skips the test on a developer's machine that lacks what it needs,
// and fails it in CI: there, a tier that cannot run is a broken CI machine,
// not a pass.
func Skip(t testing.TB, why string) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true and this test cannot run: %s", why)
	}
	t.Skip(why)
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes: a log handler's
// output that a test reads while the code under test still logs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Len is the length of what was written so far.
func (s *SyncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// Threads is the CPU (ns, from schedstat) and the voluntary context switches
// (each a wake-up after a wait) of every thread of this process, for the
// benchmarks that count what a paced operation costs the whole process.
func Threads(t testing.TB) (cpu, wakes int64) {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no threads: %v", err)
	}
	for _, task := range tasks {
		if raw, err := os.ReadFile(filepath.Join(task, "schedstat")); err == nil {
			if f := strings.Fields(string(raw)); len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				cpu += n
			}
		}
		status, err := os.ReadFile(filepath.Join(task, "status"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(status)) {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				wakes += n
			}
		}
	}
	return cpu, wakes
}

// HelperProcess runs the test binary again with env set (its TestMain then
// serves instead of testing: a server in a process of its own, so that its
// CPU and system calls are not the benchmark's), killed at the end of t,
// and returns the first line it prints.
func HelperProcess(t testing.TB, env string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the helper process printed no line: %v", err)
	}
	return strings.TrimSpace(line)
}

// Unprivileged runs fn where the file permissions hold for it: on a thread
// of its own whose file-system user and group are nobody's (65534) where the
// test runs as root (setfsuid drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
// from that thread only), as it is where the test runs as another user. The
// thread is locked and never unlocked, so no other goroutine runs on it:
// it ends with fn, or, where it is the process's main thread (which Go
// never ends), it is parked for good (TestUnprivilegedDiscardsItsThread).
// fn runs in another goroutine: it must not call t.Fatal; it returns what
// the test checks.
func Unprivileged(t testing.TB, fn func()) {
	t.Helper()
	// Changing a thread's file-system user makes the whole process not
	// dumpable (no core; another user's tool may not read its /proc
	// files): put back what was.
	if dumpable, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err == nil {
		defer unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(dumpable), 0, 0, 0)
	}
	failed := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if os.Geteuid() == 0 {
			if err := unix.Setfsgid(65534); err != nil {
				failed <- fmt.Errorf("setfsgid: %w", err)
				return
			}
			if err := unix.Setfsuid(65534); err != nil {
				failed <- fmt.Errorf("setfsuid: %w", err)
				return
			}
			if uid, _ := unix.SetfsuidRetUid(-1); uid != 65534 {
				failed <- fmt.Errorf("setfsuid: the thread's file-system user is %d, not 65534", uid)
				return
			}
		}
		fn()
		failed <- nil
	}()
	if err := <-failed; err != nil {
		t.Fatal(err)
	}
}

// FullBacklogSocket binds a Unix stream socket at path that listens with a
// backlog of 0 and accepts nothing, and fills its backlog: a frozen
// daemon's socket, where a connect fails at once (EAGAIN). It skips (a
// failure under CI) where the kernel took no connection or did not stop
// taking them. The socket and the held connections are closed at the
// test's end.
func FullBacklogSocket(t testing.TB, path string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	// Fill the backlog: connections nobody accepts.
	held := 0
	for range 8 {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
		held++
	}
	if held == 0 || held == 8 {
		Skip(t, fmt.Sprintf("%d connections taken into a backlog of 0: not a full backlog", held))
	}
}

// mountNamespaceChildEnv marks the test binary that InMountNamespace
// re-executes in a mount namespace of its own.
const mountNamespaceChildEnv = "AUTOPILOT_HEALTH_TEST_MOUNT_NAMESPACE_CHILD"

// InMountNamespace reports whether t runs in a mount namespace of its own,
// where it may mount over the host's paths (/etc/hosts, /run) with no
// effect outside. Where it does not, it re-executes the test binary for t
// alone (a top-level test) under unshare(1) --mount --propagation private,
// fails t unless the child's t passed, logs the child's output, and returns
// false: the caller returns. It needs root with CAP_SYS_ADMIN (a
// container's root may lack it) and unshare(1): why says what for, in the
// skip (a failure under CI) where one is missing. A child that skips skips
// t, with the child's output (under CI its Skip failed it).
func InMountNamespace(t *testing.T, why string) bool {
	t.Helper()
	if os.Getenv(mountNamespaceChildEnv) != "" {
		return true
	}
	if os.Geteuid() != 0 {
		Skip(t, why+" needs root")
	}
	if !hasCapSysAdmin() {
		Skip(t, why+" needs CAP_SYS_ADMIN (a mount namespace of its own), which this root lacks")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		Skip(t, why+" needs unshare(1)")
	}
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), mountNamespaceChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil && strings.Contains(string(out), "--- SKIP: "+t.Name()) {
		Skip(t, "in a mount namespace of its own ("+why+"), the test skipped:\n"+string(out))
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in a mount namespace of its own (%s): %v\n%s", why, err, out)
	}
	t.Logf("child:\n%s", out)
	return false
}

// hasCapSysAdmin reports whether the process has CAP_SYS_ADMIN in its
// effective set: unshare(CLONE_NEWNS) and mount need it.
func hasCapSysAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
}

// HostsWithoutLocalhost bind-mounts over /etc/hosts a file that lacks
// localhost (in a mount namespace of the test's own: InMountNamespace),
// and makes Go's resolver count, and fail, each DNS connection it makes.
// It shows first that a plain net.Dialer asks DNS for localhost there (Go's
// behaviour, the premise of a test that the code under test asks nothing),
// failing t where it does not; it returns the count, at 0.
func HostsWithoutLocalhost(t *testing.T) *atomic.Int32 {
	t.Helper()
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 vm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(hosts, "/etc/hosts", "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount a hosts file without localhost: %v", err)
	}
	asked := new(atomic.Int32)
	r := net.DefaultResolver
	r.PreferGo, r.Dial = true, func(ctx context.Context, network, address string) (net.Conn, error) {
		asked.Add(1)
		return nil, errors.New("the test's resolver: no DNS server here")
	}
	// Go's own behaviour: a lookup of localhost, not in /etc/hosts, asks DNS.
	if c, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", "localhost:1"); err == nil {
		c.Close()
	}
	if asked.Load() == 0 {
		t.Fatal("a plain net.Dialer reached localhost without asking DNS: Go makes the name special, and this test proves nothing")
	}
	t.Logf("a plain net.Dialer asked DNS %d times for localhost", asked.Load())
	asked.Store(0)
	return asked
}

// NoExecEnv names the environment variable that makes a test which starts
// another process skip: `make test-arm64` sets it, because there the tests
// run under qemu-user 7.2 (Debian 12's qemu-user-static), whose fork of a
// multithreaded program now and then hangs in the child before its exec
// (os/exec's Start then never returns: a test waited out its 30 s check
// timeout in CI, and one `-count=200` run hung for good; golang/go#68976 and
// #69259 name 7.2's os/exec as broken). Its value says why.
const NoExecEnv = "AUTOPILOT_HEALTH_TEST_NO_EXEC"

// StartsProcesses skips the rest of the test where NoExecEnv is set: the
// test starts another process from here on. What the test asserted before
// the call still counts.
func StartsProcesses(t testing.TB) {
	t.Helper()
	if why := os.Getenv(NoExecEnv); why != "" {
		t.Skipf("starts another process, and %s", why)
	}
}
