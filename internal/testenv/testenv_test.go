package testenv

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSkipHelper is Skip called by a test, run by TestSkipFailsUnderCI in
// a process of its own.
func TestSkipHelper(t *testing.T) {
	if os.Getenv("TESTENV_SKIP_HELPER") == "" {
		t.Skip("run by TestSkipFailsUnderCI")
	}
	Skip(t, "no frobnicator here (apt install frob)")
	t.Error("Skip returned")
}

// Skip skips where CI is not "true", and fails the test, with the reason,
// where it is: README's promise that a unit test which needs a part of the
// machine is never skipped in CI.
func TestSkipFailsUnderCI(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		fail     bool
		want     string
		inResult string
	}{
		{"true", true, "CI=true and this test cannot run: no frobnicator here (apt install frob)", "--- FAIL: TestSkipHelper"},
		{"", false, "no frobnicator here (apt install frob)", "--- SKIP: TestSkipHelper"},
		{"false", false, "no frobnicator here (apt install frob)", "--- SKIP: TestSkipHelper"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipHelper$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "TESTENV_SKIP_HELPER=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.fail {
			t.Errorf("CI=%q: exit %v, want failed=%v:\n%s", tc.ci, err, tc.fail, out)
		}
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), tc.inResult) || strings.Contains(string(out), "Skip returned") {
			t.Errorf("CI=%q: output lacks %q and %q:\n%s", tc.ci, tc.inResult, tc.want, out)
		}
	}
}

// fsUID is the file-system user of the calling thread (the fourth field
// of the Uid: line of /proc/thread-self/status).
func fsUID() (string, error) {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) == 4 {
				return f[3], nil
			}
		}
	}
	return "", errors.New("no Uid: line")
}

// Unprivileged's file-system user stays on the thread that ran fn, which
// no other goroutine ever runs on (Go ends a thread whose goroutine exits
// locked to it, or parks it for good where it is the main thread): the
// code under test, the test's own reads and the next test run as root.
// fn runs as nobody; then as many goroutines as the process has threads
// and more, each locked to a thread of its own at once, so that every
// idle thread of the runtime's pool runs one, find root's file-system
// user. Were fn's thread unlocked, it would go back to the pool as
// nobody's, and one of them would run on it.
func TestUnprivilegedDiscardsItsThread(t *testing.T) {
	if os.Geteuid() != 0 {
		Skip(t, "the file-system user is changed only where the test runs as root")
	}
	var inside string
	var err error
	Unprivileged(t, func() { inside, err = fsUID() })
	if err != nil || inside != "65534" {
		t.Fatalf("fn's file-system user %q (%v), want 65534", inside, err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := len(tasks) + 4
	release := make(chan struct{})
	uids := make(chan string, n)
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			uid, err := fsUID()
			if err != nil {
				uid = err.Error()
			}
			uids <- uid
			<-release // keep this thread, so the next goroutine takes another
		}()
	}
	for range n {
		if uid := <-uids; uid != "0" {
			t.Errorf("a goroutine after Unprivileged runs with file-system user %q, want 0", uid)
		}
	}
	close(release)
}

// The kernel makes a process that changes a thread's file-system user not
// dumpable (suid_dumpable, 0 by default), the whole process: after
// Unprivileged a test binary that crashed left no core, and another user's
// tool (a profiler, a debugger, a test's helper process as nobody) could
// not read its /proc/PID files. Unprivileged puts back what it found.
func TestUnprivilegedKeepsTheProcessDumpable(t *testing.T) {
	if os.Geteuid() != 0 {
		Skip(t, "the file-system user is changed only where the test runs as root")
	}
	before, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	Unprivileged(t, func() {})
	if after, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || after != before {
		t.Errorf("dumpable %d (%v) after Unprivileged, %d before", after, err, before)
	}
}

// inMountNamespaceHelper names what TestInMountNamespaceHelper does when
// TestInMountNamespaceSkips runs it: "nocap" (run without CAP_SYS_ADMIN),
// "skip" (its child skips).
const inMountNamespaceHelper = "AUTOPILOT_HEALTH_TEST_IN_MOUNT_NAMESPACE_HELPER"

// TestInMountNamespaceHelper is run by TestInMountNamespaceSkips alone.
func TestInMountNamespaceHelper(t *testing.T) {
	mode := os.Getenv(inMountNamespaceHelper)
	if mode == "" {
		t.Skip("run by TestInMountNamespaceSkips")
	}
	if !InMountNamespace(t, "a helper") {
		return
	}
	if mode == "skip" {
		Skip(t, "the child skips") // CI is not set in the helper's run
	}
	t.Fatalf("ran in a mount namespace (%s)", mode)
}

// InMountNamespace where the test cannot run in a mount namespace of its
// own skips, off CI, with the reason, and neither passes nor fails: as
// root without CAP_SYS_ADMIN (a container's root), where unshare(1) is
// refused; and where the test run again in the namespace skips (the
// child's reason). Before, both failed ("in a mount namespace of its own
// (...): exit status 1", "...: <nil>" and the child's SKIP).
func TestInMountNamespaceSkips(t *testing.T) {
	if os.Geteuid() != 0 {
		Skip(t, "running the helper with and without CAP_SYS_ADMIN needs root")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		Skip(t, "no setpriv(1) to drop CAP_SYS_ADMIN")
	}
	for _, tc := range []struct {
		mode   string
		argv   []string
		reason string
	}{
		{"nocap", []string{setpriv, "--bounding-set", "-sys_admin"}, "CAP_SYS_ADMIN"},
		{"skip", nil, "the child skips"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			argv := append(tc.argv, os.Args[0], "-test.run=^TestInMountNamespaceHelper$", "-test.v")
			cmd := exec.Command(argv[0], argv[1:]...)
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "CI=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, inMountNamespaceHelper+"="+tc.mode)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- SKIP: TestInMountNamespaceHelper") || !strings.Contains(string(out), tc.reason) {
				t.Errorf("%s: %v, want the helper skipped saying %q:\n%s", tc.mode, err, tc.reason, out)
			}
		})
	}
}
