package scenarios

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/syself/autopilot-health/kmsg"

	"golang.org/x/sys/unix"
)

// fabricsNQN is the subsystem the guest exports to itself.
const fabricsNQN = "nqn.2024-01.io.vmtest:failing"

// nvmeFabricsIOErrors: an NVMe over Fabrics namespace whose every I/O
// fails, made with the kernel's own target and host (nvmet, nvmet-tcp and
// nvme-tcp over 127.0.0.1; Debian's kernel has no nvme-loop): a subsystem
// whose namespace is a device-mapper "error" device, connected through
// /dev/nvme-fabrics. With CONFIG_NVME_MULTIPATH the namespace is a head
// (nvme1n1, its device the subsystem) over a hidden path (nvme1c1n1, its
// device the controller, transport tcp), and the kernel logs each failed
// read on the path: "I/O error, dev nvme1c1n1, sector 0 ...". Those lines
// are BlockIOError matches, and none counts towards DisksFailure, which
// stays False with the count it had; the SMART part leaves the controller
// out (the disks report lists QEMU's drive alone).
func nvmeFabricsIOErrors(g *Guest) error {
	c, err := g.Await("DisksFailure", "False", "DisksHealthy", awaitCheck)
	if err != nil {
		return err
	}
	counted, err := ioErrorsCounted(c)
	if err != nil {
		return err
	}
	rule, err := blockIOErrorRule()
	if err != nil {
		return err
	}
	for _, m := range []string{"nvmet", "nvmet-tcp", "nvme-tcp"} {
		if err := Modprobe(m, ""); err != nil {
			return err
		}
	}
	k, err := OpenKmsg()
	if err != nil {
		return err
	}
	defer k.Close()
	page, err := g.Metrics()
	if err != nil {
		return err
	}
	base, _ := Metric(page, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError")
	baseEvents, _ := Metric(page, "problem_counter", "reason", "BlockIOError")

	t, err := g.fabricsTarget("vmtest-fail", 16384)
	if err != nil {
		return err
	}
	var lines []KmsgRecord // the kernel's BlockIOError lines, all devices
	drain := func() {
		for _, r := range k.Drain() {
			if rule.MatchString(r.Msg) {
				lines = append(lines, r)
			}
		}
	}
	cleaned := false
	defer func() {
		if !cleaned {
			t.close()
		}
	}()
	ctrl, err := t.connect()
	if err != nil {
		return err
	}
	path, head, err := fabricsNamespace(ctrl)
	if err != nil {
		return err
	}
	g.Logf("controller %s: namespace %s, head %s", ctrl, path, head)
	logLink := func(p string) {
		l, err := os.Readlink(p)
		g.Logf("%s -> %s (%v)", p, l, err)
	}
	// The layout kmsg/fabrics.go reads: the namespace the kernel names in
	// its lines has the controller as its device, with its transport.
	logLink("/sys/block/" + path)
	logLink("/sys/block/" + path + "/device")
	if tr, err := os.ReadFile("/sys/block/" + path + "/device/transport"); err != nil || strings.TrimSpace(string(tr)) != "tcp" {
		return fmt.Errorf("/sys/block/%s/device/transport: %q (%v), want tcp", path, tr, err)
	}
	if head != "" {
		// A head's device is the subsystem, which links its controllers.
		logLink("/sys/block/" + head)
		logLink("/sys/block/" + head + "/device")
		logLink("/sys/block/" + head + "/device/" + ctrl)
		if tr, err := os.ReadFile("/sys/block/" + head + "/device/" + ctrl + "/transport"); err != nil || strings.TrimSpace(string(tr)) != "tcp" {
			return fmt.Errorf("/sys/block/%s/device/%s/transport: %q (%v), want tcp", head, ctrl, tr, err)
		}
	}
	dev := path
	if head != "" {
		dev = head
	}
	if err := AwaitPath("/dev/"+dev, 5*time.Second); err != nil {
		return err
	}
	// Read until the daemon has seen 6 failed reads' lines: past the
	// threshold (5), and the 6th handled means the 5th was counted (or
	// not) before it. The kernel rate-limits the lines (10 in 5 s), so
	// some reads may log none.
	want := base + float64(ioErrorThreshold) + 1
	deadline := time.Now().Add(awaitKmsg)
	reads := 0
	for {
		reads++
		if err := DirectRead("/dev/"+dev, int64(reads%8)*4096, 4096); !errors.Is(err, unix.EIO) {
			return fmt.Errorf("O_DIRECT read %d of /dev/%s: %v, want EIO", reads, dev, err)
		}
		page, err = g.Metrics()
		if err != nil {
			return err
		}
		if n, _ := Metric(page, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError"); n >= want {
			break
		}
		if time.Now().After(deadline) {
			n, _ := Metric(page, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError")
			return fmt.Errorf("%d failed reads of /dev/%s in %v: %v BlockIOError matches, want %v", reads, dev, awaitKmsg, n, want)
		}
	}
	// Past the kernel's rate limit of these lines (10 in 5 s, one state
	// for every device): 25 more failed reads at once are more than two
	// bursts, so the kernel drops some, and says how many
	// ("blk_print_req_error: N callbacks suppressed") at the first I/O
	// error line after the interval: disk_io_errors' first, which asserts
	// the count and DisksFailure's word that its count is a lower bound.
	for i := range 25 {
		if err := DirectRead("/dev/"+dev, int64(i%8)*4096, 4096); !errors.Is(err, unix.EIO) {
			return fmt.Errorf("O_DIRECT read %d past the rate limit of /dev/%s: %v, want EIO", i, dev, err)
		}
	}
	fabricsFloodedTheRateLimit = true
	drain()
	var mine int
	for _, r := range lines {
		if m := rule.FindStringSubmatch(r.Msg); m[rule.SubexpIndex("dev")] == path {
			if mine == 0 {
				g.Logf("kernel: %s", r.Msg)
			}
			mine++
		}
	}
	g.Logf("%d failed reads of /dev/%s; %d BlockIOError lines on %s", reads, dev, mine, path)
	if mine < ioErrorThreshold+1 {
		return fmt.Errorf("%d BlockIOError lines name %s, want %d or more (lines: %v)", mine, path, ioErrorThreshold+1, lines)
	}
	if s := ConditionStatus(page, "DisksFailure"); s != "False" {
		return fmt.Errorf("%d disk I/O errors of NVMe over Fabrics namespace %s: DisksFailure %s on /metrics, want False", mine, path, s)
	}
	if n, _ := Metric(page, "problem_counter", "reason", "BlockIOError"); n <= baseEvents {
		return fmt.Errorf("problem_counter{reason=BlockIOError} %v after the errors, %v before: no event", n, baseEvents)
	}
	st, err := g.State()
	if err != nil {
		return err
	}
	if c := st["DisksFailure"]; c.Status != "False" || c.Reason != "DisksHealthy" {
		return fmt.Errorf("disk I/O errors of NVMe over Fabrics namespace %s: %s, want False", path, c)
	}
	if n, err := ioErrorsCounted(st["DisksFailure"]); err != nil || n != counted {
		return fmt.Errorf("%s: %d disk I/O errors counted (%v), %d before the errors of %s", st["DisksFailure"], n, err, counted, path)
	}
	// The SMART part: the disks report has QEMU's drive, not the
	// controller of NVMe over Fabrics.
	out, err := g.Check("DisksFailure")
	if err != nil {
		return err
	}
	if r := string(out.Report["disks"]); !strings.Contains(r, `"nvme0"`) || strings.Contains(r, `"`+ctrl+`"`) {
		return fmt.Errorf("disks report with %s (tcp) connected: %s, want nvme0 alone", ctrl, compact(out.Report["disks"]))
	}

	// Gone, and every line the kernel logged handled: the next scenario
	// counts from here.
	t.close()
	cleaned = true
	if _, err := os.Stat("/sys/class/nvme/" + ctrl); err == nil {
		return fmt.Errorf("%s still there after delete_controller", ctrl)
	}
	drain()
	if _, err := g.AwaitMetric(base+float64(len(lines)), awaitKmsg, "autopilot_health_kmsg_matches_total", "rule", "BlockIOError"); err != nil {
		return err
	}
	// The kernel prints these lines rate-limited (blk_print_req_error's
	// printk_ratelimited: 10 in 5 s, the state shared by every device):
	// the next scenario's errors would not be logged until the burst
	// these started has passed. Its end is a kernel time, not an event.
	if len(lines) > 0 {
		last, err := kmsgUsec(lines[len(lines)-1])
		if err != nil {
			return err
		}
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		if d := time.Duration(last)*time.Microsecond + blkErrorRatelimit - time.Duration(ts.Nano()); d > 0 {
			g.Logf("waiting %v for the kernel's rate limit of I/O error lines", d.Round(time.Millisecond))
			time.Sleep(d)
		}
	}
	return nil
}

// fabricsFloodedTheRateLimit: nvme_fabrics_io_errors ran in this boot and
// made the kernel drop I/O error lines (see there).
var fabricsFloodedTheRateLimit bool

// blkErrorRatelimit is the interval of the kernel's rate limit of block
// I/O error lines (DEFAULT_RATELIMIT_INTERVAL, 5 s), with a second more.
const blkErrorRatelimit = 6 * time.Second

// kmsgUsec is a record's kernel time ("prio,seq,usec,flags;...").
func kmsgUsec(r KmsgRecord) (uint64, error) {
	f := strings.SplitN(r.Raw, ",", 4)
	if len(f) < 4 {
		return 0, fmt.Errorf("kernel record %q: no time", r.Raw)
	}
	return strconv.ParseUint(f[2], 10, 64)
}

// ioErrorThreshold is DisksFailure's io_error_threshold in the guest
// (the default).
const ioErrorThreshold = 5

var countedRe = regexp.MustCompile(`the kernel logged (\d+) disk I/O errors in the last `)

// ioErrorsCounted is the count of disk I/O errors DisksFailure's message
// gives (its kernel part).
func ioErrorsCounted(c Condition) (int, error) {
	m := countedRe.FindStringSubmatch(c.Message)
	if m == nil {
		return 0, fmt.Errorf("%s: no count of disk I/O errors", c)
	}
	return strconv.Atoi(m[1])
}

// blockIOErrorRule is the daemon's own BlockIOError pattern.
func blockIOErrorRule() (*regexp.Regexp, error) {
	for _, r := range kmsg.DefaultRules {
		if r.Name == "BlockIOError" {
			return regexp.Compile(r.Pattern)
		}
	}
	return nil, errors.New("kmsg.DefaultRules has no BlockIOError")
}

// fabricsTarget is an NVMe over Fabrics subsystem (nvmet, configfs) with
// one namespace on a device-mapper "error" device, exported on a TCP port
// of 127.0.0.1.
type fabricsTarget struct {
	g          *Guest
	dm         string
	subsys     string
	port       string
	ctrl       string
	ns, linked bool
}

const nvmetRoot = "/sys/kernel/config/nvmet"

func (g *Guest) fabricsTarget(dm string, sectors int) (*fabricsTarget, error) {
	if err := unix.Mount("configfs", "/sys/kernel/config", "configfs", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("mount configfs: %w", err)
	}
	t := &fabricsTarget{g: g}
	if _, err := g.Run("dmsetup", "create", dm, "--table", fmt.Sprintf("0 %d error", sectors)); err != nil {
		return nil, err
	}
	t.dm = dm
	fail := func(err error) (*fabricsTarget, error) {
		t.close()
		return nil, err
	}
	t.subsys = nvmetRoot + "/subsystems/" + fabricsNQN
	if err := os.Mkdir(t.subsys, 0o755); err != nil {
		t.subsys = ""
		return fail(err)
	}
	ns := t.subsys + "/namespaces/1"
	if err := os.Mkdir(ns, 0o755); err != nil {
		return fail(err)
	}
	t.ns = true
	port := nvmetRoot + "/ports/1"
	if err := os.Mkdir(port, 0o755); err != nil {
		return fail(err)
	}
	t.port = port
	for _, w := range []struct{ file, value string }{
		{t.subsys + "/attr_allow_any_host", "1"},
		{ns + "/device_path", "/dev/mapper/" + dm},
		{ns + "/enable", "1"},
		{port + "/addr_trtype", "tcp"},
		{port + "/addr_adrfam", "ipv4"},
		{port + "/addr_traddr", "127.0.0.1"},
		{port + "/addr_trsvcid", "4420"},
	} {
		if err := os.WriteFile(w.file, []byte(w.value), 0); err != nil {
			return fail(err)
		}
	}
	if err := os.Symlink(t.subsys, port+"/subsystems/"+fabricsNQN); err != nil {
		return fail(err)
	}
	t.linked = true
	return t, nil
}

// connect writes the connect options to /dev/nvme-fabrics (as nvme-cli's
// "nvme connect" does) and returns the new controller (nvme1).
func (t *fabricsTarget) connect() (string, error) {
	fd, err := unix.Open("/dev/nvme-fabrics", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	opts := "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=" + fabricsNQN
	if _, err := unix.Write(fd, []byte(opts)); err != nil {
		return "", fmt.Errorf("connect %s: %w", opts, err)
	}
	buf := make([]byte, 256)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return "", fmt.Errorf("reading /dev/nvme-fabrics after the connect: %w", err)
	}
	reply := strings.TrimSpace(string(buf[:n]))
	t.g.Logf("/dev/nvme-fabrics: %s -> %s", opts, reply)
	for _, f := range strings.Split(reply, ",") {
		if v, ok := strings.CutPrefix(f, "instance="); ok {
			t.ctrl = "nvme" + v
			return t.ctrl, nil
		}
	}
	return "", fmt.Errorf("/dev/nvme-fabrics answered %q: no instance", reply)
}

// fabricsNamespace waits for the controller's namespace and returns its
// block device (a path nvme1c1n1 under a multipath head, or a namespace
// nvme1n1 without one) and the head (nvme1n1; "" without multipath).
func fabricsNamespace(ctrl string) (path, head string, err error) {
	m, err := awaitGlob("/sys/class/nvme/"+ctrl+"/nvme*n*", 10*time.Second)
	if err != nil {
		return "", "", err
	}
	path = filepath.Base(m[0])
	re := regexp.MustCompile(`^nvme(\d+)c\d+n(\d+)$`)
	if s := re.FindStringSubmatch(path); s != nil {
		head = "nvme" + s[1] + "n" + s[2]
		if err := AwaitPath("/sys/block/"+head, 5*time.Second); err != nil {
			return "", "", err
		}
	}
	return path, head, nil
}

// close disconnects the controller and removes the target and its device.
func (t *fabricsTarget) close() {
	if t.ctrl != "" {
		if err := os.WriteFile("/sys/class/nvme/"+t.ctrl+"/delete_controller", []byte("1"), 0); err != nil {
			t.g.Logf("delete_controller %s: %v", t.ctrl, err)
		}
		t.ctrl = ""
	}
	if t.linked {
		_ = os.Remove(t.port + "/subsystems/" + fabricsNQN)
		t.linked = false
	}
	if t.port != "" {
		_ = os.Remove(t.port)
		t.port = ""
	}
	if t.ns {
		_ = os.WriteFile(t.subsys+"/namespaces/1/enable", []byte("0"), 0)
		_ = os.Remove(t.subsys + "/namespaces/1")
		t.ns = false
	}
	if t.subsys != "" {
		_ = os.Remove(t.subsys)
		t.subsys = ""
	}
	if t.dm != "" {
		_, _ = t.g.Run("dmsetup", "remove", t.dm)
		t.dm = ""
	}
}
