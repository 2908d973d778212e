package kmsg

import (
	"os"
	"path/filepath"
	"slices"
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

// fakeProc writes a /proc tree holding <pid>/cgroup for each pid, and its
// <pid>/status: a task in the host's PID namespace (NSpid: its PID alone)
// when it is listed in hostNS, else one in a container's (NSpid: its PID
// and its PID in the container, as a pod's processes are).
func fakeProc(t *testing.T, cgroups map[string]string, hostNS ...string) string {
	t.Helper()
	proc := t.TempDir()
	for pid, cg := range cgroups {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
		name := fakeProcNames[pid]
		if name == "" {
			name = "kubelet"
		}
		status := statusInPod(pid, name)
		if slices.Contains(hostNS, pid) {
			status = statusOnHost(pid, name)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

// fakeProcNames are the names of fakeProc's tasks other than kubelet.
var fakeProcNames = map[string]string{"101": "containerd", "4243": "containerd", "4244": "containerd-shim",
	"4400": "containerd-shim", "4401": "containerd-shim"}

// statusInPod and statusOnHost are /proc/<pid>/status of a task named name
// in a container's PID namespace (a pod's) and in the host's (5.x-6.x; the
// lines around NSpid cut).
func statusInPod(pid, name string) string {
	return "Name:\t" + name + "\nTgid:\t" + pid + "\nPid:\t" + pid + "\nNStgid:\t" + pid + "\t7\nNSpid:\t" + pid + "\t7\nNSpgid:\t" + pid + "\t7\n"
}

func statusOnHost(pid, name string) string {
	return "Name:\t" + name + "\nTgid:\t" + pid + "\nPid:\t" + pid + "\nNStgid:\t" + pid + "\nNSpid:\t" + pid + "\nNSpgid:\t" + pid + "\n"
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
	// Kata's shim in its sandbox's cgroup under the pod's
	// (sandbox_cgroup_only=true), and in its container's (false, cgroup v1).
	podKataShim   = "0::/kubepods/burstable/pod0f1e/kata_5d1c\n"
	podKataShimV1 = "12:memory:/kubepods/burstable/pod0f1e/kata_4b2d\n1:name=systemd:/system.slice/containerd.service\n"
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
		"4400": podKataShim, "4401": podKataShimV1, "4402": podV2Systemd,
	}, "100", "101", "4400", "4401", "4402")
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
		// Kata's shim, containerd-shim-kata-v2 ("containerd-shim": the
		// kernel cuts a name to 15 characters), is the node's runtime: it
		// runs in the host's PID namespace, and Kata puts it in its pod's
		// cgroup (sandbox_cgroup_only=true, Kata's own for cgroup v2: in
		// kata_<sandbox> under the pod's; false: each container's shim in
		// that container's kata_<container>).
		{name: "a Kata shim in its pod's sandbox cgroup", task: "containerd-shim", pid: "4400", deadlock: true},
		{name: "a Kata shim in its container's cgroup, cgroup v1", task: "containerd-shim", pid: "4401", deadlock: true},
		// A node's kubelet in a cgroup under kubepods (an operator's
		// --kubelet-cgroups, a slice named so): the node's, whose PID
		// namespace is the host's.
		{name: "the node's kubelet in a cgroup under kubepods", task: "kubelet", pid: "4402", deadlock: true},
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
		var hang atomic.Bool
		hang.Store(true)
		mon, store, got := podMonitor(t, "/proc")
		mon.pods.read = func(path string) ([]byte, error) {
			reads.Add(1)
			if hang.Load() {
				<-release
			}
			if filepath.Base(path) == "status" {
				return []byte(statusInPod(filepath.Base(filepath.Dir(path)), "kubelet")), nil
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
		hang.Store(false)
		close(release)
		synctest.Wait()
		*got = nil
		mon.Handle(rec(nowUsec-1, "INFO: task kubelet:4244 blocked for more than 120 seconds."), t0)
		if n := reads.Load(); n != 4 {
			t.Errorf("%d reads after the hung one returned, want 4 (its cgroup, its status once that returned, then the next task's two)", n)
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

// A task in a pod's cgroup is a pod's own only when its status says it runs
// in a container's PID namespace: a status without NSpid (a kernel before
// 4.1), one that cannot be read, or an NSpid that does not read, leaves
// the name to decide, KernelDeadlock.
func TestPodTaskPIDNamespaceUnknownIsTheNode(t *testing.T) {
	proc := fakeProc(t, map[string]string{"4242": podV2Systemd, "4243": podV2Systemd, "4244": podV2Systemd, "4245": podV2Systemd})
	for pid, status := range map[string]string{
		"4242": "Name:\tkubelet\nPid:\t4242\n",
		"4244": "Name:\tkubelet\nNSpid:\t4244\tx\n",
		"4245": "Name:\tkubelet\nNSpid:\n",
	} {
		if err := os.WriteFile(filepath.Join(proc, pid, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(proc, "4243", "status")); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []string{"4242", "4243", "4244", "4245"} {
		mon, store, _ := podMonitor(t, proc)
		msg := "INFO: task kubelet:" + pid + " blocked for more than 120 seconds."
		mon.Handle(rec(nowUsec-1, msg), t0)
		if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusTrue || c.Message != msg {
			t.Errorf("PID %s: KernelDeadlock %+v, want True: its PID namespace is not known to be a container's", pid, c)
		}
	}
	// The same task with a container's NSpid: the pod's.
	mon, store, _ := podMonitor(t, fakeProc(t, map[string]string{"4242": podV2Systemd}))
	mon.Handle(rec(nowUsec-1, "INFO: task kubelet:4242 blocked for more than 120 seconds."), t0)
	if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusFalse {
		t.Errorf("KernelDeadlock %+v, want False: the task is a pod's", c)
	}
}

// A line is read up to a minute after the kernel printed it (a backlog at a
// start): the task may have left its D state and exited since, and its PID
// gone to another process. A PID whose process is not named as the line
// names the task is not the task: a pod's process of another name there
// does not make the node's hung kubelet a pod's.
func TestPodTaskPIDReusedIsNotThePod(t *testing.T) {
	proc := fakeProc(t, map[string]string{"4242": podV2Systemd})
	if err := os.WriteFile(filepath.Join(proc, "4242", "status"),
		[]byte(statusInPod("4242", "nginx")), 0o644); err != nil {
		t.Fatal(err)
	}
	mon, store, _ := podMonitor(t, proc)
	msg := "INFO: task kubelet:4242 blocked for more than 120 seconds."
	mon.Handle(rec(nowUsec-50*uint64(time.Second/time.Microsecond), msg), t0)
	if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusTrue || c.Message != msg {
		t.Errorf("KernelDeadlock %+v, want True: PID 4242 is nginx's now, not the hung kubelet's", c)
	}
}
