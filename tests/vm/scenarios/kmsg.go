package scenarios

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const awaitKmsg = 40 * time.Second

// ext4RemountRO: an ext4 mounted errors=remount-ro hits an error
// (trigger_fs_error): the kernel's "EXT4-fs error" line is an Ext4Error
// event (problem_counter, and the daemon's log: its first event of that
// reason is logged at once), and its remount line sets ReadonlyFilesystem
// True. On 6.1 the mount flags still say rw afterwards; writes fail with
// EROFS.
func ext4RemountRO(g *Guest) error {
	if _, err := g.Await("ReadonlyFilesystem", "False", "FilesystemIsNotReadOnly", awaitKmsg); err != nil {
		return err
	}
	dev, mnt, cleanup, err := g.Ext4("ext4err", 16)
	if err != nil {
		return err
	}
	defer cleanup()
	// The kernel logs what is written as the error's text:
	// "EXT4-fs error (device loop0): trigger_test_error:NNN: comm init: <text>".
	const text = "vmtest ext4 error"
	if err := os.WriteFile("/sys/fs/ext4/"+filepath.Base(dev)+"/trigger_fs_error", []byte(text), 0); err != nil {
		return fmt.Errorf("trigger_fs_error: %w", err)
	}
	c, err := g.Await("ReadonlyFilesystem", "True", "FilesystemIsReadOnly", awaitKmsg)
	if err != nil {
		return err
	}
	if err := MessageHas(c, fmt.Sprintf("EXT4-fs (%s): Remounting filesystem read-only", filepath.Base(dev))); err != nil {
		return err
	}
	if err := os.WriteFile(mnt+"/after", []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		return fmt.Errorf("a write after the error: %v, want EROFS", err)
	}
	if _, err := g.AwaitMetric(1, awaitKmsg, "problem_counter", "reason", "Ext4Error"); err != nil {
		return fmt.Errorf("the kernel's EXT4-fs error line is no Ext4Error event: %w", err)
	}
	event := regexp.MustCompile(fmt.Sprintf(`msg=event .*reason=Ext4Error message="EXT4-fs error \(device %s\): [^"\n]*: %s"`,
		regexp.QuoteMeta(filepath.Base(dev)), regexp.QuoteMeta(text)))
	line, err := g.AwaitLog(event, awaitKmsg)
	if err != nil {
		return err
	}
	g.Logf("the daemon's log: %s", line)
	return nil
}

// remountBeforeStart runs before the daemon starts (kmsg_before_start's
// BeforeDaemon): an ext4 mounted errors=remount-ro hits an error, and the
// kernel's remount line is kept for kmsgBeforeStart.
func remountBeforeStart(g *Guest) error {
	k, err := OpenKmsg()
	if err != nil {
		return err
	}
	defer k.Close()
	dev, _, cleanup, err := g.Ext4("early", 16)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := os.WriteFile("/sys/fs/ext4/"+filepath.Base(dev)+"/trigger_fs_error", []byte("vmtest before the daemon"), 0); err != nil {
		return fmt.Errorf("trigger_fs_error: %w", err)
	}
	line := fmt.Sprintf("EXT4-fs (%s): Remounting filesystem read-only", filepath.Base(dev))
	r, err := k.Await(regexp.MustCompile("^"+regexp.QuoteMeta(line)+"$"), awaitKmsg)
	if err != nil {
		return err
	}
	at, err := r.Wall()
	if err != nil {
		return err
	}
	earlyRemount.line, earlyRemount.at = line, at
	g.Logf("before the daemon: %q at %s", r.Raw, at.Format(time.RFC3339Nano))
	// The gap between the line and the daemon's start is what tells the
	// line's time from the start's: the kernel's timestamps are its
	// local_clock, not CLOCK_MONOTONIC, and under TCG the two were 135 ms
	// or more apart 12 s after boot (a line dated as the daemon dates it
	// fell after the daemon's exec, which came after the line); 2 s
	// apart, that does not decide.
	time.Sleep(2 * time.Second)
	return nil
}

// earlyRemount is the kernel's line remountBeforeStart caused, and its
// wall time.
var earlyRemount struct {
	line string
	at   time.Time
}

// kmsgBeforeStart: a kernel line logged before the daemon started (an
// early-boot remount) is read at the start (the records of this boot
// still in the ring buffer), sets ReadonlyFilesystem True with the line,
// and the condition's lastTransitionTime is the line's time, not the
// daemon's start.
func kmsgBeforeStart(g *Guest) error {
	if earlyRemount.at.IsZero() {
		return errors.New("no kernel line from before the daemon's start (its BeforeDaemon did not run)")
	}
	c, err := g.Await("ReadonlyFilesystem", "True", "FilesystemIsReadOnly", awaitKmsg)
	if err != nil {
		return err
	}
	if err := MessageHas(c, earlyRemount.line); err != nil {
		return err
	}
	t := c.LastTransitionTime
	g.Logf("the line at %s, the daemon started at %s, lastTransitionTime %s",
		earlyRemount.at.Format(time.RFC3339Nano), g.started.Format(time.RFC3339Nano), t.Format(time.RFC3339Nano))
	// The line came 2 s or more before the daemon's exec
	// (remountBeforeStart).
	if g.started.Sub(t) < time.Second {
		return fmt.Errorf("%s: lastTransitionTime %s is not a second or more before the daemon's start (%s): dated by its reading, not by the kernel's line (%s)",
			c, t.Format(time.RFC3339Nano), g.started.Format(time.RFC3339Nano), earlyRemount.at.Format(time.RFC3339Nano))
	}
	// Both read the wall clock less the kernel time since the line.
	if d := t.Sub(earlyRemount.at).Abs(); d > 250*time.Millisecond {
		return fmt.Errorf("%s: lastTransitionTime %s is %v from the kernel's line's time %s", c, t.Format(time.RFC3339Nano), d, earlyRemount.at.Format(time.RFC3339Nano))
	}
	return nil
}

const hungWriterArg = "vmtest-hung-writer"

func init() {
	if len(os.Args) > 1 && os.Args[1] == hungWriterArg {
		// Keep main() on the main thread (thread ID = PID): the kernel
		// reports the blocked thread by its ID and name.
		runtime.LockOSThread()
	}
}

// hungWriter (a child of /init) names itself, joins the cgroup its third
// argument names (if any), and writes to a file on a frozen filesystem,
// where it blocks in D state until the thaw.
func hungWriter(args []string) {
	name := append([]byte(args[0]), 0)
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0); err != nil {
		os.Exit(2)
	}
	if len(args) > 2 {
		if err := os.WriteFile(args[2]+"/cgroup.procs", []byte("0\n"), 0); err != nil {
			os.Exit(5)
		}
	}
	fd, err := unix.Open(args[1], unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		os.Exit(3)
	}
	if _, err := unix.Write(fd, []byte("state\n")); err != nil {
		os.Exit(4)
	}
	os.Exit(0)
}

const (
	fiFreeze = 0xC0045877 // _IOWR('X', 119, int)
	fiThaw   = 0xC0045878 // _IOWR('X', 120, int)
)

// hungTask: processes blocked on an ext4 frozen with FIFREEZE, with
// hung_task_timeout_secs=1. First, alone, one named kubelet in a cgroup
// named as the kubelet's systemd driver names a pod's container, in a PID
// namespace of its own (a pod's own kubelet, a kind node in a CI pod): a
// TaskHung event whose message
// names that cgroup, KernelDeadlock stays False; one named other than a
// critical task: the same; one named kubelet in the root cgroup (the
// node's): KernelDeadlock True; then one named as QEMU names a vCPU
// thread, "CPU 0/KVM" (a space and a slash in the name): the condition's
// message follows its report. The kernel reports each blocked task again
// every second: what one report did is read once the daemon has handled
// it (handled).
func hungTask(g *Guest) error {
	if _, err := g.Await("KernelDeadlock", "False", "KernelHasNoDeadlock", awaitKmsg); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/kernel/hung_task_warnings", []byte("-1"), 0); err != nil {
		return err
	}
	fz, err := g.freezeExt4("frozen")
	if err != nil {
		return err
	}
	defer fz.thaw()
	k, start := fz.k, fz.hang
	report := func(name string, pid int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`^INFO: task %s:%d blocked for more than \d+ seconds\.$`, regexp.QuoteMeta(name), pid))
	}
	// A pod's own kubelet: its cgroup is under kubepods. The daemon reads
	// it from /proc/<pid>/cgroup as it reads the kernel's line.
	pod, err := podCgroup()
	if err != nil {
		return err
	}
	pid, err := start("kubelet", pod)
	if err != nil {
		return err
	}
	page, err := g.handled(k, report("kubelet", pid))
	if err != nil {
		return err
	}
	if s := ConditionStatus(page, "KernelDeadlock"); s != "False" {
		return fmt.Errorf("after a hung kubelet in a pod's cgroup (%s): KernelDeadlock %s on /metrics, want False", pod, s)
	}
	if n, _ := Metric(page, "problem_counter", "reason", "TaskHung"); n < 1 {
		return fmt.Errorf("after a hung kubelet in a pod's cgroup: problem_counter{reason=TaskHung} %v, want a TaskHung event", n)
	}
	if n, _ := Metric(page, "autopilot_health_kmsg_matches_total", "rule", "KernelDeadlock"); n != 0 {
		return fmt.Errorf("a hung kubelet in a pod's cgroup matched KernelDeadlock %v times", n)
	}
	// The first TaskHung event of the daemon is logged at once: its
	// message names the cgroup the daemon read.
	event := regexp.MustCompile(fmt.Sprintf(`INFO: task kubelet:%d blocked for more than \d+ seconds\. \(the task is in a pod's cgroup, %s: a pod's own kubelet, not the node's, so not KernelDeadlock\)`,
		pid, regexp.QuoteMeta(strings.TrimPrefix(pod, cgroupRoot))))
	if b, err := os.ReadFile(DaemonLog); err != nil || !event.Match(b) {
		return fmt.Errorf("the daemon's log has no TaskHung event matching %s (%v)", event, err)
	}
	if pid, err = start("sidecar"); err != nil {
		return err
	}
	if page, err = g.handled(k, report("sidecar", pid)); err != nil {
		return err
	}
	if s := ConditionStatus(page, "KernelDeadlock"); s != "False" {
		return fmt.Errorf("after a hung task named sidecar (a TaskHung event): KernelDeadlock %s on /metrics, want False", s)
	}
	pid, err = start("kubelet")
	if err != nil {
		return err
	}
	c, err := g.Await("KernelDeadlock", "True", "CriticalTaskHung", awaitKmsg)
	if err != nil {
		return err
	}
	// The kernel reports the task again every second (1 s, then 2 s...)
	// and the condition's message follows the last report: the state read
	// may be a report later than the first.
	if want := report("kubelet", pid); !want.MatchString(c.Message) {
		return fmt.Errorf("%s: message is not %s", c, want)
	}
	if pid, err = start("CPU 0/KVM"); err != nil {
		return err
	}
	want := report("CPU 0/KVM", pid)
	deadline := time.Now().Add(awaitKmsg)
	for {
		st, err := g.State()
		if err == nil && st["KernelDeadlock"].Status == "True" && want.MatchString(st["KernelDeadlock"].Message) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting %v for KernelDeadlock's message to match %s: the state file shows %s (%v)", awaitKmsg, want, st["KernelDeadlock"], err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// frozenExt4 is an ext4 of its own frozen with FIFREEZE, with
// kernel.hung_task_timeout_secs 1 and the kernel log opened before the
// freeze (k): a task started by hang blocks writing to it, in D state,
// and the kernel reports it every second. thaw thaws it, waits for the
// tasks, and puts back the sysctl (0: no reports) and the filesystem.
type frozenExt4 struct {
	g     *Guest
	mnt   string
	k     *Kmsg
	tasks []*exec.Cmd
	undo  []func() // in the order done; thaw undoes them last first
}

// freezeExt4 makes name's ext4 (16 MiB) and freezes it; on an error what
// it did is undone.
func (g *Guest) freezeExt4(name string) (_ *frozenExt4, err error) {
	f := &frozenExt4{g: g}
	defer func() {
		if err != nil {
			f.thaw()
		}
	}()
	_, mnt, cleanup, err := g.Ext4(name, 16)
	if err != nil {
		return nil, err
	}
	f.mnt = mnt
	f.undo = append(f.undo, cleanup)
	if err := os.WriteFile("/proc/sys/kernel/hung_task_timeout_secs", []byte("1"), 0); err != nil {
		return nil, err
	}
	f.undo = append(f.undo, func() { os.WriteFile("/proc/sys/kernel/hung_task_timeout_secs", []byte("0"), 0) })
	dfd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f.undo = append(f.undo, func() { unix.Close(dfd) })
	if f.k, err = OpenKmsg(); err != nil {
		return nil, err
	}
	f.undo = append(f.undo, f.k.Close)
	if err := unix.IoctlSetInt(dfd, fiFreeze, 0); err != nil {
		return nil, fmt.Errorf("FIFREEZE: %w", err)
	}
	f.undo = append(f.undo, func() {
		if err := unix.IoctlSetInt(dfd, fiThaw, 0); err != nil {
			g.Logf("FITHAW: %v", err)
		}
		for _, c := range f.tasks {
			_ = c.Wait()
		}
	})
	return f, nil
}

// hang starts a task named name that blocks writing to the frozen ext4,
// in the cgroup directory cgroup names (if any: a pod's process, in a
// PID namespace of its own too), and returns its PID.
func (f *frozenExt4) hang(name string, cgroup ...string) (int, error) {
	file := strings.NewReplacer(" ", "_", "/", "_").Replace(name)
	c := exec.Command("/init", append([]string{hungWriterArg, name, f.mnt + "/" + file + ".state"}, cgroup...)...)
	c.Stdout, c.Stderr = os.Stdout, os.Stderr
	if len(cgroup) > 0 {
		// A pod's process: in its container's PID namespace too.
		c.SysProcAttr = &unix.SysProcAttr{Cloneflags: unix.CLONE_NEWPID}
	}
	if err := c.Start(); err != nil {
		return 0, err
	}
	f.tasks = append(f.tasks, c)
	return c.Process.Pid, nil
}

// thaw undoes what freezeExt4 did, last first: the thaw (and the wait for
// the tasks) before the unmount.
func (f *frozenExt4) thaw() {
	for i := len(f.undo) - 1; i >= 0; i-- {
		f.undo[i]()
	}
	f.undo = nil
}

const cgroupRoot = "/sys/fs/cgroup"

// podCgroup makes a cgroup as the kubelet's systemd driver names a pod's
// container, on cgroup v2 (mounted at /sys/fs/cgroup if it is not), and
// returns its directory.
func podCgroup() (string, error) {
	if _, err := os.Stat(cgroupRoot + "/cgroup.procs"); err != nil {
		if err := unix.Mount("cgroup2", cgroupRoot, "cgroup2", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return "", fmt.Errorf("mount cgroup2 at %s: %w", cgroupRoot, err)
		}
	}
	dir := cgroupRoot + "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e.slice/cri-containerd-4b2d.scope"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// handled waits for the kernel's record whose message matches re (read
// from k, opened before the task that logs it started), then until the
// daemon has handled it: its kernel log cursor (autopilot-health status:
// the last record it took up) is past the record (a hung task's report
// goes on over several records). It returns the daemon's /metrics page
// read after that: what the record did to the conditions and counters.
func (g *Guest) handled(k *Kmsg, re *regexp.Regexp) (string, error) {
	r, err := k.Await(re, awaitKmsg)
	if err != nil {
		return "", err
	}
	f := strings.SplitN(r.Raw, ",", 3)
	if len(f) < 3 {
		return "", fmt.Errorf("kernel record %q: no sequence number", r.Raw)
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return "", fmt.Errorf("kernel record %q: %w", r.Raw, err)
	}
	deadline := time.Now().Add(awaitKmsg)
	var last string
	for {
		var st struct {
			Kmsg *struct {
				LastRecord *struct {
					Seq uint64 `json:"seq"`
				} `json:"lastRecord"`
			} `json:"kmsg"`
		}
		// Exit 1: a condition is True.
		out, err := exec.Command(DaemonPath, "status", "--json").Output()
		if jerr := json.Unmarshal(out, &st); jerr == nil && st.Kmsg != nil && st.Kmsg.LastRecord != nil {
			if st.Kmsg.LastRecord.Seq > seq {
				return g.Metrics()
			}
			last = fmt.Sprintf("the daemon's last record #%d", st.Kmsg.LastRecord.Seq)
		} else {
			last = fmt.Sprintf("autopilot-health status --json: %v %v: %.300s", err, jerr, out)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("waiting %v for the daemon to handle record #%d %q: %s", awaitKmsg, seq, r.Msg, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dmVerity: a dm-verity device over loop devices; a data block corrupted
// under it and read with O_DIRECT fails with EIO, and the kernel's line
// sets VerityCorruption True.
func dmVerity(g *Guest) error {
	if _, err := g.Await("VerityCorruption", "False", "NoVerityCorruption", awaitKmsg); err != nil {
		return err
	}
	v, err := g.Verity("vroot", 1<<20)
	if err != nil {
		return err
	}
	defer v.Close()
	if err := DirectRead(v.Device, 3*4096, 4096); err != nil {
		return fmt.Errorf("reading an intact block: %w", err)
	}
	f, err := os.OpenFile(v.Data, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte("CORRUPTED!"), 5*4096+100)
	f.Close()
	if err != nil {
		return err
	}
	if err := DirectRead(v.Device, 5*4096, 4096); !errors.Is(err, unix.EIO) {
		return fmt.Errorf("reading the corrupted block: %v, want EIO", err)
	}
	c, err := g.Await("VerityCorruption", "True", "VerityBlockCorrupted", awaitKmsg)
	if err != nil {
		return err
	}
	return MessageHas(c, "device-mapper: verity: ", ": data block 5 is corrupted")
}

// dmVerityMetadata: a block of a dm-verity device's hash tree (metadata,
// not data) corrupted under it: the read of a data block it covers fails
// with EIO, and the kernel's "metadata block N is corrupted" line sets
// VerityCorruption True. veritysetup's layout of 256 data blocks of 4 KiB
// with SHA-256 (128 hashes a block): the superblock in hash block 0, the
// top level (one block, checked against the root hash) in block 1, the
// bottom level in blocks 2 and 3; data block 5's hash is in block 2. The
// hash block is corrupted before the device is opened: dm-verity keeps a
// hash block it has verified, and would not read it again.
func dmVerityMetadata(g *Guest) error {
	if _, err := g.Await("VerityCorruption", "False", "NoVerityCorruption", awaitKmsg); err != nil {
		return err
	}
	v, err := g.VerityFormat("vmeta", 1<<20)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(v.Hash, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte("CORRUPTED!"), 2*4096+100)
	f.Close()
	if err != nil {
		return err
	}
	if err := v.Open(); err != nil {
		return err
	}
	defer v.Close()
	if err := DirectRead(v.Device, 5*4096, 4096); !errors.Is(err, unix.EIO) {
		return fmt.Errorf("reading a data block under the corrupted hash block: %v, want EIO", err)
	}
	c, err := g.Await("VerityCorruption", "True", "VerityBlockCorrupted", awaitKmsg)
	if err != nil {
		return err
	}
	return MessageHas(c, "device-mapper: verity: ", ": metadata block 2 is corrupted")
}

// VerityDevice is a dm-verity device made by veritysetup over two loop
// devices (data and hash tree).
type VerityDevice struct {
	Name, Device, Data, Hash, RootHash string
	g                                  *Guest
}

// Verity formats a data image of size bytes (block n filled with byte n)
// and opens it as /dev/mapper/<name>.
func (g *Guest) Verity(name string, size int) (*VerityDevice, error) {
	v, err := g.VerityFormat(name, size)
	if err != nil {
		return nil, err
	}
	return v, v.Open()
}

// VerityFormat writes the data image of Verity and its hash tree, and
// opens nothing: v.Open does.
func (g *Guest) VerityFormat(name string, size int) (*VerityDevice, error) {
	dir := "/tmp/" + name
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	v := &VerityDevice{Name: name, Device: "/dev/mapper/" + name, Data: dir + "/data.img", Hash: dir + "/hash.img", g: g}
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i / 4096)
	}
	if err := os.WriteFile(v.Data, b, 0o644); err != nil {
		return nil, err
	}
	out, err := g.Run("veritysetup", "format", "--data-block-size=4096", "--hash-block-size=4096", v.Data, v.Hash)
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		return nil, errors.New("veritysetup format printed no root hash")
	}
	v.RootHash = m[1]
	return v, nil
}

// Open opens the device (veritysetup open).
func (v *VerityDevice) Open() error {
	_, err := v.g.Run("veritysetup", "open", v.Data, v.Name, v.Hash, v.RootHash)
	return err
}

// Close removes the device.
func (v *VerityDevice) Close() { _, _ = v.g.Run("veritysetup", "close", v.Name) }

// diskIOErrors: scsi_debug's medium-error injection on a SCSI disk (not
// device-mapper, not loop): 4 failed reads are 4 disk I/O errors and
// DisksFailure stays False; the 5th within the window makes it True.
func diskIOErrors(g *Guest) error {
	if err := Modprobe("sd_mod", ""); err != nil {
		return err
	}
	const bad = 4096 // first sector with a medium error
	if err := Modprobe("scsi_debug", fmt.Sprintf("dev_size_mb=8 medium_error_start=%d medium_error_count=16", bad)); err != nil {
		return err
	}
	blocks, err := awaitGlob("/sys/bus/pseudo/drivers/scsi_debug/adapter*/host*/target*/*/block/*", 10*time.Second)
	if err != nil {
		return err
	}
	disk := filepath.Base(blocks[0])
	dev := "/dev/" + disk
	if err := AwaitPath(dev, 5*time.Second); err != nil {
		return err
	}
	// opts bit 1 (SDEBUG_OPT_MEDIUM_ERR): reads of the range fail.
	if err := os.WriteFile("/sys/bus/pseudo/drivers/scsi_debug/opts", []byte("2"), 0); err != nil {
		return err
	}
	// The matches so far (nvme_fabrics_io_errors' lines, not counted):
	// these 4 come on top.
	page, err := g.Metrics()
	if err != nil {
		return err
	}
	base, _ := Metric(page, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError")
	read := func(i int) error {
		// A medium error is BLK_STS_MEDIUM, ENODATA to the reader.
		if err := DirectRead(dev, int64(bad+i)*512, 512); !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("O_DIRECT read of sector %d of %s: %v, want ENODATA (medium error)", bad+i, dev, err)
		}
		return nil
	}
	for i := 0; i < 4; i++ {
		if err := read(i); err != nil {
			return err
		}
	}
	page, err = g.AwaitMetric(base+4, awaitKmsg, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError")
	if err != nil {
		return err
	}
	if n, _ := Metric(page, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError"); n != base+4 {
		return fmt.Errorf("4 failed reads: %v disk I/O errors matched, want %v", n-base, 4)
	}
	if s := ConditionStatus(page, "DisksFailure"); s != "False" {
		return fmt.Errorf("4 disk I/O errors (threshold 5): DisksFailure %s on /metrics, want False", s)
	}
	if err := read(4); err != nil {
		return err
	}
	c, err := g.Await("DisksFailure", "True", "DiskIOErrors", awaitKmsg)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on "+disk); err != nil {
		return err
	}
	if !fabricsFloodedTheRateLimit {
		return nil
	}
	// nvme_fabrics_io_errors' flood made the kernel drop I/O error lines;
	// the first line here was preceded by their count.
	if page, err = g.Metrics(); err != nil {
		return err
	}
	n, _ := Metric(page, "autopilot_health_kernel_suppressed_messages_total", "function", "blk_print_req_error")
	g.Logf("the kernel suppressed %v I/O error lines (blk_print_req_error)", n)
	if n < 1 {
		return fmt.Errorf("after 25 failed reads at once: autopilot_health_kernel_suppressed_messages_total{function=\"blk_print_req_error\"} %v, want 1 or more", n)
	}
	return MessageHas(c, fmt.Sprintf("; the kernel suppressed %d I/O error lines in that time (its rate limit, shared by every device): the count is a lower bound", int(n)))
}

func awaitGlob(pattern string, d time.Duration) ([]string, error) {
	deadline := time.Now().Add(d)
	for {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return m, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("nothing matched %s within %v", pattern, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hungTaskWarnings: kernel.hung_task_warnings, the hung-task reports the
// kernel still prints in this boot, set to 1; a task hung on a frozen ext4
// (named sidecar: no KernelDeadlock) is reported once, and the kernel counts
// the sysctl down to 0 before printing the report (kernel/hung_task.c), so
// no hung kubelet would be logged after it. The daemon reads the sysctl
// again after the report it handles: autopilot_health_kernel_hung_task_warnings
// 0 (before, the sysctl's value as the daemon last read it: the boot's 10
// read at its start, or hung_task's -1 read after its reports) and the
// warning "kernel.hung_task_warnings is 0" in its log. The sysctl is put
// back after.
func hungTaskWarnings(g *Guest) error {
	const sysctl = "/proc/sys/kernel/hung_task_warnings"
	b, err := os.ReadFile(sysctl)
	if err != nil {
		return err
	}
	boot, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%s: %q: %w", sysctl, b, err)
	}
	page, err := g.Metrics()
	if err != nil {
		return err
	}
	if n, ok := Metric(page, "autopilot_health_kernel_hung_task_warnings"); !ok || n != float64(boot) {
		return fmt.Errorf("before: autopilot_health_kernel_hung_task_warnings %v (present %v), want the sysctl's %d", n, ok, boot)
	}
	if err := os.WriteFile(sysctl, []byte("1"), 0); err != nil {
		return err
	}
	defer os.WriteFile(sysctl, []byte(strconv.Itoa(boot)), 0)
	fz, err := g.freezeExt4("frozen1")
	if err != nil {
		return err
	}
	defer fz.thaw()
	pid, err := fz.hang("sidecar")
	if err != nil {
		return err
	}
	page, err = g.handled(fz.k, regexp.MustCompile(fmt.Sprintf(`^INFO: task sidecar:%d blocked for more than \d+ seconds\.$`, pid)))
	if err != nil {
		return err
	}
	if b, err := os.ReadFile(sysctl); err != nil || strings.TrimSpace(string(b)) != "0" {
		return fmt.Errorf("after the report: %s %q (%v), want 0: the kernel counts it down", sysctl, b, err)
	}
	if n, ok := Metric(page, "autopilot_health_kernel_hung_task_warnings"); !ok || n != 0 {
		return fmt.Errorf("after the kernel's last hung-task report: autopilot_health_kernel_hung_task_warnings %v (present %v), want 0", n, ok)
	}
	if n, _ := Metric(page, "problem_counter", "reason", "TaskHung"); n < 1 {
		return fmt.Errorf("problem_counter{reason=TaskHung} %v, want the report's TaskHung event", n)
	}
	warning := "kernel.hung_task_warnings is 0: the kernel prints no more hung-task reports in this boot"
	if b, err := os.ReadFile(DaemonLog); err != nil || !strings.Contains(string(b), warning) {
		return fmt.Errorf("the daemon's log has no %q (%v)", warning, err)
	}
	return nil
}
