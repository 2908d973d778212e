package checks

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A GPU seen on PCI earlier in this boot and gone from it since (fallen off
// the bus, the kernel's removal of a function whose link went down, an
// operator's remove in sysfs) is not left out silently: GpuActivationFailed
// is Unknown, GpuGoneFromPCI, naming it, where it would otherwise be False
// (the GPUs still there activated) or Unknown, NothingToCheck (none left);
// a True of the GPUs still there stays True and names it too. Kept across a
// restart of the daemon within the boot; a new boot, and the one-shot check
// (no state), judge by what is on PCI. Before, the check said
// NothingToCheck once the only GPU was gone, and GpuActivated once the one
// GPU that was not activated was gone.
func TestGpuActivationGPUGoneFromPCI(t *testing.T) {
	const (
		dirs      = "/etc/cdi, /var/run/cdi"
		working   = "0000:3b:00.0"
		unbound   = "0000:5e:00.0"
		activated = "GPU 0000:3b:00.0 activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.json"
	)
	gone := func(addrs string) string {
		return "NVIDIA GPU at PCI " + addrs + " seen in this boot, gone from /sys/bus/pci/devices since (fallen off the bus, its link down, or removed): its activation cannot be checked"
	}
	// A GPU bound to nvidia and activated, and one bound to no driver
	// (never activated), as unboundGPUHost lays them out.
	root := unboundGPUHost(t, []string{working, unbound}, working)
	state := filepath.Join(t.TempDir(), "state.json")
	newCheck := func(m Memos) Check {
		t.Helper()
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.GPU = true
		if m != nil {
			env.Memos = m
			env.GPUsSeen = NewGPUsSeen(m)
		}
		c, err := NewForTest("GpuActivationFailed", env)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	expect := func(c Check, when string, status report.Status, reason report.Reason, msg string) {
		t.Helper()
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != status || r.Reason != reason || r.Message != msg {
			t.Errorf("%s: got %s/%s %v\n%s\nwant %s/%s\n%s", when, r.Status, r.Reason, err, r.Message, status, reason, msg)
		}
	}
	unplug := func(addr string) {
		t.Helper()
		if err := os.RemoveAll(filepath.Join(root, PCIDevicesDir, addr)); err != nil {
			t.Fatal(err)
		}
	}

	s1 := report.NewStore("boot-1")
	c := newCheck(s1)
	expect(c, "both GPUs on PCI", report.StatusTrue, report.ReasonCDISpecMissing,
		"2 GPUs (0000:3b:00.0, 0000:5e:00.0) present; no CDI spec under "+dirs+" names a device of kind nvidia.com/gpu for 0000:5e:00.0 (no driver bound)")
	unplug(unbound)
	expect(c, "the GPU that was not activated gone", report.StatusUnknown, report.ReasonGpuGoneFromPCI,
		gone(unbound)+"; "+activated)
	// The GPU bound to nvidia loses its driver (no spec names it now): a
	// True of the GPUs still there stays True, and names the one gone.
	if err := os.Remove(filepath.Join(root, PCIDevicesDir, working, "driver")); err != nil {
		t.Fatal(err)
	}
	expect(c, "the GPU still there not activated", report.StatusTrue, report.ReasonCDISpecMissing,
		"GPU 0000:3b:00.0 present; no CDI spec under "+dirs+" names a device of kind nvidia.com/gpu for 0000:3b:00.0 (no driver bound); "+gone(unbound))
	unplug(working)
	expect(c, "no GPU left on PCI", report.StatusUnknown, report.ReasonGpuGoneFromPCI, gone(working+", "+unbound))
	if err := s1.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}

	// The daemon restarts within the boot: the GPUs seen are kept.
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s2), "the next daemon of the boot", report.StatusUnknown, report.ReasonGpuGoneFromPCI, gone(working+", "+unbound))
	// A new boot, and the one-shot check, judge by what is on PCI.
	const nothing = "no NVIDIA GPU (PCI vendor 0x10de, class 0x0300 or 0x0302) under /sys/bus/pci/devices"
	s3 := report.NewStore("boot-2")
	if _, err := s3.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s3), "a new boot", report.StatusUnknown, report.ReasonNothingToCheck, nothing)
	expect(newCheck(nil), "the one-shot check", report.StatusUnknown, report.ReasonNothingToCheck, nothing)
}

// The GPUs seen read back from a state file edited by hand: what is not a
// PCI address is not restored.
func TestGPUsSeenRestoresPCIAddressesOnly(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	s := report.NewStore("boot-1")
	s.Keep(GPUsSeenKey, func() any {
		return []string{"0000:3b:00.0", "../../etc", "0000:3b:00.0", "", "10000:01:1f.7", "0000:3B:00.0", strings.Repeat("0", 4096)}
	})
	if err := s.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	if got := NewGPUsSeen(s2).All(); strings.Join(got, " ") != "0000:3b:00.0 10000:01:1f.7" {
		t.Errorf("restored %q", got)
	}
}

// A GPU that another scan (the detect loop's, a check rebuilt by a reload)
// finds while a run of GpuActivationFailed is under way, after its own scan
// of PCI, is new, not gone: the run judges the GPUs it found, and names as
// gone only those seen before its scan that the scan did not find. Before,
// a GPU added to PCI (hot-plugged, a virtual function created) and found
// by the detect loop between the check's scan and its end made the run
// Unknown, GpuGoneFromPCI, "seen in this boot, gone from ... since", for a
// GPU that was there, until the next run.
func TestGpuActivationGPUFoundByAnotherScanMeanwhileIsNotGone(t *testing.T) {
	const (
		working = "0000:3b:00.0"
		added   = "0000:5e:00.0"
	)
	root := unboundGPUHost(t, []string{working}, working)
	// The driver's information file of the GPU, read after the check's
	// scan of PCI (driverUUID), as a FIFO: the run waits there until the
	// test has added a GPU and another scan has found it.
	info := filepath.Join(root, "proc/driver/nvidia/gpus", working, "information")
	content, err := os.ReadFile(info)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(info); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(info, 0o600); err != nil {
		t.Fatal(err)
	}
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.GPU = true
	m := report.NewStore("boot-1")
	env.Memos = m
	env.GPUsSeen = NewGPUsSeen(m)
	c, err := NewForTest("GpuActivationFailed", env)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   Result
		err error
	}
	done, ended := make(chan result, 1), make(chan struct{})
	go func() {
		r, err := c.Probe(context.Background())
		done <- result{r, err}
		close(ended)
	}()
	// Opening the FIFO for writing returns once the run opened it for
	// reading: its scan of PCI is done.
	w := openFIFOWriter(t, info, ended)
	if w == nil {
		got := <-done
		t.Fatalf("the run ended without reading %s: %s/%s %v", info, got.r.Status, got.r.Reason, got.err)
	}
	dev := filepath.Join(root, PCIDevicesDir, added)
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{"vendor": "0x10de\n", "class": "0x030200\n"} {
		if err := os.WriteFile(filepath.Join(dev, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Another scan (the detect loop's round) finds the added GPU.
	found, err := NvidiaGPUs(filepath.Join(root, PCIDevicesDir))
	if err != nil || len(found) != 2 {
		t.Fatalf("the other scan: %v %v", found, err)
	}
	env.GPUsSeen.Saw(found)
	if _, err := w.Write(content); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got := <-done
	const activated = "GPU 0000:3b:00.0 activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.json"
	if got.err != nil || got.r.Status != report.StatusFalse || got.r.Reason != report.ReasonGpuActivated || got.r.Message != activated {
		t.Errorf("the run whose scan came before the GPU was added: got %s/%s %v\n%s\nwant %s/%s\n%s",
			got.r.Status, got.r.Reason, got.err, got.r.Message, report.StatusFalse, report.ReasonGpuActivated, activated)
	}
	if all := strings.Join(env.GPUsSeen.All(), " "); all != working+" "+added {
		t.Errorf("GPUs seen: %s", all)
	}
}

// Scan names as gone only the GPUs seen before it began: one that another
// scan found while this one was reading PCI (after its listing of the
// directory) is not gone.
func TestGPUsSeenScanNamesOnlyTheGPUsSeenBefore(t *testing.T) {
	const (
		working = "0000:3b:00.0"
		added   = "0000:5e:00.0"
	)
	dir := filepath.Join(t.TempDir(), "devices")
	for f, v := range map[string]string{"vendor": "0x10de\n", "class": "0x030200\n"} {
		p := filepath.Join(dir, working, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A host bridge listed before the GPU, its vendor a FIFO: the scan
	// waits there, its listing of the directory done, until the test has
	// let another scan find a GPU.
	bridge := filepath.Join(dir, "0000:00:00.0")
	if err := os.MkdirAll(bridge, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bridge, "class"), []byte("0x060000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(bridge, "vendor"), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := NewGPUsSeen(report.NewStore("boot-1"))
	type result struct {
		found []PCIGPU
		gone  []string
		err   error
	}
	done, ended := make(chan result, 1), make(chan struct{})
	go func() {
		found, gone, err := seen.Scan(dir)
		done <- result{found, gone, err}
		close(ended)
	}()
	w := openFIFOWriter(t, filepath.Join(bridge, "vendor"), ended)
	if w == nil {
		got := <-done
		t.Fatalf("the scan ended without reading the bridge's vendor: %v %v %v", got.found, got.gone, got.err)
	}
	// Another scan finds a GPU added meanwhile.
	seen.Saw([]PCIGPU{{Addr: added}})
	// The FIFO is served until the scan ends: the writer's open may have
	// met ReadPseudoFile's first open (raw, non-blocking, closed again on
	// a file not on procfs or sysfs), and its ordinary open then waits for
	// a writer again (the test hung there, its writer gone: CI at 1d49273).
	served := make(chan struct{})
	go func() {
		defer close(served)
		for w != nil {
			w.WriteString("0x8086\n")
			w.Close()
			w = openFIFOWriter(t, filepath.Join(bridge, "vendor"), ended)
		}
	}()
	got := <-done
	<-served
	if got.err != nil || len(got.found) != 1 || got.found[0].Addr != working || len(got.gone) != 0 {
		t.Errorf("scan: found %v, gone %v, %v; want %s found, none gone", got.found, got.gone, got.err, working)
	}
	// The next scan, the added GPU not on PCI: gone.
	if err := os.Remove(filepath.Join(bridge, "vendor")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bridge, "vendor"), []byte("0x8086\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, gone, err := seen.Scan(dir); err != nil || strings.Join(gone, " ") != added {
		t.Errorf("the next scan: gone %v, %v; want %s", gone, err, added)
	}
}

// openFIFOWriter opens the FIFO at p for writing, which returns once a
// reader has opened it; nil when ended is closed first (the reader ended
// without opening it: the test fails rather than waits for ever).
func openFIFOWriter(t *testing.T, p string, ended <-chan struct{}) *os.File {
	t.Helper()
	opened := make(chan *os.File, 1)
	go func() {
		w, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
		}
		opened <- w
	}()
	select {
	case w := <-opened:
		return w
	case <-ended:
		// A reader of the test's own lets the opener return.
		if r, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			if w := <-opened; w != nil {
				w.Close()
			}
			r.Close()
		}
		return nil
	}
}
