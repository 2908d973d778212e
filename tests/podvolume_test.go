//go:build integration

package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// A real ext4 on a loop device, mounted (errors=remount-ro) below a
// directory standing for the kubelet's pods directory, that the kernel
// remounts read-only after an error (ext4's trigger_fs_error, the kernel's
// own "EXT4-fs (loopN): Remounting filesystem read-only"): the monitor,
// reading the real /dev/kmsg, /sys/class/block and /proc/self/mountinfo,
// emits a PodVolumeReadOnly event naming the device and its mount, and
// ReadonlyFilesystem stays False. The same on a loop device mounted
// outside that directory sets ReadonlyFilesystem True with the kernel's
// line, as before.
func TestKmsgPodVolumeReadOnlyOnARealLoopDevice(t *testing.T) {
	requireLoopTools(t)
	harness.HoldExt4Errors(t) // the kernel's read-only remounts carry no token
	tok := harness.Token()
	dir, err := os.MkdirTemp("", "autopilot-health-pvc-"+tok+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mountExt4 := func(name, mp string) string {
		t.Helper()
		return mountExt4Loop(t, filepath.Join(dir, name+".img"), mp, "-o", "errors=remount-ro")
	}
	pods, plugins := filepath.Join(dir, "kubelet", "pods"), filepath.Join(dir, "kubelet", "plugins")
	podMount := filepath.Join(pods, "6f1c5a8e-"+tok, "volumes", "kubernetes.io~csi", "pvc-"+tok, "mount")
	podDev := mountExt4("pod", podMount)
	nodeMount := filepath.Join(dir, "node-"+tok)
	nodeDev := mountExt4("node", nodeMount)
	trigger := func(dev string) {
		t.Helper()
		if err := os.WriteFile("/sys/fs/ext4/"+dev+"/trigger_fs_error", []byte("1"), 0); err != nil {
			t.Fatalf("trigger_fs_error: %v", err)
		}
	}

	boot, _ := readBootID()
	store := report.NewStore(boot)
	ev := newEventLog(tok)
	store.Observe(ev)
	o := kmsgOpts(t, store)
	o.KernelOnly = true // the kernel's own lines: not another test's written ones
	o.PodVolumeDirs = []string{pods, plugins}
	mon := kmsg.NewMonitor(o)
	mon.Start(time.Now(), kmsg.BootWall())
	rd := &kmsg.Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, store, nil, 10*time.Second, "the reader to read /dev/kmsg to its end", func() bool {
		c, ok := store.Get("ReadonlyFilesystem")
		return ok && c.Status == report.StatusFalse
	})

	// The pod's volume: an event, no condition.
	trigger(podDev)
	waitFor(t, store, ev, 10*time.Second, "the PodVolumeReadOnly event", func() bool { return ev.count() >= 1 })
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Errorf("ReadonlyFilesystem %+v after the pod volume's remount, want False", c)
	}
	ev.mu.Lock()
	got := ev.events[0]
	ev.mu.Unlock()
	line := "EXT4-fs (" + podDev + "): Remounting filesystem read-only"
	if got.Reason != report.EventPodVolumeReadOnly || !strings.HasPrefix(got.Message, line+" (the device "+podDev+", ") ||
		!strings.Contains(got.Message, "directories: "+podMount+"; a pod's volume") {
		t.Errorf("event %+v, want PodVolumeReadOnly with %q, the device and its mount %s", got, line, podMount)
	}

	// The node's filesystem: the condition, with the kernel's line.
	trigger(nodeDev)
	want := "EXT4-fs (" + nodeDev + "): Remounting filesystem read-only"
	waitFor(t, store, nil, 10*time.Second, "ReadonlyFilesystem True", func() bool {
		c, _ := store.Get("ReadonlyFilesystem")
		return c.Status == report.StatusTrue
	})
	if c, _ := store.Get("ReadonlyFilesystem"); c.Message != want {
		t.Errorf("ReadonlyFilesystem %+v, want True with %q", c, want)
	}
	if n := ev.count(); n != 1 {
		t.Errorf("%d events naming the test's mounts, want 1", n)
	}
}

// The daemon under its own, packaged unit (ProtectSystem=strict,
// PrivateTmp=, PrivateMounts=, PrivateDevices=, ProtectKernelTunables=,
// PrivateUsers=, no capability), reporting to the real API server, in a
// real systemd whose mounts are shared as on a booted host: a pod's volume
// mounted by the node (the kubelet, in PID 1's mount namespace) after the
// daemon started propagates into the daemon's own namespace, and the
// daemon reads /sys/class/block/<dev>/dev and its /proc/self/mountinfo
// through the sandbox. The kubelet root is not moved: the namespace's
// /var is its own, so the volume is mounted at the real
// /var/lib/kubelet/pods/<uid>/volumes/... there.
//   - a real ext4 on a loop device (errors=remount-ro) mounted there,
//     remounted read-only by the kernel (trigger_fs_error): a
//     PodVolumeReadOnly Event on the Node naming the device and the mount,
//     counted under rule="PodVolumeReadOnly"; ReadonlyFilesystem stays
//     False on the Node;
//   - the same on a loop device mounted at /srv/node-<tok>: ReadonlyFilesystem
//     True on the Node with the kernel's line.
//
// The ReadonlyFilesystem rule is the built-in one with its ext4 device
// restricted to the test's two loop devices: other tests' kernel lines of
// other devices (the loop device test beside it) are read by the daemon
// too, and would set the condition.
func TestPodVolumeReadOnlyUnderTheShippedUnit(t *testing.T) {
	podVolumeReadOnlyUnderTheShippedUnit(t, false, false)
}

// The same, the node's /var/lib/kubelet a symbolic link to /data/kubelet
// (the kubelet's volumes mounted at /data/kubelet/pods/..., as the kernel
// writes the mount point): the daemon, at host_root "/" under the unit's
// seccomp filter (@system-service), ProtectProc=invisible and
// PrivateUsers=, resolves its pods directory with openat2 and
// /proc/self/fd (hostio.MountPath) and finds the volume a pod's. openat2
// refused by the filter, the pods directory stays /var/lib/kubelet/pods,
// and the volume's remount sets ReadonlyFilesystem instead.
func TestPodVolumeReadOnlyUnderTheShippedUnitThroughALinkedKubeletDirectory(t *testing.T) {
	podVolumeReadOnlyUnderTheShippedUnit(t, true, false)
}

// The same, the kubelet run with --root-dir=/data/kubelet and no link
// from /var/lib/kubelet (its volumes mounted at /data/kubelet/pods/...):
// the configuration's kubelet_root_dir = "/data/kubelet" makes the volume's
// remount the PodVolumeReadOnly Event, ReadonlyFilesystem False. Without
// the key, the line is the node's (TestPodVolumeReadOnlyUnderAConfiguredKubeletRootDir).
func TestPodVolumeReadOnlyUnderTheShippedUnitWithAKubeletRootDir(t *testing.T) {
	podVolumeReadOnlyUnderTheShippedUnit(t, false, true)
}

// podVolumeReadOnlyUnderTheShippedUnit: linked, /var/lib/kubelet a link to
// /data/kubelet; rootDir, the kubelet's directory /data/kubelet named by
// kubelet_root_dir, no link.
func podVolumeReadOnlyUnderTheShippedUnit(t *testing.T, linked, rootDir bool) {
	harness.HoldExt4Errors(t) // the kernel's read-only remounts carry no token
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	for _, p := range []string{"/usr/sbin/losetup", "/usr/sbin/mkfs.ext4", "/usr/bin/nsenter", "/usr/bin/mknod"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing (apt install mount e2fsprogs util-linux coreutils)", p)
		}
	}
	api := apiServer(t)
	tok := harness.Token()
	node := "podvolume-" + tok
	registerNode(t, api, node)
	s, _ := shippedUnitSystemd(t, "autopilot-health-podvolume-"+tok+"-", nil, false,
		func(o *harness.Options) { o.SharedMounts = true })
	ctx := context.Background()
	// An ext4 on a fresh loop device, its node made in the namespace's
	// /dev (a tmpfs of its own): the device's name.
	loopExt4 := func(name string) string {
		t.Helper()
		dev := filepath.Base(ext4Loop(t, filepath.Join(s.Dir, name+".img")))
		majMin, err := os.ReadFile("/sys/class/block/" + dev + "/dev")
		if err != nil {
			t.Fatal(err)
		}
		maj, min, _ := strings.Cut(strings.TrimSpace(string(majMin)), ":")
		runTool(t, "mknod", "-m", "600", s.Root("/dev/"+dev), "b", maj, min)
		return dev
	}
	// mount mounts dev at mp in the namespace's PID 1 mount namespace, as
	// the kubelet mounts a volume on the node.
	mount := func(dev, mp string) {
		t.Helper()
		if err := os.MkdirAll(s.Root(mp), 0o755); err != nil {
			t.Fatal(err)
		}
		runTool(t, "nsenter", "--target", fmt.Sprint(s.PID), "--mount", "--root", "--wd", "--",
			"mount", "-o", "errors=remount-ro", "/dev/"+dev, mp)
	}
	podDev, nodeDev := loopExt4("pod"), loopExt4("node")

	if linked || rootDir {
		if err := os.MkdirAll(s.Root("/data/kubelet/pods"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if linked {
		if err := os.RemoveAll(s.Root("/var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(s.Root("/var/lib"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/data/kubelet", s.Root("/var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
	}
	etc := installNodeKubeconfig(t, s, api, node)
	var c strings.Builder
	port := freeTCPPort(t)
	fmt.Fprintf(&c, "node_name = %q\nrole = \"worker\"\ngpu = \"false\"\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n[runner]\nfirst_run_spread = \"0s\"\n"+
		"[kubernetes]\nkubeconfig = \"/etc/autopilot-health/kubeconfig\"\n", node, port)
	if rootDir {
		// A top-level key: above the first header.
		rest := c.String()
		c.Reset()
		c.WriteString("kubelet_root_dir = \"/data/kubelet\"\n" + rest)
	}
	c.WriteString(checksOffBut())
	var disable []string
	var rofs kmsg.Rule
	for _, r := range kmsg.DefaultRules {
		switch r.Name {
		case "ReadonlyFilesystem":
			rofs = r
		case "PodVolumeReadOnly":
		default:
			disable = append(disable, fmt.Sprintf("%q", r.Name))
		}
	}
	ext4 := `(?P<dev>\S+)`
	if strings.Count(rofs.Pattern, ext4) == 0 {
		t.Fatalf("the built-in ReadonlyFilesystem pattern has no %s: %s", ext4, rofs.Pattern)
	}
	pattern := strings.ReplaceAll(rofs.Pattern, ext4, "(?P<dev>"+podDev+"|"+nodeDev+")")
	fmt.Fprintf(&c, "[kmsg]\nfrom_boot_start = false\ndisable = [%s]\n[[kmsg.rules]]\nname = \"ReadonlyFilesystem\"\nkind = \"perm\"\ncondition = \"ReadonlyFilesystem\"\nreason = %q\npattern = '%s'\n",
		strings.Join(disable, ", "), rofs.Reason, pattern)
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
	mainPID, _ := sp["MainPID"].Value().(uint32)
	if m := sandboxInEffect(s, mainPID); len(m) > 0 {
		t.Errorf("the unit's sandbox is not in effect on the daemon: missing %s", strings.Join(m, ", "))
	}
	eventually(t, 15*time.Second, "the kernel log reader up", func() (bool, string) {
		v, last := metricOf(t, port, "autopilot_health_kmsg_reader_up")
		return v == 1, last
	})
	waitNode(t, api, node, "ReadonlyFilesystem False", func(n *corev1.Node) bool {
		c := cond(n, "ReadonlyFilesystem")
		return c != nil && c.Status == corev1.ConditionFalse
	})

	// The pod's volume, mounted after the daemon started.
	podMount := "/var/lib/kubelet/pods/6f1c5a8e-" + tok + "/volumes/kubernetes.io~csi/pvc-" + tok + "/mount"
	if linked || rootDir {
		podMount = "/data/kubelet" + strings.TrimPrefix(podMount, "/var/lib/kubelet")
	}
	mount(podDev, podMount)
	// Propagated into the daemon's own mount namespace (PrivateMounts=).
	dir, _, err := hostStatus(s, mainPID)
	if err != nil {
		t.Fatal(err)
	}
	if mi, err := os.ReadFile(filepath.Join(dir, "mountinfo")); err != nil || !strings.Contains(string(mi), " "+podMount+" ") {
		t.Fatalf("the pod's volume is not in the daemon's mount table (%v):\n%s", err, mi)
	}
	if err := os.WriteFile("/sys/fs/ext4/"+podDev+"/trigger_fs_error", []byte("1"), 0); err != nil {
		t.Fatalf("trigger_fs_error: %v", err)
	}
	line := "EXT4-fs (" + podDev + "): Remounting filesystem read-only"
	var ev corev1.Event
	eventually(t, 30*time.Second, "the PodVolumeReadOnly Event on the Node", func() (bool, string) {
		evs, err := api.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", node).String()})
		if err != nil {
			return false, err.Error()
		}
		var reasons []string
		for _, e := range evs.Items {
			if e.Reason == report.EventPodVolumeReadOnly {
				ev = e
				return true, ""
			}
			reasons = append(reasons, e.Reason)
		}
		return false, fmt.Sprint(reasons)
	})
	if !strings.HasPrefix(ev.Message, line+" (the device "+podDev+", ") || !strings.Contains(ev.Message, "directories: "+podMount+"; a pod's volume") {
		t.Errorf("the Event's message %q, want %q, the device and its mount %s", ev.Message, line, podMount)
	}
	if v, last := metricOf(t, port, `autopilot_health_kmsg_matches_total{rule="PodVolumeReadOnly"}`); v != 1 {
		t.Errorf("the pod volume's line counted: %s, want 1", last)
	}
	if v, last := metricOf(t, port, `autopilot_health_kmsg_matches_total{rule="ReadonlyFilesystem"}`); v != 0 {
		t.Errorf("ReadonlyFilesystem counted: %s, want 0", last)
	}
	n, err := api.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := cond(n, "ReadonlyFilesystem"); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("ReadonlyFilesystem on the Node after the pod volume's remount: %+v, want False", c)
	}

	// The node's filesystem, mounted after the start too: the condition.
	mount(nodeDev, "/srv/node-"+tok)
	if err := os.WriteFile("/sys/fs/ext4/"+nodeDev+"/trigger_fs_error", []byte("1"), 0); err != nil {
		t.Fatalf("trigger_fs_error: %v", err)
	}
	want := "EXT4-fs (" + nodeDev + "): Remounting filesystem read-only"
	waitNode(t, api, node, "ReadonlyFilesystem True", func(n *corev1.Node) bool {
		c := cond(n, "ReadonlyFilesystem")
		return c != nil && c.Status == corev1.ConditionTrue && c.Message == want
	})
}

// runTool runs a tool, failing t with its output where it fails; its
// output, trimmed.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// ext4Loop makes a 16 MiB ext4 image at img on a fresh loop device,
// detached at the test's end, and returns the device (/dev/loopN).
func ext4Loop(t *testing.T, img string) string {
	t.Helper()
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	runTool(t, "mkfs.ext4", "-q", img)
	loop := runTool(t, "losetup", "--find", "--show", img)
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	return loop
}

// mountExt4Loop mounts an ext4Loop of img at mp (made first) with mount's
// opts, unmounted at the test's end, and returns the device's name (loopN).
func mountExt4Loop(t *testing.T, img, mp string, opts ...string) string {
	t.Helper()
	loop := ext4Loop(t, img)
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	runTool(t, "mount", append(opts, loop, mp)...)
	t.Cleanup(func() { exec.Command("umount", mp).Run() })
	return filepath.Base(loop)
}

// requireLoopTools fails t where the tools that make a real ext4 on a loop
// device are missing (.ci/run installs them).
func requireLoopTools(t *testing.T) {
	t.Helper()
	for _, p := range []string{"/usr/sbin/losetup", "/usr/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing (apt install mount e2fsprogs)", p)
		}
	}
}
