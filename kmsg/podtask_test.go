package kmsg

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// events records the events the store emits.
type events struct{ got *[]report.Event }

func (events) ConditionChanged(*report.Condition, report.Condition) {}
func (events) ConditionRestored(report.Condition)                   {}
func (e events) EventEmitted(ev report.Event)                       { *e.got = append(*e.got, ev) }

// fakeProc writes a /proc tree holding <pid>/cgroup for each pid.
func fakeProc(t *testing.T, cgroups map[string]string) string {
	t.Helper()
	proc := t.TempDir()
	for pid, cg := range cgroups {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

// nowUsec is the kernel time the tests' monitors take for now: the
// records they handle are logged a second before.
const nowUsec = 3600e6

// podMonitor is a monitor that reads the tasks' cgroups under proc (""
// none), the log read to its end, with the events it emits in got.
func podMonitor(t *testing.T, proc string) (*Monitor, *report.Store, *[]report.Event) {
	t.Helper()
	store := report.NewStore("b")
	var got []report.Event
	store.Observe(events{&got})
	o := opts(t, store)
	o.Proc = proc
	mon := NewMonitor(o)
	mon.pods.now = func() uint64 { return nowUsec }
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	return mon, store, &got
}

const (
	podV2Systemd  = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e.slice/cri-containerd-4b2d.scope\n"
	podV2Cgroupfs = "0::/kubepods/besteffort/pod0f1e/4b2d\n"
	// cgroup v1 (hybrid), the cgroupfs driver: the pod's controllers,
	// and systemd's own hierarchies where containerd started it.
	podV1Cgroupfs = "12:memory:/kubepods/burstable/pod0f1e/4b2d\n11:pids:/kubepods/burstable/pod0f1e/4b2d\n1:name=systemd:/system.slice/containerd.service\n0::/system.slice/containerd.service\n"
	// A kind node in a CI pod: its own kubelet, under the pod's cgroup.
	podKind     = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod77aa.slice/cri-containerd-9c1f.scope/system.slice/kubelet.service\n"
	hostKubelet = "0::/system.slice/kubelet.service\n"
	hostV1      = "12:memory:/system.slice/containerd.service\n1:name=systemd:/system.slice/containerd.service\n"
)

// A hung task named as a node daemon that systemd runs (kubelet,
// containerd, its shims) in a pod's cgroup is a pod's own process (kind in
// a CI pod, Docker in Docker): a TaskHung event saying so, not
// KernelDeadlock, which reboots and replaces a cloud node. The node's own
// daemons, the names of what legitimately runs in a pod's cgroup (a Kata
// VM's QEMU and its vCPU threads, virtiofsd, a container's init), and
// every line whose task cannot be looked up (gone, no /proc, a line from
// more than a minute ago) set KernelDeadlock as before.
func TestPodsOwnNodeDaemonIsNotKernelDeadlock(t *testing.T) {
	proc := fakeProc(t, map[string]string{
		"4242": podV2Systemd, "4243": podV1Cgroupfs, "4244": podV2Cgroupfs, "4245": podKind,
		"100": hostKubelet, "101": hostV1,
		"4300": podV2Systemd, "4301": podV2Systemd, "4302": podV2Systemd, "4303": podV2Systemd, "4304": podV2Systemd,
	})
	line := func(task, pid string) string {
		return "INFO: task " + task + ":" + pid + " blocked for more than 120 seconds."
	}
	const sec = uint64(time.Second / time.Microsecond)
	for _, tc := range []struct {
		name, proc, task, pid string
		usec                  uint64
		deadlock              bool
		cgroup                string // in the event's message
	}{
		{name: "pod kubelet, cgroup v2, systemd driver", task: "kubelet", pid: "4242", deadlock: false,
			cgroup: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e.slice/cri-containerd-4b2d.scope"},
		{name: "pod containerd, cgroup v1, cgroupfs driver", task: "containerd", pid: "4243", deadlock: false,
			cgroup: "/kubepods/burstable/pod0f1e/4b2d"},
		{name: "pod containerd shim, cgroup v2, cgroupfs driver", task: "containerd-shim", pid: "4244", deadlock: false,
			cgroup: "/kubepods/besteffort/pod0f1e/4b2d"},
		{name: "kind node's kubelet in a CI pod", task: "kubelet", pid: "4245", deadlock: false,
			cgroup: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod77aa.slice/cri-containerd-9c1f.scope/system.slice/kubelet.service"},
		{name: "the node's kubelet", task: "kubelet", pid: "100", deadlock: true},
		{name: "the node's containerd, cgroup v1", task: "containerd", pid: "101", deadlock: true},
		{name: "a Kata VM's QEMU in its pod", task: "qemu-system-x86", pid: "4300", deadlock: true},
		{name: "a Kata vCPU thread in its pod", task: "CPU 0/KVM", pid: "4301", deadlock: true},
		{name: "virtiofsd in its pod", task: "virtiofsd", pid: "4302", deadlock: true},
		{name: "a container's init", task: "runc:[2:INIT]", pid: "4303", deadlock: true},
		{name: "crun in a pod", task: "crun", pid: "4304", deadlock: true},
		{name: "the task is gone", task: "kubelet", pid: "999", deadlock: true},
		{name: "no /proc to read (a replay)", proc: "-", task: "kubelet", pid: "4242", deadlock: true},
		{name: "a line from more than a minute ago", task: "kubelet", pid: "4242", usec: nowUsec - 61*sec, deadlock: true},
		{name: "a line from a minute ago", task: "kubelet", pid: "4242", usec: nowUsec - 60*sec, deadlock: false,
			cgroup: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e.slice/cri-containerd-4b2d.scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := proc
			if tc.proc == "-" {
				p = ""
			}
			mon, store, got := podMonitor(t, p)
			usec := tc.usec
			if usec == 0 {
				usec = nowUsec - sec
			}
			msg := line(tc.task, tc.pid)
			mon.Handle(rec(usec, msg), t0)
			c, _ := store.Get("KernelDeadlock")
			if tc.deadlock {
				if c.Status != report.StatusTrue || c.Reason != report.ReasonCriticalTaskHung || c.Message != msg {
					t.Errorf("KernelDeadlock %+v, want True, CriticalTaskHung, %q", c, msg)
				}
			} else if c.Status != report.StatusFalse {
				t.Errorf("KernelDeadlock %+v, want False: the task is a pod's", c)
			}
			if len(*got) != 1 || (*got)[0].Reason != "TaskHung" {
				t.Fatalf("events %+v, want one TaskHung", *got)
			}
			ev := (*got)[0].Message
			if tc.deadlock {
				if ev != msg {
					t.Errorf("TaskHung message %q, want the line, %q", ev, msg)
				}
				return
			}
			if want := msg + " (the task is in a pod's cgroup, " + tc.cgroup + ": a pod's own " + tc.task + ", not the node's, so not KernelDeadlock)"; ev != want {
				t.Errorf("TaskHung message\n%q, want\n%q", ev, want)
			}
			if n := testutil.ToFloat64(mon.cur.matched["KernelDeadlock"]); n != 0 {
				t.Errorf("KernelDeadlock counted %v matches, want 0", n)
			}
			if n := testutil.ToFloat64(mon.cur.matched["TaskHung"]); n != 1 {
				t.Errorf("TaskHung counted %v matches, want 1", n)
			}
		})
	}
}

// A read of a task's cgroup that does not return (/proc/<pid>/cgroup
// waits for the kernel's cgroup lock, which a hung cgroup operation may
// hold: the very hang the line reports) holds the kernel log's reader for
// podLookupWait at most: the line then sets KernelDeadlock, as without the
// lookup. While that read hangs no other is started, and the lines wait
// for none; once it returns, tasks are looked up again.
func TestHungCgroupReadFailsTowardsKernelDeadlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var reads atomic.Int32
		hang := true
		mon, store, got := podMonitor(t, "/proc")
		mon.pods.read = func(path string) ([]byte, error) {
			reads.Add(1)
			if hang {
				<-release
			}
			return []byte(podV2Systemd), nil
		}
		line := "INFO: task kubelet:4242 blocked for more than 120 seconds."
		start := time.Now()
		mon.Handle(rec(nowUsec-1, line), t0)
		if waited := time.Since(start); waited != podLookupWait {
			t.Errorf("the reader waited %v for the hung read, want %v", waited, podLookupWait)
		}
		if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusTrue {
			t.Errorf("KernelDeadlock %+v after a hung cgroup read, want True", c)
		}
		// Another line while the read hangs: no wait, no second read.
		start = time.Now()
		mon.Handle(rec(nowUsec-1, "INFO: task containerd:4243 blocked for more than 120 seconds."), t0)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("a line while the read hangs waited %v, want none", waited)
		}
		if n := reads.Load(); n != 1 {
			t.Errorf("%d reads while the first hangs, want 1", n)
		}
		if c, _ := store.Get("KernelDeadlock"); !strings.HasPrefix(c.Message, "INFO: task containerd:4243 ") {
			t.Errorf("KernelDeadlock %+v, want the second line's", c)
		}
		// The read returns: the next line is looked up (and is a pod's).
		hang = false
		close(release)
		synctest.Wait()
		*got = nil
		mon.Handle(rec(nowUsec-1, "INFO: task kubelet:4244 blocked for more than 120 seconds."), t0)
		if n := reads.Load(); n != 2 {
			t.Errorf("%d reads after the hung one returned, want 2", n)
		}
		if len(*got) != 1 || !strings.Contains((*got)[0].Message, "a pod's own kubelet") {
			t.Errorf("events %+v, want a TaskHung event naming the pod's kubelet", *got)
		}
		if c, _ := store.Get("KernelDeadlock"); !strings.HasPrefix(c.Message, "INFO: task containerd:4243 ") {
			t.Errorf("KernelDeadlock %+v: the pod's kubelet changed it", c)
		}
	})
}

// A custom rule's pid group may hold anything: only digits are looked up,
// never a path out of /proc.
func TestCustomRulePidIsAPID(t *testing.T) {
	root := fakeProc(t, map[string]string{"4242": podV2Systemd, "proc": ""})
	store := report.NewStore("b")
	rs, err := Compile([]Rule{{Name: "KernelDeadlock", Kind: Perm, Condition: "KernelDeadlock", Reason: "CriticalTaskHung",
		Pattern: `^hung: (?P<task>\S+) in (?P<pid>\S+)$`}}, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	mon := NewMonitor(Options{Rules: rs, Store: store, Proc: filepath.Join(root, "proc")})
	mon.pods.now = func() uint64 { return nowUsec }
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	mon.Handle(rec(nowUsec-1, "hung: kubelet in ../4242"), t0)
	if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusTrue {
		t.Errorf("KernelDeadlock %+v, want True: ../4242 is no PID", c)
	}
}
