// Package vmhost is the host side of the VM test tier: it fetches and caches
// Debian's kernel, packs an initramfs (cpio newc, written here) around a
// static Go /init, and boots it under QEMU, reading the guest's result lines
// from the serial console.
package vmhost

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Missing is what the tier lacks on this machine (a tool, the kernel
// package): the test skips naming it (and fails under CI=true).
type Missing struct{ What string }

func (m *Missing) Error() string { return m.What }

// Kernel is Debian's kernel package unpacked with its modules.dep.
type Kernel struct {
	// Root holds boot/vmlinuz-<Version> and lib/modules/<Version>.
	Root    string
	Version string
	// Image is what QEMU boots: the uncompressed vmlinux (PVH entry,
	// about 2.5 s faster under TCG than the bzImage), else the bzImage.
	Image string
}

// ModulesDir is lib/modules/<version> of the kernel.
func (k *Kernel) ModulesDir() string { return filepath.Join(k.Root, "lib", "modules", k.Version) }

// metaPackage is the package whose dependency names the current kernel.
const metaPackage = "linux-image-amd64"

// FetchKernel returns Debian's current kernel (the package linux-image-amd64
// depends on), fetched once with apt-get download, unpacked with dpkg-deb
// and depmod'ed under cacheDir/<package>. apt's package lists are always
// asked which package that is (apt-cache, no network); a kernel already in
// the cache under that name is used without downloading. Where apt knows
// no kernel, or the download fails (no network, the mirror no longer has
// that ABI), the newest cached kernel is used, said with a line to logf.
func FetchKernel(cacheDir string, logf func(format string, a ...any)) (*Kernel, error) {
	if runtime.GOARCH != "amd64" {
		return nil, &Missing{"the VM tier boots Debian's amd64 kernel; this is " + runtime.GOARCH}
	}
	pkg, aptErr := kernelPackage()
	if aptErr != nil {
		if k := newestCached(cacheDir); k != nil {
			logf("%v; using the newest cached kernel %s", aptErr, filepath.Base(k.Root))
			return k, nil
		}
		return nil, aptErr
	}
	dir := filepath.Join(cacheDir, pkg)
	if k, err := openKernel(dir); err == nil {
		return k, nil
	}
	k, err := download(cacheDir, pkg)
	if err == nil {
		return k, nil
	}
	var missing *Missing
	if errors.As(err, &missing) {
		if k := newestCached(cacheDir); k != nil {
			logf("%v; using the newest cached kernel %s", err, filepath.Base(k.Root))
			return k, nil
		}
	}
	return nil, err
}

// download fetches pkg with apt-get download and unpacks it into
// cacheDir/pkg. A missing tool or a failed download is a *Missing.
func download(cacheDir, pkg string) (*Kernel, error) {
	dir := filepath.Join(cacheDir, pkg)
	for _, tool := range []string{"apt-get", "dpkg-deb", "depmod", "xz"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, &Missing{tool + " not found (Debian packages apt, dpkg, kmod, xz-utils)"}
		}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// apt-get download as root drops to _apt, which must be able to write here.
	_ = os.Chmod(tmp, 0o777)
	if err := runIn(tmp, "apt-get", "download", "-q", pkg); err != nil {
		// No network, no mirror, or lists older than the mirror: the
		// tier cannot run here unless a kernel is cached.
		return nil, &Missing{fmt.Sprintf("could not fetch the kernel package %s (run apt-get update; no network needs a cached kernel in %s): %v", pkg, cacheDir, err)}
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s left %d packages in %s", pkg, len(debs), tmp)
	}
	root := filepath.Join(tmp, "root")
	if err := runIn(tmp, "dpkg-deb", "-x", debs[0], root); err != nil {
		return nil, err
	}
	if err := os.Remove(debs[0]); err != nil {
		return nil, err
	}
	ver := strings.TrimPrefix(pkg, "linux-image-")
	if err := runIn(tmp, "depmod", "-b", root, ver); err != nil {
		return nil, err
	}
	bz := filepath.Join(root, "boot", "vmlinuz-"+ver)
	if err := ExtractVmlinux(bz, filepath.Join(root, "boot", "vmlinux-"+ver)); err != nil {
		return nil, err
	}
	// Another test process may have finished first: either copy is whole.
	if err := os.Rename(root, dir); err != nil && !errors.Is(err, os.ErrExist) {
		if _, statErr := os.Stat(dir); statErr != nil {
			return nil, err
		}
	}
	return openKernel(dir)
}

// kernelPackage asks apt which package linux-image-amd64 depends on.
func kernelPackage() (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", &Missing{"apt-cache not found: the VM tier fetches Debian's kernel with apt"}
	}
	out, err := exec.Command("apt-cache", "depends", metaPackage).Output()
	if err != nil {
		return "", &Missing{fmt.Sprintf("apt-cache depends %s: %v (run apt-get update)", metaPackage, err)}
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", &Missing{fmt.Sprintf("apt knows no %s (run apt-get update)", metaPackage)}
}

func openKernel(dir string) (*Kernel, error) {
	ents, err := os.ReadDir(filepath.Join(dir, "lib", "modules"))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		ver := e.Name()
		if _, err := os.Stat(filepath.Join(dir, "lib", "modules", ver, "modules.dep")); err != nil {
			continue
		}
		k := &Kernel{Root: dir, Version: ver, Image: filepath.Join(dir, "boot", "vmlinux-"+ver)}
		if _, err := os.Stat(k.Image); err != nil {
			k.Image = filepath.Join(dir, "boot", "vmlinuz-"+ver)
		}
		if _, err := os.Stat(k.Image); err != nil {
			return nil, err
		}
		return k, nil
	}
	return nil, fmt.Errorf("%s: no lib/modules/<version>/modules.dep", dir)
}

// newestCached returns the newest kernel in the cache, or nil.
func newestCached(cacheDir string) *Kernel {
	dirs, _ := filepath.Glob(filepath.Join(cacheDir, "linux-image-*"))
	var best *Kernel
	var bestTime int64
	for _, d := range dirs {
		k, err := openKernel(d)
		if err != nil {
			continue
		}
		if st, err := os.Stat(d); err == nil && st.ModTime().UnixNano() > bestTime {
			best, bestTime = k, st.ModTime().UnixNano()
		}
	}
	return best
}

func runIn(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// ExtractVmlinux writes the ELF vmlinux inside an XZ-compressed bzImage
// (Debian's CONFIG_KERNEL_XZ) to out. QEMU boots it through its PVH entry
// point (CONFIG_PVH=y), skipping the firmware's loader and the in-guest
// decompressor.
func ExtractVmlinux(bzImage, out string) error {
	b, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	i := bytes.Index(b, []byte("\xfd7zXZ\x00"))
	if i < 0 {
		return fmt.Errorf("%s: no xz payload", bzImage)
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command("xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(b[i:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("xz -dc of %s: %v: %s", bzImage, err, stderr.String())
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
