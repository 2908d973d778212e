//go:build integration

// Package vm is the VM tier: the daemon on Debian's own kernel under QEMU
// (tests/vm/README.md).
package vm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/tests/vm/scenarios"
	"github.com/syself/autopilot-health/tests/vm/vmhost"
)

func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(f), "..", ".."))
}

// TestVM boots Debian's kernel with the daemon inside, once per Machine of
// the scenarios, and turns each scenario's result into a subtest.
// VMTEST_RUN=a,b runs only those scenarios; VMTEST_ECHO=1 copies the
// consoles to stderr as they arrive.
func TestVM(t *testing.T) {
	// A typo in VMTEST_RUN fails at once, before the kernel and the builds.
	selected, err := scenarios.Select(os.Getenv("VMTEST_RUN"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []struct{ bin, pkg string }{
		{"qemu-system-x86_64", "qemu-system-x86"},
		{"busybox", "busybox-static"},
		{"ldd", "libc-bin"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			testenv.Skip(t, fmt.Sprintf("VM tier: %s not found (Debian package %s)", tool.bin, tool.pkg))
		}
	}
	for _, tool := range scenarios.Tools {
		if _, err := os.Stat(tool); err != nil {
			testenv.Skip(t, fmt.Sprintf("VM tier: %s not found (Debian packages cryptsetup-bin, lvm2, dmsetup, e2fsprogs)", tool))
		}
	}
	start := time.Now()
	work := t.TempDir()
	// The daemon and /init build while apt is asked for the kernel.
	var bins binaries
	built := make(chan struct{})
	go func() { defer close(built); bins = buildBinaries(work) }()
	defer func() { <-built }()
	kernel, err := vmhost.FetchKernel(filepath.Join(repoRoot(), "tests", ".cache", "vm"), t.Logf)
	var missing *vmhost.Missing
	if errors.As(err, &missing) {
		testenv.Skip(t, "VM tier: "+missing.What)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s (%s) ready in %v", kernel.Version, filepath.Base(kernel.Image), time.Since(start).Round(time.Millisecond))

	<-built
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	initrd, err := buildInitramfs(work, bins, kernel, selected)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(0)
	if st, err := os.Stat(initrd); err == nil {
		size = st.Size()
	}
	t.Logf("daemon and /init built, initramfs (%.1f MiB) packed: %v after the start", float64(size)/(1<<20), time.Since(start).Round(time.Millisecond))

	// One boot per Machine, in the order the scenarios first name it.
	var machines []scenarios.Machine
	groups := map[scenarios.Machine][]scenarios.Scenario{}
	for _, s := range selected {
		if _, ok := groups[s.Machine]; !ok {
			machines = append(machines, s.Machine)
		}
		groups[s.Machine] = append(groups[s.Machine], s)
	}
	// The boots run side by side: much of a scenario is waiting (a hung
	// task report, a check's next run). The short deadline boot comes last:
	// with go test's -parallel at GOMAXPROCS (2 here) it then waits for the
	// shorter scenario boot, not the longer.
	t.Run("boots", func(t *testing.T) {
		for i, m := range machines {
			t.Run(fmt.Sprintf("boot%d_cw%#02x", i, m.NVMeCriticalWarning), func(t *testing.T) {
				t.Parallel()
				bootAndAssert(t, work, i, kernel, initrd, m, groups[m])
			})
		}
		if os.Getenv("VMTEST_RUN") == "" || slices.Contains(strings.Split(os.Getenv("VMTEST_RUN"), ","), scenarios.DeadlineProbe) {
			t.Run("deadline", func(t *testing.T) {
				t.Parallel()
				bootPastDeadline(t, work, kernel, initrd)
			})
		}
	})
	t.Logf("the tier took %v", time.Since(start).Round(time.Millisecond))
}

// binaries are the guest's /init and the daemon, built static from this tree.
type binaries struct {
	init, daemon string
	err          error
}

func buildBinaries(work string) binaries {
	b := binaries{init: filepath.Join(work, "init"), daemon: filepath.Join(work, "autopilot-health")}
	var wg sync.WaitGroup
	var initErr, daemonErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		initErr = vmhost.BuildStatic(repoRoot(), "./tests/vm/guest", b.init, "")
	}()
	go func() {
		defer wg.Done()
		daemonErr = vmhost.BuildStatic(repoRoot(), "./cmd/autopilot-health", b.daemon, "-X main.version=vmtest")
	}()
	wg.Wait()
	b.err = errors.Join(initErr, daemonErr)
	return b
}

func buildInitramfs(work string, bins binaries, kernel *vmhost.Kernel, selected []scenarios.Scenario) (string, error) {
	daemon := bins.daemon
	// The guest's configuration must load: a bad one would fail every
	// scenario with a less clear message.
	for name, c := range map[string]string{"config.toml": scenarios.DaemonConfig, "check.toml": scenarios.CheckConfig} {
		cfg := filepath.Join(work, name)
		if err := os.WriteFile(cfg, []byte(c), 0o644); err != nil {
			return "", err
		}
		if out, err := exec.Command(daemon, "config", "validate", cfg).CombinedOutput(); err != nil {
			return "", fmt.Errorf("the guest's daemon configuration %s: %v\n%s", name, err, out)
		}
	}
	modules := slices.Clone(scenarios.BaseModules)
	for _, s := range selected {
		modules = append(modules, s.Modules...)
	}
	busybox, _ := exec.LookPath("busybox")
	initrd := filepath.Join(work, "initrd.cpio")
	err := vmhost.Build(vmhost.Spec{
		Kernel:  kernel,
		Init:    bins.init,
		Files:   map[string]string{scenarios.DaemonPath: daemon},
		Modules: modules,
		Tools:   scenarios.Tools,
		Busybox: busybox,
		Config:  map[string]string{"/etc/lvm/lvm.conf": scenarios.LVMConf},
	}, initrd)
	return initrd, err
}

func bootAndAssert(t *testing.T, work string, i int, kernel *vmhost.Kernel, initrd string, m scenarios.Machine, group []scenarios.Scenario) {
	img := filepath.Join(work, fmt.Sprintf("nvme%d.img", i))
	if err := vmhost.SparseImage(img, 256<<20); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range group {
		names = append(names, s.Name)
	}
	// The guest stops running scenarios at its deadline and prints the
	// daemon's log; QEMU is given that long and a margin.
	deadline, timeout := scenarios.Deadline(len(group))
	b := vmhost.Boot{
		Kernel:  kernel,
		Initrd:  initrd,
		NVMe:    []vmhost.NVMeDrive{{Image: img, Serial: scenarios.NVMeSerial, CriticalWarning: m.NVMeCriticalWarning}},
		Append:  fmt.Sprintf("vmtest.run=%s vmtest.deadline=%d", strings.Join(names, ","), int(deadline/time.Second)),
		Timeout: timeout,
		QMP:     filepath.Join(work, fmt.Sprintf("qmp%d.sock", i)),
	}
	if os.Getenv("VMTEST_ECHO") != "" {
		b.Echo = os.Stderr
	}
	r := b.Run()
	t.Logf("boot with %s: %v", strings.Join(names, ", "), r.Elapsed.Round(time.Millisecond))
	failed := false
	for _, s := range group {
		t.Run(s.Name, func(t *testing.T) {
			res, ok := r.Results[s.Name]
			switch {
			case !ok:
				failed = true
				t.Errorf("the guest reported no result (qemu: %v)", r.Err)
			case !res.Pass:
				failed = true
				t.Errorf("%s\nkernel records while it ran:\n%s", res.Detail, r.Prefixed(scenarios.KmsgPrefix+s.Name+"| "))
			default:
				t.Logf("passed in %v", res.Duration)
			}
		})
	}
	if !r.Done || r.Err != nil {
		failed = true
		t.Errorf("the guest did not finish cleanly (done %v, qemu: %v)", r.Done, r.Err)
	}
	if failed {
		t.Logf("console (last 80 lines):\n%s", r.Tail(80, scenarios.DaemonPrefix, scenarios.KmsgPrefix))
		t.Logf("the daemon's log:\n%s", r.Prefixed(scenarios.DaemonPrefix))
	}
}

// bootPastDeadline boots a scenario that never ends with a short deadline:
// the guest must fail it at its deadline, not start the next one, still
// print the daemon's whole log and power off before the host's timeout.
func bootPastDeadline(t *testing.T, work string, kernel *vmhost.Kernel, initrd string) {
	img := filepath.Join(work, "nvme-deadline.img")
	if err := vmhost.SparseImage(img, 256<<20); err != nil {
		t.Fatal(err)
	}
	const deadline = 15 * time.Second
	guest, host := scenarios.Deadline(1)
	b := vmhost.Boot{
		Kernel:  kernel,
		Initrd:  initrd,
		NVMe:    []vmhost.NVMeDrive{{Image: img, Serial: scenarios.NVMeSerial}},
		Append:  fmt.Sprintf("vmtest.run=%s,nvme_healthy vmtest.deadline=%d", scenarios.DeadlineProbe, int(deadline/time.Second)),
		Timeout: deadline + host - guest,
	}
	if os.Getenv("VMTEST_ECHO") != "" {
		b.Echo = os.Stderr
	}
	r := b.Run()
	t.Logf("boot past its deadline: %v", r.Elapsed.Round(time.Millisecond))
	ok := true
	if !r.Done || r.Err != nil {
		ok = false
		t.Errorf("the guest did not finish on its own after its deadline (done %v, qemu: %v)", r.Done, r.Err)
	}
	// Under a heavy load the deadline may pass before the first scenario
	// starts: then it is not run either.
	if res, found := r.Results[scenarios.DeadlineProbe]; !found || res.Pass ||
		!(strings.HasPrefix(res.Detail, "still running at the guest's deadline (15s after boot)") || strings.HasPrefix(res.Detail, "not run: the guest's deadline (15s after boot) had passed")) {
		ok = false
		t.Errorf("%s: %+v (found %v), want a failure at the guest's deadline", scenarios.DeadlineProbe, res, found)
	}
	if res, found := r.Results["nvme_healthy"]; !found || res.Pass || !strings.HasPrefix(res.Detail, "not run: the guest's deadline (15s after boot) had passed") {
		ok = false
		t.Errorf("nvme_healthy after the deadline: %+v (found %v), want not run", res, found)
	}
	log := r.Prefixed(scenarios.DaemonPrefix)
	if !strings.Contains(log, "msg=starting") || !strings.Contains(log, "msg=stopped") {
		ok = false
		t.Errorf("the daemon's log, from its start to its stop, did not come back:\n%s", log)
	}
	if !ok {
		t.Logf("console (last 80 lines):\n%s", r.Tail(80, scenarios.DaemonPrefix, scenarios.KmsgPrefix))
	}
}
