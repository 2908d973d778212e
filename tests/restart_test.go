//go:build integration

package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/tests/harness"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// daemonBinary builds the daemon as it ships (CGO_ENABLED=0), once per
// package run.
func daemonBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "autopilot-health-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "autopilot-health")
		binErr = harness.BuildDaemon(binPath)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// kernelNode is one node whose daemon runs as its own process (the
// shipped binary) against the real API server and the real /dev/kmsg; its
// kernel log rules match only this test's token, so the lines other tests
// left in the machine-wide ring buffer do not count.
type kernelNode struct {
	t       *testing.T
	api     *harness.APIServer
	name    string
	tok     string
	cfgPath string
	state   string
	logs    *testenv.SyncBuffer // the daemon writes it while the test reads (make test-race)
	// metrics is the daemon's metrics address, status its status socket.
	metrics string
	status  string
	cmd     *exec.Cmd
	exited  chan struct{}
	markers int
	// bin is the daemon's binary start runs (empty: this build's).
	bin string
}

func newKernelNode(t *testing.T) *kernelNode { return newKernelNodeWith(t, "") }

// newKernelNodeWith is newKernelNode with more [[kmsg.rules]] (TOML, where
// TOKEN stands for the node's token).
func newKernelNodeWith(t *testing.T, rules string) *kernelNode {
	t.Helper()
	s := apiServer(t)
	tok := harness.Token()
	n := &kernelNode{t: t, api: s, name: "kernel-" + tok, tok: tok, state: filepath.Join(t.TempDir(), "state"), logs: &testenv.SyncBuffer{}}
	n.status = filepath.Join(t.TempDir(), "status.sock")
	registerNode(t, s, n.name)
	_, kc := nodeClient(t, s, n.name)
	// Below the ephemeral range, given once (harness.FreeLoopbackPort): a
	// port 0 gave, closed for the daemon to bind, may be an outgoing
	// connection's by then, at a restart's bind too.
	port := freeTCPPort(t)
	n.metrics = fmt.Sprintf("127.0.0.1:%d", port)
	var disable []string
	for _, r := range kmsg.DefaultRules {
		// PodVolumeReadOnly stays: ReadonlyFilesystem's lines on a pod's volume.
		if r.Name != "ReadonlyFilesystem" && r.Name != "Ext4Warning" && r.Kind != kmsg.PodVolume {
			disable = append(disable, fmt.Sprintf("%q", r.Name))
		}
	}
	checksOff := checksOffBut()
	// Its own control socket: the default path is shared with every
	// other daemon on this machine (and a second one refuses to start).
	conf := fmt.Sprintf(`node_name = %q
role = "worker"
gpu = "false"
state_dir = %q
control_socket = %q
[log]
level = "debug"
format = "text"
[status]
socket = %q
[metrics]
listen_address = "127.0.0.1:%d"
[kubernetes]
kubeconfig = %q
[runner]
first_run_spread = "0s"
%s
[kmsg]
kernel_only = false  # the lines this test writes have facility user
disable = [%s]
[[kmsg.rules]]
name = "ReadonlyFilesystem"
kind = "perm"
condition = "ReadonlyFilesystem"
reason = "FilesystemIsReadOnly"
pattern = '^EXT4-fs \(%s\): Remounting filesystem read-only'
[[kmsg.rules]]
name = "Ext4Warning"
kind = "temp"
reason = "Ext4Warning"
pattern = '^EXT4-fs warning \(device %s\)'
%s
`, n.name, n.state, filepath.Join(t.TempDir(), "control.sock"), n.status, port, kc, checksOff, strings.Join(disable, ", "), tok, tok, strings.ReplaceAll(rules, "TOKEN", tok))
	n.cfgPath = filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(n.cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			t.Logf("daemon logs:\n%s", n.logs.String())
		}
	})
	return n
}

// start starts the daemon's binary.
func (n *kernelNode) start() time.Time {
	n.t.Helper()
	bin := n.bin
	if bin == "" {
		bin = daemonBinary(n.t)
	}
	n.cmd = exec.Command(bin, "run", "--config", n.cfgPath)
	fmt.Fprintf(n.logs, "---- start %s\n", time.Now().Format(time.RFC3339Nano))
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	n.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	start := time.Now()
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.exited = make(chan struct{})
	cmd, exited := n.cmd, n.exited
	go func() { cmd.Wait(); close(exited) }()
	return start
}

// kill SIGKILLs the daemon: nothing of its shutdown runs.
func (n *kernelNode) kill() {
	if n.cmd != nil {
		n.end(syscall.SIGKILL)
	}
}

// stop SIGTERMs the daemon: its shutdown runs, and it exits 0.
func (n *kernelNode) stop() {
	n.t.Helper()
	if code := n.end(syscall.SIGTERM); code != 0 {
		n.t.Errorf("the daemon exited %d after SIGTERM", code)
	}
}

// end sends sig to the daemon and waits (30 s at most) for it to exit,
// returning its exit code (-1 after a signal).
func (n *kernelNode) end(sig syscall.Signal) int {
	n.t.Helper()
	n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		n.t.Fatalf("the daemon did not exit within 30 s of %v", sig)
	}
	code := n.cmd.ProcessState.ExitCode()
	n.cmd = nil
	return code
}

// line writes a kernel log line carrying this node's token.
func (n *kernelNode) line(format string) {
	n.t.Helper()
	write(n.t, strings.ReplaceAll(format, "TOKEN", n.tok))
}

// caughtUp writes a marker line and waits for its event on the API server:
// the running daemon has read the kernel log up to here, and its reporter
// is talking to the API server.
func (n *kernelNode) caughtUp() {
	n.t.Helper()
	n.markers++
	marker := fmt.Sprintf("marker %d", n.markers)
	n.line("EXT4-fs warning (device TOKEN): " + marker)
	deadline := time.Now().Add(30 * time.Second)
	// Written again every 5 s: another writer's flood of the machine-wide
	// ring buffer may overwrite the line before the daemon reads it.
	again := time.Now().Add(5 * time.Second)
	for {
		if time.Now().After(again) {
			n.line("EXT4-fs warning (device TOKEN): " + marker)
			again = time.Now().Add(5 * time.Second)
		}
		evs, err := n.api.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", n.name).String()})
		if err == nil {
			for _, e := range evs.Items {
				if strings.HasSuffix(e.Message, marker) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the daemon did not report %q within 30 s (%v)", marker, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the API server for an awaited event
	}
}

// written waits until the daemon has written its conditions after since
// (their heartbeat time), and returns ReadonlyFilesystem as written.
func (n *kernelNode) written(since time.Time) corev1.NodeCondition {
	n.t.Helper()
	node := waitNode(n.t, n.api, n.name, "a status write after "+since.Format(time.RFC3339Nano), func(node *corev1.Node) bool {
		c := cond(node, "ReadonlyFilesystem")
		return c != nil && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second))
	})
	return *cond(node, "ReadonlyFilesystem")
}

// flapWatch records every ReadonlyFilesystem the API server stores for a
// node; a True followed by anything else, or a True whose transition time
// moves, is a flap.
type flapWatch struct {
	mu   sync.Mutex
	seen []corev1.NodeCondition
	stop context.CancelFunc
	done chan struct{}
}

func watchFlaps(t *testing.T, s *harness.APIServer, node string) *flapWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &flapWatch{stop: cancel, done: make(chan struct{})}
	wi, err := s.Admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if c := cond(ev.Object.(*corev1.Node), "ReadonlyFilesystem"); c != nil {
				w.mu.Lock()
				w.seen = append(w.seen, *c)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// sawWrite waits until the watch has delivered the write of c (its
// heartbeat time and status): the watch delivers in order, so every write
// before it has been seen too. It fails if the watch ended first.
func (w *flapWatch) sawWrite(t *testing.T, c corev1.NodeCondition) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		seen := slices.ContainsFunc(w.seen, func(s corev1.NodeCondition) bool {
			return s.Status == c.Status && s.LastHeartbeatTime.Equal(&c.LastHeartbeatTime)
		})
		w.mu.Unlock()
		if seen {
			return
		}
		select {
		case <-w.done:
			t.Fatal("the watch on the Node ended before it saw the last write: the flaps after it were not seen")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch on the Node did not deliver the write of %s/%s at %s within 30 s", c.Status, c.Reason, c.LastHeartbeatTime.Format(time.RFC3339))
		}
		time.Sleep(20 * time.Millisecond) // polling for the awaited watch event
	}
}

// flaps returns what went wrong after ReadonlyFilesystem first turned True.
func (w *flapWatch) flaps() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	var first *corev1.NodeCondition
	for i, c := range w.seen {
		if first == nil {
			if c.Status == corev1.ConditionTrue {
				first = &w.seen[i]
			}
			continue
		}
		if c.Status != corev1.ConditionTrue {
			out = append(out, fmt.Sprintf("%s/%s at %s", c.Status, c.Reason, c.LastHeartbeatTime.Format(time.RFC3339)))
		} else if !c.LastTransitionTime.Equal(&first.LastTransitionTime) {
			out = append(out, fmt.Sprintf("transition time moved from %s to %s", first.LastTransitionTime.Format(time.RFC3339), c.LastTransitionTime.Format(time.RFC3339)))
		}
	}
	return out
}

// ringHolds reports whether the kernel's ring buffer still holds a record
// containing s.
func ringHolds(t *testing.T, s string) bool {
	t.Helper()
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, kmsg.BufSize)
	for {
		k, err := unix.Read(fd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return false
		case errors.Is(err, unix.EPIPE):
			continue
		case err != nil:
			t.Fatal(err)
		}
		if bytes.Contains(buf[:k], []byte(s)) {
			return true
		}
	}
}

// A kernel condition is held for the boot across a SIGKILL of the daemon:
// with its state kept, with its state directory removed, and with the state
// removed after a flood pushed the line out of the ring buffer. On the Node
// it never flaps and its lastTransitionTime never moves. Before, a start
// without the state wrote False within a second.
func TestKernelConditionHeldAcrossRestarts(t *testing.T) {
	for _, tc := range []struct {
		name         string
		wipe, flood  bool
		restartTwice bool
	}{
		{name: "state kept"},
		{name: "state wiped", wipe: true},
		{name: "state wiped after a flood", wipe: true, flood: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newKernelNode(t)
			w := watchFlaps(t, n.api, n.name)
			n.start()
			// Unknown (not read yet), then False once the log is read.
			n.caughtUp()
			waitNode(t, n.api, n.name, "ReadonlyFilesystem=False before the line", has("ReadonlyFilesystem", corev1.ConditionFalse, "FilesystemIsNotReadOnly"))
			n.line("EXT4-fs (TOKEN): Remounting filesystem read-only")
			set := waitNode(t, n.api, n.name, "ReadonlyFilesystem=True", has("ReadonlyFilesystem", corev1.ConditionTrue, "FilesystemIsReadOnly"))
			ltt := cond(set, "ReadonlyFilesystem").LastTransitionTime
			n.caughtUp() // the state has had its chance to be saved
			n.kill()
			if tc.wipe {
				if err := os.RemoveAll(n.state); err != nil {
					t.Fatal(err)
				}
			}
			if tc.flood {
				for i := range 6000 {
					write(t, fmt.Sprintf("autopilot-health test flood %s %d", n.tok, i))
				}
				if ringHolds(t, "EXT4-fs ("+n.tok+")") {
					t.Fatal("the flood did not push the line out of the ring buffer")
				}
			}
			restarted := n.start()
			n.caughtUp()
			c := n.written(restarted)
			if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&ltt) {
				t.Errorf("after the restart: %s/%s since %s; want True since %s", c.Status, c.Reason, c.LastTransitionTime.Format(time.RFC3339), ltt.Format(time.RFC3339))
			}
			if f := w.flaps(); len(f) > 0 {
				t.Errorf("ReadonlyFilesystem flapped on the Node: %v", f)
			}
		})
	}
}

// The daemon is SIGKILLed at points from right after a kernel error to well
// after it (a condition's new status is saved within a second): however the
// cursor and the state stood, the restarted daemon holds the condition with
// its first transition time. Before, a kill about a second after the line
// left a cursor past it and a state without it: the restart wrote False.
func TestKernelConditionSurvivesKillAtAnyPoint(t *testing.T) {
	for _, after := range []time.Duration{0, 150 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1000 * time.Millisecond, 1100 * time.Millisecond, 1300 * time.Millisecond, 2 * time.Second} {
		t.Run(after.String(), func(t *testing.T) {
			n := newKernelNode(t)
			w := watchFlaps(t, n.api, n.name)
			started := n.start()
			n.caughtUp()
			n.written(started)
			lineAt := time.Now()
			n.line("EXT4-fs (TOKEN): Remounting filesystem read-only")
			time.Sleep(after) // the kill point under test, not a wait for a condition
			n.kill()
			n.start()
			n.caughtUp()
			// Killed before its first write of True, the daemon had left
			// False on the Node: the restart re-reads the line (no flap:
			// the watch only counts what follows a True).
			node := waitNode(t, n.api, n.name, fmt.Sprintf("ReadonlyFilesystem=True after a kill %s after the line", after),
				has("ReadonlyFilesystem", corev1.ConditionTrue, "FilesystemIsReadOnly"))
			c := *cond(node, "ReadonlyFilesystem")
			if d := c.LastTransitionTime.Sub(lineAt); d < -2*time.Second || d > 2*time.Second {
				t.Errorf("transition time %s, the line was written at %s", c.LastTransitionTime.Format(time.RFC3339), lineAt.Format(time.RFC3339Nano))
			}
			if f := w.flaps(); len(f) > 0 {
				t.Errorf("ReadonlyFilesystem flapped on the Node: %v", f)
			}
		})
	}
}

// A line the kernel logged before the daemon first started in this boot
// (an early-boot remount) sets the condition: a start without a cursor reads
// this boot's ring, as `check` does. Before, it started at the end of the
// log and never saw the line.
func TestKernelLineBeforeTheFirstStart(t *testing.T) {
	n := newKernelNode(t)
	lineAt := time.Now()
	n.line("EXT4-fs (TOKEN): Remounting filesystem read-only")
	n.start()
	n.caughtUp()
	// The first write may come before the log was read (Unknown); then True.
	node := waitNode(t, n.api, n.name, "ReadonlyFilesystem=True from a line logged before the start", has("ReadonlyFilesystem", corev1.ConditionTrue, "FilesystemIsReadOnly"))
	c := *cond(node, "ReadonlyFilesystem")
	if d := c.LastTransitionTime.Sub(lineAt); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("transition time %s: not the line's time %s", c.LastTransitionTime.Format(time.RFC3339), lineAt.Format(time.RFC3339Nano))
	}
}

// The kernel log's cursor alone is saved up to 10 s after it moves, and a
// clean stop saves it: a daemon stopped (SIGTERM) right after it handled a
// line, then started again, does not handle the line again, so its Event
// is not sent a second time.
func TestKernelCursorSavedOnCleanStop(t *testing.T) {
	n := newKernelNode(t)
	n.start()
	n.caughtUp()
	n.line("EXT4-fs warning (device TOKEN): handled once")
	deadline := time.Now().Add(30 * time.Second)
	for len(n.nodeEvents("handled once")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no Event for the line within 30 s")
		}
		time.Sleep(50 * time.Millisecond) // polling the API server for an awaited event
	}
	n.stop()
	n.start()
	n.caughtUp() // the restarted daemon has read past the line
	total := int32(0)
	for _, e := range n.nodeEvents("handled once") {
		total += e.Count
	}
	if total != 1 {
		t.Errorf("the line's Event counted %d times after a clean stop and start; want 1 (the cursor was not saved on stop)", total)
	}
}

// An identical kernel line before and after a SIGKILL and restart of the
// shipped daemon is one Event on the real API server, its count 2, as
// without the restart: the event writer's aggregation is kept in the state
// file for the boot, and the restarted daemon reads the Event (a patch of
// nothing: a node's credentials may not get Events) before it patches the
// count. Before, the aggregation lived in memory only: 2 Events, count 1
// each.
func TestEventAggregatedAcrossKillAndRestart(t *testing.T) {
	n := newKernelNode(t)
	n.start()
	n.caughtUp()
	const text = "ext4_end_bio: I/O error 10 writing to inode 12"
	n.line("EXT4-fs warning (device TOKEN): " + text)
	// await polls f every 50 ms (the API server and the state file have no
	// notice to wait on) until it holds, 30 s at most.
	await := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 30 s: %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var name string
	await("the line's Event", func() bool {
		evs := n.nodeEvents(text)
		if len(evs) == 1 {
			name = evs[0].Name
		}
		return name != ""
	})
	await("the state file to take the Event", func() bool {
		b, err := os.ReadFile(filepath.Join(n.state, "state.json"))
		return err == nil && bytes.Contains(b, []byte(`"name": "`+name+`"`))
	})
	n.kill()
	n.start()
	n.caughtUp()
	n.line("EXT4-fs warning (device TOKEN): " + text)
	var evs []corev1.Event
	await("the Event's count 2", func() bool {
		evs = n.nodeEvents(text)
		return len(evs) > 1 || (len(evs) == 1 && evs[0].Count == 2)
	})
	if len(evs) != 1 || evs[0].Name != name {
		for _, e := range evs {
			t.Logf("Event %s count %d: %s", e.Name, e.Count, e.Message)
		}
		t.Errorf("the same line before and after a SIGKILL and restart: %d Events; want 1, %s, with count 2", len(evs), name)
	}
}
