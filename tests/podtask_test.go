//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// The daemon under its own, packaged unit (PrivateUsers=yes, no capability,
// ProtectProc=invisible: other processes are hidden in its /proc but from
// procfs's gid= group, 0, root's and the daemon's) tells a pod's own hung
// kubelet from the node's: it reads /proc/<pid>/cgroup of another root
// process, which holds every capability, through that sandbox.
//   - a root process named kubelet in a pod's cgroup, as the kubelet's
//     systemd driver names it (kubepods.slice/kubepods-besteffort.slice/
//     kubepods-besteffort-pod<uid>.slice), in a PID namespace of its own
//     (a container's): its hung-task line is a TaskHung event whose
//     message names that cgroup, and KernelDeadlock stays False;
//   - a root process named containerd-shim in a pod's cgroup, in the
//     host's PID namespace (Kata's shim, which Kata moves into its pod's
//     cgroup): its line sets KernelDeadlock True;
//   - a root process named kubelet in the node's kubelet.service: its line
//     sets KernelDeadlock True.
//
// The lines are written to the real /dev/kmsg (facility user, so
// kernel_only is off) and name the processes by their PIDs in the
// namespace's PID namespace, which is the one the daemon's /proc shows: the
// kernel names a hung task by its PID in the host's, the daemon's on a node.
func TestPodsKubeletUnderTheShippedUnit(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	tok := harness.Token()
	podSlice := "kubepods-besteffort-pod" + tok + ".slice"
	// Both run as root, without a sandbox, holding every capability PID 1
	// holds: as the kubelets of a node and of a kind node in a CI pod run.
	units := map[string]string{
		"kubelet.service": "[Unit]\nDescription=the node's kubelet (a stand-in)\nDefaultDependencies=no\n\n[Service]\nExecStart=/etc/systemd/system/bin/kubelet infinity\n",
		// In a PID namespace of its own, as a container's processes are:
		// unshare is the main process, the kubelet its child.
		"pod-kubelet.service": "[Unit]\nDescription=a pod's own kubelet (a stand-in)\nDefaultDependencies=no\n\n[Service]\nSlice=" + podSlice + "\nExecStart=/usr/bin/unshare --pid --fork /etc/systemd/system/bin/kubelet infinity\n",
		// Kata's shim (containerd-shim-kata-v2; the kernel names it
		// containerd-shim) in its pod's cgroup, in the host's PID namespace.
		"kata-shim.service": "[Unit]\nDescription=Kata's shim (a stand-in)\nDefaultDependencies=no\n\n[Service]\nSlice=" + podSlice + "\nExecStart=/etc/systemd/system/bin/containerd-shim-kata-v2 infinity\n",
	}
	s, usr := shippedUnitSystemd(t, "autopilot-health-podtask-"+tok+"-", nil, false)
	ctx := context.Background()
	// sleep, named kubelet: the kernel names a task by its executable's
	// name (comm), as the hung-task line below does.
	sleep, err := os.ReadFile("/usr/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Units, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kubelet", "containerd-shim-kata-v2"} {
		if err := os.WriteFile(filepath.Join(s.Units, "bin", name), sleep, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range units {
		if err := s.AddUnit(ctx, name, content); err != nil {
			t.Fatal(err)
		}
	}
	// task starts unit and returns the PID, in the namespace, of its
	// process named comm (its main process, or with child its main
	// process's child), root's, and the unit's cgroup.
	task := func(unit, comm string, child bool) (pid uint32, cgroup string) {
		t.Helper()
		if err := s.StartUnit(ctx, unit); err != nil {
			t.Fatalf("starting %s: %v", unit, err)
		}
		sp, err := s.Properties(ctx, unit, "Service")
		if err != nil {
			t.Fatal(err)
		}
		main, _ := sp["MainPID"].Value().(uint32)
		cgroup, _ = sp["ControlGroup"].Value().(string)
		// Type=simple: the start job ends at the fork, before the exec.
		var dir string
		eventually(t, 10*time.Second, unit+"'s process to be root's "+comm, func() (bool, string) {
			var status []byte
			if child {
				pid, dir, err = nsChild(s, main)
				if err == nil {
					status, err = os.ReadFile(filepath.Join(dir, "status"))
				}
			} else {
				pid = main
				dir, status, err = hostStatus(s, pid)
			}
			if err != nil {
				return false, err.Error()
			}
			name, _, _ := strings.Cut(string(status), "\n")
			uid := regexp.MustCompile(`(?m)^Uid:.*$`).Find(status)
			return name == "Name:\t"+comm && string(uid) == "Uid:\t0\t0\t0\t0", name + ", " + string(uid)
		})
		t.Logf("%s: PID %d in the namespace (%s on the host), cgroup %s", unit, pid, filepath.Base(dir), cgroup)
		return pid, cgroup
	}
	podPID, podCgroup := task("pod-kubelet.service", "kubelet", true)
	shimPID, _ := task("kata-shim.service", "containerd-shim", false)
	nodePID, nodeCgroup := task("kubelet.service", "kubelet", false)
	if want := "/kubepods.slice/kubepods-besteffort.slice/" + podSlice + "/pod-kubelet.service"; podCgroup != want {
		t.Fatalf("the pod's kubelet is in %q, want %q", podCgroup, want)
	}
	if strings.Contains(nodeCgroup, "kubepods") {
		t.Fatalf("the node's kubelet is in %q", nodeCgroup)
	}

	// Every check off; of the kernel log rules only the hung task's two;
	// the log read from its end (the ring holds other tests' hung-task
	// lines, whose PIDs are no process here: by their name alone they set
	// KernelDeadlock).
	var c strings.Builder
	port := freeTCPPort(t)
	fmt.Fprintf(&c, "node_name = \"podtask\"\nrole = \"worker\"\ngpu = \"false\"\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n[runner]\nfirst_run_spread = \"0s\"\n[kubernetes]\nkubeconfig = \"\"\n", port)
	c.WriteString(checksOffBut())
	var disable []string
	for _, r := range kmsg.DefaultRules {
		if r.Name != "KernelDeadlock" && r.Name != "TaskHung" {
			disable = append(disable, fmt.Sprintf("%q", r.Name))
		}
	}
	// The critical tasks are the two this test names: the machine's own
	// containerd, runc or QEMU hung meanwhile (the kernel's line, read
	// with kernel_only off too) would set KernelDeadlock before the test's
	// lines, a kubelet or Kata shim of this machine's alone still could.
	fmt.Fprintf(&c, "[kmsg]\nkernel_only = false  # the test's lines have facility user\nfrom_boot_start = false\ncritical_tasks = [\"kubelet\", \"containerd-shim\"]\ndisable = [%s]\n", strings.Join(disable, ", "))
	etc := s.Root("/etc/autopilot-health")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "config.toml"), []byte(c.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("starting autopilot-health.service: %v", err)
	}
	sp, err := s.Properties(ctx, "autopilot-health.service", "Service")
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox this is about, in effect on the daemon: no capability,
	// root alone mapped, other processes hidden in its /proc.
	mainPID, _ := sp["MainPID"].Value().(uint32)
	if bnd, err := capBounding(s, mainPID); err != nil || bnd != 0 {
		t.Errorf("the daemon's bounding set: %#x (%v), want none", bnd, err)
	}
	if m := sandboxInEffect(s, mainPID); len(m) > 0 {
		t.Errorf("the unit's sandbox is not in effect on the daemon: missing %s", strings.Join(m, ", "))
	}
	if dir, _, err := hostStatus(s, mainPID); err != nil {
		t.Error(err)
	} else if um, _ := os.ReadFile(filepath.Join(dir, "uid_map")); strings.Join(strings.Fields(string(um)), " ") != "0 0 1" {
		t.Errorf("the daemon's uid_map %q, want root alone (PrivateUsers=)", um)
	}
	eventually(t, 15*time.Second, "the kernel log reader up", func() (bool, string) {
		v, last := metricOf(t, port, "autopilot_health_kmsg_reader_up")
		return v == 1, last
	})
	sock := s.Root("/run/autopilot-health/status.sock")
	kernelDeadlock := func() daemon.ConditionStatus {
		t.Helper()
		out, _ := exec.Command(filepath.Join(usr, "bin", "autopilot-health"), "status", "--json", "--socket", sock).Output()
		var st daemon.StatusReport
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("status --json: %v: %s", err, out)
		}
		for _, c := range st.Conditions {
			if c.Type == "KernelDeadlock" {
				return c
			}
		}
		t.Fatalf("no KernelDeadlock in the status: %s", out)
		return daemon.ConditionStatus{}
	}
	if c := kernelDeadlock(); c.Status != report.StatusFalse {
		t.Fatalf("KernelDeadlock before any line: %+v, want False", c)
	}

	// The pod's kubelet: the line's TaskHung event, which says which
	// cgroup (read from /proc/<pid>/cgroup through the sandbox), is in the
	// journal once the line did what it does to the condition (the monitor
	// sets a condition before it emits the same record's event; the first
	// TaskHung event is logged at once). Awaited by its words, not by
	// problem_counter{reason="TaskHung"} == 1: any hung-task line counts
	// there, another test binary's "INFO: task <token>:N ..." too, which
	// would pass the wait before this line was read (and fail it after).
	podLine := fmt.Sprintf("INFO: task kubelet:%d blocked for more than 120 seconds.", podPID)
	if err := harness.WriteKmsg(podLine); err != nil {
		t.Fatal(err)
	}
	note := fmt.Sprintf("%s (the task is in a pod's cgroup, %s: a pod's own kubelet, not the node's, so not KernelDeadlock)", podLine, podCgroup)
	eventually(t, 10*time.Second, "the TaskHung event in the journal, naming the pod's cgroup", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return strings.Contains(j, note), lastBytes(j, 2000)
	})
	if v, last := metricOf(t, port, `problem_counter{reason="TaskHung"}`); v < 1 {
		t.Errorf("the pod's kubelet's TaskHung event not counted: %s", last)
	}
	if c := kernelDeadlock(); c.Status != report.StatusFalse {
		t.Errorf("after a hung kubelet in a pod's cgroup (%s): KernelDeadlock %+v, want False", podCgroup, c)
	}
	if v, last := metricOf(t, port, `autopilot_health_kmsg_matches_total{rule="KernelDeadlock"}`); v > 0 {
		t.Errorf("the pod's kubelet matched KernelDeadlock: %s", last)
	}

	// Kata's shim, in a pod's cgroup but the host's PID namespace: the
	// node's runtime, KernelDeadlock.
	shimLine := fmt.Sprintf("INFO: task containerd-shim:%d blocked for more than 120 seconds.", shimPID)
	if err := harness.WriteKmsg(shimLine); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "KernelDeadlock True from Kata's shim", func() (bool, string) {
		c := kernelDeadlock()
		return c.Status == report.StatusTrue && c.Reason == "CriticalTaskHung" && c.Message == shimLine, fmt.Sprintf("%+v", c)
	})

	// The node's kubelet: KernelDeadlock.
	nodeLine := fmt.Sprintf("INFO: task kubelet:%d blocked for more than 120 seconds.", nodePID)
	if err := harness.WriteKmsg(nodeLine); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "KernelDeadlock True from the node's kubelet", func() (bool, string) {
		c := kernelDeadlock()
		return c.Status == report.StatusTrue && c.Reason == "CriticalTaskHung" && c.Message == nodeLine, fmt.Sprintf("%+v", c)
	})
}

// nsChild returns the PID, in the namespace, of the child of the
// namespace's process pid (unshare --fork's: the one child it has), and its
// directory in the host's /proc.
func nsChild(s *harness.Systemd, pid uint32) (uint32, string, error) {
	dir, _, err := hostStatus(s, pid)
	if err != nil {
		return 0, "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "task", filepath.Base(dir), "children"))
	if err != nil {
		return 0, "", err
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0, "", fmt.Errorf("PID %d has children %q, want one", pid, f)
	}
	child := filepath.Join("/proc", f[0])
	st, err := os.ReadFile(filepath.Join(child, "status"))
	if err != nil {
		return 0, "", err
	}
	// NSpid: the host's PID, the namespace's, the child's own namespace's.
	m := regexp.MustCompile(`(?m)^NSpid:\s+\d+\s+(\d+)\s+\d+$`).FindSubmatch(st)
	if m == nil {
		return 0, "", fmt.Errorf("the child %s of PID %d is not in a PID namespace below the namespace's: %s", f[0], pid, st)
	}
	n, err := strconv.ParseUint(string(m[1]), 10, 32)
	return uint32(n), child, err
}
