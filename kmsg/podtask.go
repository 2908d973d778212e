package kmsg

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// PodGatedTasks are the critical task names that are node daemons systemd
// runs, which a pod may run as its own too: a kind node in a CI pod runs
// its own kubelet and containerd, a Docker-in-Docker runner its own
// containerd and shims. A hung task of one of these names whose cgroup
// lies under the kubelet's pod hierarchy, and that runs in a PID namespace
// below the host's (a container's), is the pod's, not the node's: a
// TaskHung event, not KernelDeadlock. (containerd starts its runc shims in
// its own cgroup, system.slice/containerd.service, unless its runtime's
// ShimCgroup option names another; Kata moves its shim,
// containerd-shim-kata-v2, into its pod's cgroup, but it runs in the
// host's PID namespace: a node's shim either way.) The other critical names (runc:[2:INIT], crun, a Kata VM's
// QEMU, its vCPU threads and virtiofsd) run in the pod's cgroup by design
// and stay critical wherever they are.
var PodGatedTasks = []string{"kubelet", "containerd", "containerd-shim*"}

// podLookupMaxAge is how old (kernel time) a hung-task line may be for its
// task to be looked up: the kernel prints the line while the task is
// blocked, and a task in D state cannot exit, so the PID is still the
// task's when the line is read at once; a line read later (the backlog of
// an earlier run of the daemon) may name a PID the task no longer has.
const podLookupMaxAge = uint64(time.Minute / time.Microsecond)

// podLookupWait is how long the kernel log's reader waits for a task's
// cgroup. Reading /proc/<pid>/cgroup takes the kernel's cgroup lock, which
// a hung cgroup operation holds: the very hang the line may report. A read
// that does not return in time is left to finish on its own goroutine and
// the line is matched by its name; no other read starts until it returns.
const podLookupWait = 2 * time.Second

// podCgroupMax bounds what is read of /proc/<pid>/cgroup (one line per
// hierarchy: a few hundred bytes).
const podCgroupMax = 64 << 10

// pods looks up whether a hung task is in a pod's cgroup. Only the
// reader's goroutine uses it.
type pods struct {
	// proc is the host's /proc: "" no lookup (a replay of another host's
	// lines).
	proc string
	// read reads a file (readCgroup): tests replace it.
	read func(path string) ([]byte, error)
	hostLookup
}

func newPods(proc string) pods {
	return pods{proc: proc, read: readCgroup, hostLookup: hostLookup{now: MonotonicNow}}
}

// hostLookup bounds the lookups on the host that the kernel log's reader
// waits for as it handles a line (a hung task's cgroup, the mounts of a
// device a read-only line names).
type hostLookup struct {
	// now returns the kernel time now (MonotonicNow): tests replace it.
	now func() uint64
	// hung is closed when a lookup that outlasted podLookupWait returns;
	// nil while none is pending.
	hung chan struct{}
}

// lookup runs f on a goroutine of its own for the line of kernel time
// usec and returns what f returned; ok false, without f, when the line is
// over podLookupMaxAge old or a lookup that outlasted podLookupWait has not
// returned yet (no other starts until it does), and when f does not return
// within podLookupWait (it is left to finish on its own).
func lookup[T any](h *hostLookup, usec uint64, f func() (T, bool)) (v T, ok bool) {
	if now := h.now(); now > usec && now-usec > podLookupMaxAge {
		return v, false
	}
	if h.hung != nil {
		select {
		case <-h.hung:
			h.hung = nil
		default:
			return v, false
		}
	}
	type result struct {
		v  T
		ok bool
	}
	res := make(chan result, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		v, ok := f()
		res <- result{v, ok}
	}()
	wait := time.NewTimer(podLookupWait)
	defer wait.Stop()
	select {
	case r := <-res:
		return r.v, r.ok
	case <-wait.C:
		h.hung = done
		return v, false
	}
}

func readCgroup(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, podCgroupMax))
}

// gated reports whether task is one of PodGatedTasks.
func gated(task string) bool {
	for _, p := range PodGatedTasks {
		if TaskMatch(p, task) {
			return true
		}
	}
	return false
}

// podCgroup returns the cgroup of the task pid when it lies under the
// kubelet's pod hierarchy and the task runs, under its name, in a
// container's PID namespace (podTask, from /proc/<pid>/status); usec is the kernel time of the
// line that names the task, task its name. Not found (the task is gone,
// its PID another process's, /proc is not readable, the read hangs, the
// line is over podLookupMaxAge old, no lookup configured, the task in the
// host's PID namespace or its status without NSpid): ok false, and the
// line is matched by the task's name alone.
func (p *pods) podCgroup(pid, task string, usec uint64) (cgroup string, ok bool) {
	if p.proc == "" || !isDigits(pid) { // a custom rule's group may hold anything
		return "", false
	}
	path := filepath.Join(p.proc, pid, "cgroup")
	read := p.read
	status := filepath.Join(p.proc, pid, "status")
	return lookup(&p.hostLookup, usec, func() (string, bool) {
		b, err := read(path)
		if err != nil {
			return "", false
		}
		cgroup, ok := parsePodCgroup(b)
		if ok {
			// Only a task in a pod's cgroup needs its PID namespace.
			if st, err := read(status); err != nil || !podTask(st, task) {
				// Not the task the line names, or in the host's PID
				// namespace, or its status does not say.
				return "", false
			}
		}
		return cgroup, ok
	})
}

// podTask reports whether /proc/<pid>/status is of the task named task
// (its Name, the comm the kernel's line names: a PID that another process
// took since the line was printed is not the task's) and says it runs in
// a PID namespace below the one of that procfs (inNestedPIDNS).
func podTask(status []byte, task string) bool {
	name, _, _ := strings.Cut(string(status), "\n")
	return name == "Name:\t"+task && inNestedPIDNS(status)
}

// inNestedPIDNS reports whether /proc/<pid>/status says the task runs in a
// PID namespace below the one of that procfs: its NSpid line (Linux 4.1+)
// holds its PID in each namespace from the procfs's down to its own, one
// PID in the host's, two or more in a container's. A pod's own kubelet or
// containerd (kind in a CI pod, Docker in Docker) runs in its container's
// PID namespace; a node daemon that a runtime put in a pod's cgroup runs
// in the host's: Kata's shim (containerd-shim-kata-v2, "containerd-shim"
// as the kernel cuts it), which Kata moves into its pod's cgroup, or a
// node's kubelet that an operator's --kubelet-cgroups put under kubepods.
// No NSpid line (an older kernel), or one that does not read: false.
func inNestedPIDNS(status []byte) bool {
	for line := range strings.SplitSeq(string(status), "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		for _, x := range f {
			if !isDigits(x) {
				return false
			}
		}
		return len(f) >= 2
	}
	return false
}

// parsePodCgroup returns the first cgroup path of /proc/<pid>/cgroup
// ("hierarchy-ID:controllers:path" per line; cgroup v2's "0::path") that
// holds "kubepods": the kubelet's pod hierarchy, as the cgroupfs driver
// names it (/kubepods/burstable/pod<uid>/<container>) and the systemd
// driver (/kubepods.slice/kubepods-burstable.slice/...), under any
// --cgroup-root, on cgroup v1 (a controller's hierarchy) and v2.
func parsePodCgroup(b []byte) (string, bool) {
	for line := range strings.SplitSeq(string(b), "\n") {
		_, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		_, path, ok := strings.Cut(rest, ":")
		if ok && strings.Contains(path, "kubepods") {
			return path, true
		}
	}
	return "", false
}

// podNote is what a hung task's events say of a node daemon's name found
// in a pod's cgroup.
func podNote(task, cgroup string) string {
	return fmt.Sprintf(" (the task is in a pod's cgroup, %s: a pod's own %s, not the node's, so not KernelDeadlock)", cgroup, task)
}
