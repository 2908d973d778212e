package vmhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// fakeTools puts shell scripts named apt-cache, apt-get, dpkg-deb, depmod
// and xz first on PATH: apt-cache names newPkg, apt-get download fails as
// it does without network, and the others must not run.
func fakeTools(t *testing.T, newPkg string) (calls string) {
	t.Helper()
	bin := t.TempDir()
	calls = filepath.Join(bin, "calls")
	scripts := map[string]string{
		"apt-cache": fmt.Sprintf("echo \"apt-cache $*\" >>%s\nprintf 'linux-image-amd64\\n  Depends: %s\\n'\n", calls, newPkg),
		"apt-get":   fmt.Sprintf("echo \"apt-get $*\" >>%s\necho 'E: Failed to fetch http://deb.debian.org/debian/pool/main/l/linux-signed-amd64/%s.deb  Temporary failure resolving deb.debian.org' >&2\nexit 100\n", calls, newPkg),
		"dpkg-deb":  fmt.Sprintf("echo \"dpkg-deb $*\" >>%s\nexit 1\n", calls),
		"depmod":    fmt.Sprintf("echo \"depmod $*\" >>%s\nexit 1\n", calls),
		"xz":        fmt.Sprintf("echo \"xz $*\" >>%s\nexit 1\n", calls),
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	return calls
}

// cacheKernel lays out an unpacked kernel as FetchKernel leaves it.
func cacheKernel(t *testing.T, cacheDir, ver string) {
	t.Helper()
	root := filepath.Join(cacheDir, "linux-image-"+ver)
	for p, body := range map[string]string{
		"lib/modules/" + ver + "/modules.dep": "kernel/drivers/nvme/host/nvme.ko:\n",
		"boot/vmlinux-" + ver:                 "ELF",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The package lists name a kernel newer than the cached one and the
// download fails: the cached kernel is used, with a line saying why.
func TestFetchKernelFallsBackToCache(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		testenv.Skip(t, "FetchKernel fetches Debian's amd64 kernel; this is "+runtime.GOARCH)
	}
	cache := t.TempDir()
	cacheKernel(t, cache, "6.1.0-57-amd64")
	calls := fakeTools(t, "linux-image-6.1.0-99-amd64")
	var logs []string
	k, err := FetchKernel(cache, func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) })
	if err != nil {
		t.Fatalf("FetchKernel: %v", err)
	}
	if k.Version != "6.1.0-57-amd64" || k.Image != filepath.Join(cache, "linux-image-6.1.0-57-amd64", "boot", "vmlinux-6.1.0-57-amd64") {
		t.Errorf("kernel %+v, want the cached 6.1.0-57-amd64", k)
	}
	if len(logs) != 1 || !strings.Contains(logs[0], "could not fetch the kernel package linux-image-6.1.0-99-amd64") ||
		!strings.Contains(logs[0], "run apt-get update") || !strings.Contains(logs[0], "Temporary failure resolving") ||
		!strings.HasSuffix(logs[0], "using the newest cached kernel linux-image-6.1.0-57-amd64") {
		t.Errorf("log lines %q, want one saying the download failed and the cached kernel is used", logs)
	}
	b, _ := os.ReadFile(calls)
	if got := string(b); !strings.Contains(got, "apt-get download -q linux-image-6.1.0-99-amd64") || strings.Contains(got, "dpkg-deb") {
		t.Errorf("the tools ran:\n%s\nwant apt-get download and no dpkg-deb", got)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 1 {
		t.Errorf("the cache holds %d entries after a failed download, want the one kernel (the temporary directory removed)", len(ents))
	}

	// The newer kernel cached: it is used without a download or a log line.
	cacheKernel(t, cache, "6.1.0-99-amd64")
	logs = nil
	os.Remove(calls)
	k, err = FetchKernel(cache, func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) })
	if err != nil || k.Version != "6.1.0-99-amd64" || len(logs) != 0 {
		t.Errorf("with the named kernel cached: %+v, %v, logs %q", k, err, logs)
	}
	if b, _ := os.ReadFile(calls); strings.Contains(string(b), "apt-get") {
		t.Errorf("apt-get ran with the kernel cached:\n%s", b)
	}
}

// Nothing cached and the download fails: the tier lacks its kernel, and the
// message says what to run.
func TestFetchKernelNothingCached(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		testenv.Skip(t, "FetchKernel fetches Debian's amd64 kernel; this is "+runtime.GOARCH)
	}
	cache := t.TempDir()
	fakeTools(t, "linux-image-6.1.0-99-amd64")
	_, err := FetchKernel(cache, func(f string, a ...any) { t.Errorf("unexpected log line: "+f, a...) })
	var missing *Missing
	if !errors.As(err, &missing) || !strings.Contains(err.Error(), "could not fetch the kernel package linux-image-6.1.0-99-amd64 (run apt-get update") {
		t.Errorf("FetchKernel: %v, want a *Missing suggesting apt-get update", err)
	}
}
