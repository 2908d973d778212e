//go:build integration

package tests

import (
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// kernelLine is one line as the kernel or a driver prints it: its level
// (KERN_EMERG 0 to KERN_DEBUG 7), its whole text with the prefix the
// printing function adds ("EXT4-fs (sda1): ", "nvme nvme0: ",
// "device-mapper: verity: ", "{1}[Hardware Error]: ", "EDAC MC0: ",
// "ata1.00: ", "NVRM: "), and where its format comes from.
type kernelLine struct {
	level  int
	text   string
	source string
}

// kmsgNodeRoot is a host root for a daemon reading the real kernel log on
// a GPU node as it detects one (gpu = "auto"): the PCI tree of the
// checks' one-GPU fixture (an H100 at 0000:3b:00.0, vendor 0x10de, class
// 0x0302), /proc and /sys/class the machine's own (the pod volume lookup
// reads /proc/self/mountinfo and /sys/class/block/<dev>/dev), /dev/kmsg the
// real device (character 1:11). It returns the root.
func kmsgNodeRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "knode")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if out, err := exec.Command("cp", "-a", "../checks/testdata/roots/pci-1-gpu/sys", root+"/").CombinedOutput(); err != nil {
		t.Fatalf("copying the PCI fixture: %v: %s", err, out)
	}
	for link, target := range map[string]string{"proc": "/proc", "sys/class": "/sys/class"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(root, "dev/kmsg"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 11))); err != nil {
		t.Fatalf("mknod dev/kmsg: %v", err)
	}
	return root
}

// Every kernel log condition and event reason of the catalog, from a line
// written to the real /dev/kmsg in the very text the kernel or driver
// prints (prefix included, the format cited per line), through one daemon
// (GPU detected from the PCI tree, as on a node; the pod volume a real
// ext4 on a loop device mounted under the kubelet's pods directory) and its
// reporter with the node's own credentials (NodeRestriction on), to the
// real kube-apiserver: each condition True on the Node with its catalog
// reason and the line as its message, each event a Warning about the Node
// with its reason and the line. Lines carry the test's token, or a random
// number where the format has no room for one, so another test's lines in
// the same kernel log are told apart.
func TestKmsgEveryCatalogLineFromTheRealDeviceToTheNode(t *testing.T) {
	requireLoopTools(t)
	harness.HoldExt4Errors(t) // the kernel's read-only remounts carry no token
	s := apiServer(t)
	tok := harness.Token()
	node := "node-kmsg-catalog-" + tok
	registerNode(t, s, node)
	_, kc := nodeClient(t, s, node)

	root := kmsgNodeRoot(t)
	podUID := "6f1c5a8e-" + tok
	podMount := filepath.Join(root, "var/lib/kubelet/pods", podUID, "volumes/kubernetes.io~csi/pvc-"+tok, "mount")
	loop := mountExt4Loop(t, filepath.Join(t.TempDir(), "pvc.img"), podMount)

	// The kubeconfig and the files it names are read under the host root.
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(s.Dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(s.Dir, filepath.Join(root, s.Dir)); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	cfg.NodeName, cfg.Role, cfg.GPU = node, "worker", "auto"
	cfg.HostRoot = root
	cfg.StateDir = t.TempDir()
	cfg.Kubernetes.Kubeconfig = kc
	cfg.Runner.FirstRunSpread = config.Duration{}
	cfg.Kmsg.KernelOnly = false    // written lines have facility user
	cfg.Kmsg.FromBootStart = false // earlier tests' lines stay unread
	// KernelDeadlock's message is to be this test's line: a hung-task line
	// has room for a token only in its task's name, and with the default
	// critical tasks another test binary's "INFO: task kubelet:N ..." (or
	// the kernel's own) would set it as well. Not tok itself: TaskHung's
	// line below names tok, and is to be an event alone.
	critical := "k" + tok
	cfg.Kmsg.CriticalTasks = []string{critical}
	noHostSystemd(cfg)
	d, ev := startKmsgDaemon(t, cfg, tok)
	// GpuFallenOffBus is evaluated (False) only on a node detected as a
	// GPU node; the reader is at the log's end once they are False.
	waitFor(t, d.Store(), nil, 15*time.Second, "the kernel conditions False, GpuFallenOffBus among them", func() bool {
		a, ok1 := d.Store().Get("GpuFallenOffBus")
		b, ok2 := d.Store().Get("ReadonlyFilesystem")
		return ok1 && ok2 && a.Status == report.StatusFalse && b.Status == report.StatusFalse
	})

	n := func() int { return 100 + mathrand.IntN(900) } // a number for a line with no room for the token
	disk := "sd" + tok
	gpuXid := kernelLine{3, "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
		"open-gpu-kernel-modules kernel_rc.c krcReportXid: \"NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s\\n\""}
	// A line per condition, the one its message names.
	conditions := map[string]kernelLine{
		"ReadonlyFilesystem": {2, "EXT4-fs (" + disk + "1): Remounting filesystem read-only",
			"fs/ext4/super.c ext4_handle_error: ext4_msg(sb, KERN_CRIT, ...), \"%sEXT4-fs (%s): %pV\\n\""},
		"KernelDeadlock": {3, fmt.Sprintf("INFO: task %s:%d blocked for more than 122 seconds.", critical, 3999000+n()),
			"kernel/hung_task.c check_hung_task: pr_err(\"INFO: task %s:%d blocked for more than %ld seconds.\\n\")"},
		"VerityCorruption": {3, fmt.Sprintf("device-mapper: verity: 253:%d: data block 7421 is corrupted", n()),
			"drivers/md/dm-verity-target.c verity_handle_err: DMERR_LIMIT(\"%s: %s block %llu is corrupted\"), DM_MSG_PREFIX \"verity\""},
		"CperHardwareErrorFatal": {0, fmt.Sprintf("{%d}[Hardware Error]: event severity: fatal", n()),
			"drivers/acpi/apei/ghes.c __ghes_panic: __ghes_print_estatus(KERN_EMERG, ...), \"%s{%u}\" HW_ERR; drivers/firmware/efi/cper.c cper_estatus_print \"%sevent severity: %s\\n\""},
		"GpuFallenOffBus": {3, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
			"open-gpu-kernel-modules osapi.c: NV_DEV_PRINTF(NV_DBG_ERRORS, nv, \"GPU has fallen off the bus.\\n\"), \"NVRM: GPU \" NV_PCI_DEV_FMT \": \""},
	}
	// A line per event reason, the one its Event carries.
	events := map[string]kernelLine{
		"TaskHung": {3, "INFO: task " + tok + ":4242 blocked for more than 122 seconds.", "kernel/hung_task.c check_hung_task"},
		"Ext4Error": {2, "EXT4-fs error (device " + disk + "2): ext4_lookup:1855: inode #2: comm ls: iget: checksum invalid",
			"fs/ext4/super.c __ext4_error_inode: \"EXT4-fs error (device %s): %s:%d: inode #%lu: comm %s: %pV\\n\""},
		"Ext4Warning": {4, "EXT4-fs warning (device " + disk + "3): ext4_dx_add_entry:2516: Directory (ino: 1234) index full, reach max htree level :2",
			"fs/ext4/super.c __ext4_warning: \"EXT4-fs warning (device %s): %s:%d: %pV\\n\""},
		"IOError": {3, "Buffer I/O error on dev " + disk + "4, logical block 0, async page read",
			"fs/buffer.c buffer_io_error: \"Buffer I/O error on dev %pg, logical block %llu%s\\n\""},
		"BlockIOError": {3, "I/O error, dev " + disk + ", sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2",
			"block/blk-mq.c blk_print_req_error: \"%s error, dev %s, sector %llu op 0x%x:(%s) flags 0x%x phys_seg %u prio class %u\\n\""},
		"NvmeError": {4, fmt.Sprintf("nvme nvme%d: I/O tag 12 (100c) opcode 0x2 (Read) QID 4 timeout, aborting req_op:READ(0) size:4096", n()),
			"drivers/nvme/host/pci.c nvme_timeout: dev_warn(ctrl.device, \"I/O tag %d (%04x) opcode %#x (%s) QID %d timeout, aborting req_op:%s(%u) size:%u\\n\")"},
		"AtaError": {3, fmt.Sprintf("ata%d.00: exception Emask 0x0 SAct 0x800000 SErr 0x0 action 0x0", n()),
			"drivers/ata/libata-eh.c ata_eh_link_report: ata_dev_err(\"exception Emask 0x%x SAct 0x%x SErr 0x%x action 0x%x%s%s\\n\"), \"ata%u.%02u: \""},
		"NvidiaXidError": {4, "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=" + tok + ", Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
			"open-gpu-kernel-modules kernel_rc.c krcReportXid"},
		"MemoryReadError": {4, fmt.Sprintf("EDAC MC%d: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x12345 offset:0x0 grain:32 syndrome:0x0 - err_code:0x0000:0x009f)", n()),
			"drivers/edac/edac_mc.c edac_ce_error: edac_mc_printk(mci, KERN_WARNING, \"%d CE %s%son %s (%s page:0x%lx offset:0x%lx grain:%ld syndrome:0x%lx%s%s)\\n\"), \"EDAC MC%d: \""},
		"UnregisterNetDevice": {0, "unregister_netdevice: waiting for " + tok + " to become free. Usage count = 2",
			"net/core/dev.c netdev_wait_allrefs_any: pr_emerg(\"unregister_netdevice: waiting for %s to become free. Usage count = %d\\n\")"},
		"CperHardwareErrorCorrected": {4, fmt.Sprintf("{%d}[Hardware Error]: event severity: corrected", n()),
			"drivers/acpi/apei/ghes.c __ghes_print_estatus (KERN_WARNING for corrected), cper.c cper_estatus_print"},
		"CperHardwareErrorRecoverable": {3, fmt.Sprintf("{%d}[Hardware Error]: event severity: recoverable", n()),
			"drivers/acpi/apei/ghes.c __ghes_print_estatus (KERN_ERR above corrected), cper.c cper_estatus_print"},
		report.EventPodVolumeReadOnly: {2, "EXT4-fs (" + loop + "): Remounting filesystem read-only",
			"fs/ext4/super.c ext4_handle_error, on a loop device mounted under <host_root>/var/lib/kubelet/pods"},
	}
	// The table covers the catalog: a new kernel log row needs its line here.
	for _, c := range report.Conditions {
		if _, ok := conditions[c.Type]; c.Source == report.SourceKmsg && !ok {
			t.Errorf("condition %s of the kernel log monitor has no line in this test", c.Type)
		}
	}
	for _, e := range report.Events {
		if _, ok := events[e.Reason]; e.Source == report.SourceKmsg && !ok {
			t.Errorf("event %s of the kernel log monitor has no line in this test", e.Reason)
		}
	}

	// The driver prints the Xid first, then its own line; the condition
	// keeps the last.
	lines := []kernelLine{gpuXid}
	for _, c := range report.Conditions {
		if l, ok := conditions[c.Type]; ok {
			lines = append(lines, l)
		}
	}
	for _, e := range report.Events {
		if l, ok := events[e.Reason]; ok {
			lines = append(lines, l)
		}
	}
	start := time.Now()
	for _, l := range lines {
		if err := harness.WriteKmsgLevel(l.level, l.text); err != nil {
			t.Fatalf("writing %q: %v", l.text, err)
		}
	}

	missing := func(n *corev1.Node, evs []corev1.Event) []string {
		var out []string
		for ty, l := range conditions {
			d, _ := report.Lookup(ty)
			c := cond(n, ty)
			if c == nil || c.Status != corev1.ConditionTrue || c.Reason != string(d.ProblemReasons[0]) || c.Message != l.text {
				out = append(out, fmt.Sprintf("condition %s (%s)", ty, l.source))
			}
		}
		for reason, l := range events {
			found := false
			for _, e := range evs {
				found = found || (e.Reason == reason && strings.HasPrefix(e.Message, l.text))
			}
			if !found {
				out = append(out, fmt.Sprintf("event %s (%s)", reason, l.source))
			}
		}
		return out
	}
	var (
		got  *corev1.Node
		evs  []corev1.Event
		left []string
	)
	for deadline := time.Now().Add(30 * time.Second); ; {
		n, err1 := s.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		l, err2 := s.Admin.CoreV1().Events(kube.EventNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		if err1 == nil && err2 == nil {
			got, evs = n, l.Items
			if left = missing(got, evs); len(left) == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			var have []string
			for _, e := range evs {
				have = append(have, e.Reason+": "+e.Message)
			}
			t.Fatalf("not on the Node after 30 s: %s\nconditions: %v\nevents: %s\nstore: %+v", strings.Join(left, "; "), conditionsOf(got), strings.Join(have, " | "), d.Store().All())
		}
		time.Sleep(50 * time.Millisecond) // polling interval of an awaited condition
	}
	t.Logf("%d lines written to visible on the Node: %s", len(lines), time.Since(start).Round(time.Millisecond))
	readyIntact(t, got)
	for _, e := range evs {
		if _, ok := events[e.Reason]; !ok {
			continue
		}
		o := e.InvolvedObject
		if e.Type != corev1.EventTypeWarning || o.Kind != "Node" || o.Name != node || string(o.UID) != node || e.Source.Component != "autopilot-health" {
			t.Errorf("%s: type %s, involvedObject %+v, source %+v", e.Reason, e.Type, o, e.Source)
		}
	}
	// The pod's volume is an event naming its mount, not the condition.
	for _, e := range evs {
		if e.Reason == report.EventPodVolumeReadOnly && strings.HasPrefix(e.Message, events[report.EventPodVolumeReadOnly].text) && !strings.Contains(e.Message, podMount) {
			t.Errorf("PodVolumeReadOnly does not name the mount %s: %s", podMount, e.Message)
		}
	}

	// The other forms the same conditions and events take, each read into
	// the daemon's state (a condition's message change alone reaches the
	// Node only with the next heartbeat).
	for _, v := range []struct {
		cond string // "" for an event
		line kernelLine
	}{
		{"GpuFallenOffBus", kernelLine{3, "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.",
			"open-gpu-kernel-modules osapi.c RmInitAdapter: one nv_printf of three lines, one record"}},
		{"CperHardwareErrorFatal", kernelLine{6, "[Hardware Error]: event severity: fatal",
			"drivers/acpi/apei/bert.c bert_print_all: cper_estatus_print(KERN_INFO HW_ERR, ...), a previous boot's fatal error"}},
		{"VerityCorruption", kernelLine{3, fmt.Sprintf("device-mapper: verity: 7:%d: metadata block 12 is corrupted", n()), "dm-verity-target.c, a hash block"}},
		{"", kernelLine{4, "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 43, pid=4242, name=" + tok + ", Ch 00000008",
			"open-gpu-kernel-modules kernel_rc.c krcReportXid, a MIG GPU instance and compute instance"}},
	} {
		before := ev.count()
		if err := harness.WriteKmsgLevel(v.line.level, v.line.text); err != nil {
			t.Fatal(err)
		}
		waitFor(t, d.Store(), ev, 10*time.Second, v.line.source, func() bool {
			if v.cond == "" {
				return ev.count() > before
			}
			c, _ := d.Store().Get(v.cond)
			return c.Status == report.StatusTrue && c.Message == report.CapMessage(v.line.text) // the store writes the newline \x0a
		})
	}
}
