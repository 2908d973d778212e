package checks

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("GpuActivationFailed", newGpuActivationCheck) }

// gpuActivationCheck: an NVIDIA GPU is present but gpu-activate has not
// finished, so containerd cannot give it to a container. The GPUs are those
// of NvidiaGPUs, the scan that also decides whether this is a GPU node.
// True (ActivationMarkerMissing) while the marker that says gpu-activate
// finished is missing; True (CDISpecMissing) when the CDI specs do not name a
// device of the configured kind for each GPU. The specs are read by the CDI
// project's own cache (tags.cncf.io/container-device-interface/pkg/cdi),
// the loader containerd resolves CDI devices with: a spec that does not
// parse or validate is left out with its error, a device that two specs of
// the same directory both name is dropped, and the later directory wins.
//
// A GPU seen on PCI earlier in this boot (Env.GPUsSeen) and gone from it
// since (fallen off the bus, its link down, removed in sysfs) is not left
// out silently: a True of the GPUs still there names it too; anything else
// (the GPUs still there activated, or none left) is Unknown, GpuGoneFromPCI,
// naming it. Not True: whether it was activated cannot be checked, and its
// loss is hardware, GpuFallenOffBus's alert, not gpu-activate's failure.
//
// Only the GPUs meant for containers count (PCIGPU.ForContainers: bound to
// the nvidia driver, or to none yet); one bound to another driver, vfio-pci
// for a virtual machine above all, never gets a CDI device: it is left out,
// and named in the message. Where every GPU is bound to another driver the
// check is Unknown (NothingToCheck).
//
// A GPU bound to nvidia is named by its index, its position in PCI address
// order among the GPUs bound to nvidia (how NVML, and so nvidia-ctk's
// "index" device names, number the GPUs the driver sees), or by its UUID
// where the driver lists it (/proc/driver/nvidia/gpus/<address>/information);
// `nvidia-ctk cdi generate` writes both by default, and "all". A GPU bound
// to no driver has neither: NVML does not see it, so no spec names it (an
// index a spec holds belongs to a GPU bound to nvidia), and it is not
// activated, whatever the marker and the specs say (the driver unloaded
// after gpu-activate left them in /run, or its bind to this GPU failed).
//
// The daemon starts early in the boot, before the kubelet; gpu-activate
// loads the driver and writes the CDI spec and the marker (on /run: gone at
// every boot) after it. Until activation has been seen complete once in this
// boot, and within gpuBootGrace of the boot, a missing marker or CDI spec is
// Unknown, NoData ("GPU activation has not finished yet in this boot"), not
// True: every boot of every GPU node would otherwise set the condition, and
// its alert, for gpu-activate's run. After the grace the same answer is
// True; once activation was seen complete in this boot, at once. "Seen
// complete in this boot" is kept in the state file (Env.Memos), so a daemon
// restart within the boot does not give a lost marker or spec the grace
// again.
type gpuActivationCheck struct {
	env    *Env
	marker string
	dirs   []string
	kind   string
	// grace: activation seen complete (GpuActivated) in this boot (bootGrace).
	grace bootGrace
}

// GpuKey is the name under which GpuActivationFailed keeps, in the state
// file, whether GPU activation has been seen complete in this boot.
const GpuKey = "gpu"

// gpuBootGrace is how long after the boot a GPU activation not seen complete
// yet in this boot is not yet a problem (see gpuActivationCheck).
const gpuBootGrace = 10 * time.Minute

func newGpuActivationCheck(env *Env) (Check, error) {
	c := env.Config.Checks.GpuActivationFailed
	dirs := make([]string, len(c.CDISpecDirs))
	for i, d := range c.CDISpecDirs {
		dirs[i] = filepath.Clean(d) // as the CDI cache keeps them
	}
	return &gpuActivationCheck{env: env, marker: c.MarkerPath, dirs: dirs, kind: c.CDIKind,
		grace: newBootGrace(GpuKey, gpuBootGrace, "GPU activation has not finished yet in this boot")}, nil
}

// gpu is one GPU and the CDI device names that would name it.
type gpu struct {
	addr  string
	index int    // -1: bound to no driver, so NVML does not number it
	uuid  string // "" when the driver does not list it
}

func (g gpu) String() string {
	if g.index < 0 {
		return g.addr + " (no driver bound)"
	}
	s := fmt.Sprintf("%s (index %d", g.addr, g.index)
	if g.uuid != "" {
		s += ", " + g.uuid
	}
	return s + ")"
}

func (c *gpuActivationCheck) Probe(ctx context.Context) (Result, error) {
	return c.grace.probe(ctx, c.env, c.probe)
}

func (c *gpuActivationCheck) probe(ctx context.Context) (Result, error) {
	// gone: the GPUs seen on PCI before this scan in this boot and not
	// found by it (not one another scan found meanwhile: Scan).
	found, gone, err := c.env.GPUsSeen.Scan(c.env.Path(PCIDevicesDir))
	if err != nil {
		return Result{}, err
	}
	r, err := c.probeFound(ctx, found)
	if err != nil {
		return r, err
	}
	// The GPUs seen on PCI earlier in this boot and gone from it since
	// are not left out silently: a True of the GPUs still there names
	// them too; anything else is Unknown, GpuGoneFromPCI.
	if len(gone) > 0 {
		msg := fmt.Sprintf("NVIDIA GPU at PCI %s seen in this boot, gone from %s since (fallen off the bus, its link down, or removed): its activation cannot be checked",
			strings.Join(gone, ", "), PCIDevicesDir)
		switch {
		case r.Status == report.StatusTrue:
			r.Message += "; " + msg
		case len(found) == 0:
			r = Result{Status: report.StatusUnknown, Reason: report.ReasonGpuGoneFromPCI, Message: msg}
		default:
			r = Result{Status: report.StatusUnknown, Reason: report.ReasonGpuGoneFromPCI, Message: msg + "; " + r.Message}
		}
	}
	return r, nil
}

// probeFound judges the activation of the GPUs found on PCI.
func (c *gpuActivationCheck) probeFound(ctx context.Context, found []PCIGPU) (Result, error) {
	if len(found) == 0 {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Message: "no NVIDIA GPU (PCI vendor 0x10de, class 0x0300 or 0x0302) under " + PCIDevicesDir}, nil
	}
	var addrs, others []string
	var gpus []gpu
	for _, g := range found {
		switch {
		case g.Driver == NvidiaDriver:
			// NVML numbers only the GPUs bound to nvidia.
			gpus = append(gpus, gpu{addr: g.Addr, index: countBound(gpus), uuid: c.driverUUID(g.Addr)})
		case g.ForContainers():
			gpus = append(gpus, gpu{addr: g.Addr, index: -1})
		default:
			others = append(others, g.Addr+" bound to "+g.Driver)
			continue
		}
		addrs = append(addrs, g.Addr)
	}
	// leftOut names the GPUs bound to another driver, for the message.
	leftOut := ""
	if len(others) > 0 {
		leftOut = strings.Join(others, ", ") + ", left out"
	}
	if len(addrs) == 0 {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Message: "no NVIDIA GPU for containers under " + PCIDevicesDir + ": " + leftOut}, nil
	}
	present := describeGPUs(addrs)

	markerMissing := false
	if _, err := os.Stat(c.env.Path(c.marker)); errors.Is(err, fs.ErrNotExist) {
		markerMissing = true
	} else if err != nil {
		return Result{}, fmt.Errorf("activation marker: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	specs, err := c.loadCDI()
	if err != nil {
		return Result{}, err
	}
	var unnamed, files []string
	for _, g := range gpus {
		if p, ok := specs.spec(g); !ok {
			unnamed = append(unnamed, g.String())
		} else if !slices.Contains(files, p) {
			files = append(files, p)
		}
	}
	slices.Sort(files)
	var cdiProblem string
	if len(unnamed) > 0 {
		cdiProblem = fmt.Sprintf("no CDI spec under %s names a device of kind %s for %s", strings.Join(c.dirs, ", "), c.kind, strings.Join(unnamed, ", "))
		if len(specs.errs) > 0 {
			cdiProblem += "; " + strings.Join(specs.errs, "; ")
		}
	}
	switch {
	case markerMissing:
		msg := fmt.Sprintf("%s present, but the activation marker %s is missing (gpu-activate has not finished)", present, c.marker)
		if cdiProblem != "" {
			msg += "; " + cdiProblem
		}
		return Result{Status: report.StatusTrue, Reason: report.ReasonActivationMarkerMissing, Message: withLeftOut(msg, leftOut)}, nil
	case cdiProblem != "":
		return Result{Status: report.StatusTrue, Reason: report.ReasonCDISpecMissing, Message: withLeftOut(present+" present; "+cdiProblem, leftOut)}, nil
	}
	msg := fmt.Sprintf("%s activated: marker %s present, each named by a device of kind %s in %s", present, c.marker, c.kind, strings.Join(files, ", "))
	if len(specs.errs) > 0 {
		msg += "; other CDI specs left out: " + strings.Join(specs.errs, "; ")
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonGpuActivated, Message: withLeftOut(msg, leftOut)}, nil
}

// countBound returns how many of gpus are bound to nvidia (numbered by NVML).
func countBound(gpus []gpu) int {
	n := 0
	for _, g := range gpus {
		if g.index >= 0 {
			n++
		}
	}
	return n
}

// withLeftOut adds the GPUs bound to another driver to a message.
func withLeftOut(msg, leftOut string) string {
	if leftOut == "" {
		return msg
	}
	return msg + "; " + leftOut
}

// describeGPUs says which GPUs are present: "GPU 0000:3b:00.0" or
// "4 GPUs (0000:18:00.0, ...)".
func describeGPUs(addrs []string) string {
	if len(addrs) == 1 {
		return "GPU " + addrs[0]
	}
	return fmt.Sprintf("%d GPUs (%s)", len(addrs), strings.Join(addrs, ", "))
}

// driverUUID returns the GPU's UUID as the NVIDIA driver lists it
// ("GPU UUID: \t GPU-..." in /proc/driver/nvidia/gpus/<address>/information),
// or "" where the driver is not loaded or does not say.
func (c *gpuActivationCheck) driverUUID(addr string) string {
	b, err := os.ReadFile(c.env.Path(filepath.Join("/proc/driver/nvidia/gpus", addr, "information")))
	if err != nil {
		return ""
	}
	return parseDriverUUID(string(b))
}

// parseDriverUUID returns the value of the "GPU UUID" line of the driver's
// information file, if it is a GPU UUID ("GPU-" and more, no space or
// control character).
func parseDriverUUID(info string) string {
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "GPU UUID" {
			continue
		}
		if v = strings.TrimSpace(v); strings.HasPrefix(v, "GPU-") && len(v) > len("GPU-") && !strings.ContainsFunc(v, notUUIDRune) {
			return v
		}
	}
	return ""
}

// notUUIDRune is a character no driver UUID holds: a space or a control
// character (a file with a carriage return or another byte inside the
// UUID is not read as a UUID).
func notUUIDRune(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }

// cdiDevices is what the CDI specs hold for the configured kind.
type cdiDevices struct {
	// byName maps a device name of the kind to the host path of its spec.
	byName map[string]string
	// errs are the loader's errors, one per spec, with host paths.
	errs []string
}

// spec returns the host path of the spec whose device names the GPU, by
// its index or its UUID. A GPU bound to no driver has neither.
func (d *cdiDevices) spec(g gpu) (string, bool) {
	if g.index < 0 {
		return "", false
	}
	for _, n := range []string{strconv.Itoa(g.index), g.uuid} {
		if p, ok := d.byName[n]; ok && n != "" {
			return p, true
		}
	}
	return "", false
}

// maxCDISpec bounds a CDI spec file: nvidia-ctk's spec for eight GPUs is
// under 100 KiB.
const maxCDISpec = 8 << 20

// checkSpecFiles refuses, before the CDI cache reads them (whole, with
// os.ReadFile), the files of a spec directory that the cache would read
// (*.json, *.yaml, through a symlink too) and that are not regular files
// or are larger than maxCDISpec: the read of a FIFO waits for a writer,
// and a huge file is held in memory whole; and those this process may not
// open (EACCES, EPERM), which the cache would only note beside a spec it
// did not find. dir is the host's path, for
// the message; hostDir the same under the host root.
func checkSpecFiles(dir, hostDir string, ents []fs.DirEntry) error {
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		fi, err := os.Stat(filepath.Join(hostDir, e.Name()))
		if err != nil {
			continue // gone, or a symlink to nothing: the cache reports it
		}
		name := filepath.Join(dir, e.Name())
		switch {
		case fi.IsDir():
			// A symlink to a directory: the cache's read fails on it.
		case !fi.Mode().IsRegular():
			return fmt.Errorf("CDI spec %s: not a regular file (%s)", name, fi.Mode().Type())
		case fi.Size() > maxCDISpec:
			return fmt.Errorf("CDI spec %s: larger than %d bytes, the most read", name, maxCDISpec)
		default:
			// A spec this process may not read (`check` without sudo,
			// a spec root's alone) is there all the same, and
			// containerd reads it: not a GPU without a spec. The
			// cache would only note the read error.
			f, _, err := openNoWait(filepath.Join(hostDir, e.Name()))
			if err == nil {
				f.Close()
				continue
			}
			if errors.Is(err, fs.ErrPermission) {
				var pe *fs.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return fmt.Errorf("CDI spec %s: %w", name, err)
			}
		}
	}
	return nil
}

// newCDICache is the CDI cache of dirs, refreshed once, not watching them;
// p is the panic of the CDI loader, if it panicked: it does on a spec with
// a null entry in a list of pointers (a device node, mount or hook given
// as a bare "-", as a write torn after the dash leaves it): specs-go's
// requiresV050 dereferences the nil *DeviceNode.
func newCDICache(dirs []string) (cache *cdi.Cache, p any, err error) {
	defer func() {
		if p = recover(); p != nil {
			cache, err = nil, nil
		}
	}()
	cache, err = cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	return cache, nil, err
}

// panickingSpec finds the spec file the CDI loader panicked on, reading
// each as the cache does (*.json and *.yaml, not directories, in order),
// and names it, with the host's path, in the error: a spec that the loader
// cannot read without a panic is refused as a FIFO is, the check Unknown
// naming the file, not CheckPanicked naming none. p is the cache's panic.
func (c *gpuActivationCheck) panickingSpec(dirs []string, p any) error {
	for i, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".json" && ext != ".yaml") {
				continue
			}
			if sp := readSpecPanic(filepath.Join(dir, e.Name())); sp != nil {
				return fmt.Errorf("CDI spec %s: the CDI loader panics reading it (a null entry in a list?): %v", filepath.Join(c.dirs[i], e.Name()), sp)
			}
		}
	}
	return fmt.Errorf("the CDI loader panicked: %v", p)
}

// readSpecPanic is the panic of cdi.ReadSpec of path, or nil.
func readSpecPanic(path string) (p any) {
	defer func() { p = recover() }()
	cdi.ReadSpec(path, 0)
	return nil
}

// linksInRoot is, for a spec directory d of the host (resolved is its path
// under the host root, ents its entries) that holds spec files that are
// symbolic links, a directory of this process's own in which each spec file
// of d is a link to that file as the host resolves it under the root
// (openat2's RESOLVE_IN_ROOT): the CDI cache follows a link from the
// daemon's own /, so the host's /etc/cdi/nvidia.yaml -> /opt/cdi/nvidia.yaml
// was the daemon's /opt/cdi/nvidia.yaml, absent, and its GPUs
// CDISpecMissing. A link that does not resolve so (to nothing) is kept as
// it is, for the cache to report. "" (and done a no-op) with root "/", with
// no such link in d, or where the directory cannot be made (the file as
// before). done removes the directory.
func linksInRoot(root, d, resolved string, ents []fs.DirEntry) (view string, done func()) {
	done = func() {}
	if root == "" || root == "/" || !slices.ContainsFunc(ents, func(e fs.DirEntry) bool { return e.Type()&fs.ModeSymlink != 0 }) {
		return "", done
	}
	tmp, err := os.MkdirTemp("", "autopilot-health-cdi-")
	if err != nil {
		return "", done
	}
	done = func() { os.RemoveAll(tmp) }
	for _, e := range ents {
		if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue // what the cache does not read
		}
		target := filepath.Join(resolved, e.Name())
		if e.Type()&fs.ModeSymlink != 0 {
			target = hostio.InRoot(root, filepath.Join(d, e.Name()))
		}
		if err := os.Symlink(target, filepath.Join(tmp, e.Name())); err != nil {
			done()
			return "", func() {}
		}
	}
	return tmp, done
}

// loadCDI reads the spec directories (under the host root, their links
// resolved as the host resolves them: hostio.InRoot) with the CDI cache, refreshed
// once, without watching them. A directory that does not
// exist holds no spec; one that cannot be read is an error (the cache would
// skip it silently), and so is a spec file that is not a regular file or is
// too large (checkSpecFiles).
func (c *gpuActivationCheck) loadCDI() (*cdiDevices, error) {
	dirs := make([]string, len(c.dirs))
	for i, d := range c.dirs {
		dirs[i] = hostio.InRoot(c.env.Config.HostRoot, d)
		ents, err := os.ReadDir(dirs[i])
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("CDI spec directory: %w", err)
		}
		if view, done := linksInRoot(c.env.Config.HostRoot, d, dirs[i], ents); view != "" {
			defer done()
			dirs[i] = view
			if ents, err = os.ReadDir(view); err != nil {
				return nil, fmt.Errorf("CDI spec directory: %w", err)
			}
		}
		if err := checkSpecFiles(d, dirs[i], ents); err != nil {
			return nil, err
		}
	}
	cache, p, err := newCDICache(dirs)
	if p != nil {
		return nil, c.panickingSpec(dirs, p)
	}
	if err != nil {
		return nil, err
	}
	// The cache's paths are under the host root; the messages name the
	// host's own.
	hostPath := func(s string) string {
		for i, d := range dirs {
			if d != c.dirs[i] {
				s = strings.ReplaceAll(s, d+"/", c.dirs[i]+"/")
			}
		}
		return s
	}
	out := &cdiDevices{byName: map[string]string{}}
	prefix := c.kind + "="
	for _, q := range cache.ListDevices() {
		name, ok := strings.CutPrefix(q, prefix)
		if !ok {
			continue
		}
		if d := cache.GetDevice(q); d != nil {
			out.byName[name] = hostPath(d.GetSpec().GetPath())
		}
	}
	for path, errs := range cache.GetErrors() {
		path = hostPath(path)
		for _, e := range errs {
			// A parse error names its file, a validation error does not.
			msg := hostPath(e.Error())
			if !strings.Contains(msg, strconv.Quote(path)) {
				msg = path + ": " + msg
			}
			out.errs = append(out.errs, msg)
		}
	}
	// A conflict is recorded for both of its specs, naming both: once is
	// enough.
	slices.Sort(out.errs)
	out.errs = slices.Compact(out.errs)
	return out, nil
}
