// Package packaging holds the Debian package of the daemon (deb/build.sh);
// these tests build it for amd64 and arm64 and check what an OS image gets:
// its files and modes, lintian, reproducibility, and its life in a dpkg root.
package packaging

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The binaries every test packages, built once per run.
var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binary returns the static daemon for goarch, built as the Makefile builds
// it (both architectures on the first call).
func binary(t *testing.T, goarch string) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "autopilot-health-deb-"); binErr != nil {
			return
		}
		for _, a := range []string{"amd64", "arm64"} {
			for _, c := range []string{"autopilot-health", "autopilot-health-privileged"} {
				cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=1.2.3",
					"-o", filepath.Join(binDir, a, c), "../cmd/"+c)
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+a)
				if out, err := cmd.CombinedOutput(); err != nil {
					binErr = fmt.Errorf("go build %s for %s: %v\n%s", c, a, err, out)
					return
				}
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, goarch, "autopilot-health")
}

func needDpkgDeb(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		testenv.Skip(t, "dpkg-deb not installed (apt install dpkg)")
	}
}

// hostBinary is the binary this machine runs (build.sh's GEN).
func hostBinary(t *testing.T) string {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		testenv.Skip(t, "no package for "+runtime.GOARCH)
	}
	return binary(t, runtime.GOARCH)
}

// Packages built once per run and shared by the tests that only read them
// (compressing the binary takes a while), by architecture, version and
// environment.
var (
	debMu    sync.Mutex
	debCache = map[string]string{}
)

// buildDeb runs build.sh for goarch; env adds to the environment; it returns
// the package's path (in binDir; tests must not change it).
func buildDeb(t *testing.T, goarch, version string, env ...string) string {
	t.Helper()
	gen := hostBinary(t)
	debMu.Lock()
	defer debMu.Unlock()
	key := strings.Join(append([]string{goarch, version}, env...), " ")
	if deb, ok := debCache[key]; ok {
		return deb
	}
	dir, err := os.MkdirTemp(binDir, "deb-")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"deb/build.sh", binary(t, goarch), dir}
	if version != "" {
		args = append(args, version)
	}
	cmd := exec.Command("bash", args...)
	cmd.Env = append(append(os.Environ(), "GEN="+gen), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build.sh: %v\n%s", err, stderr.String())
	}
	debCache[key] = strings.TrimSpace(string(out))
	return debCache[key]
}

func commitTime(t *testing.T) int64 {
	t.Helper()
	out, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
	if err != nil {
		t.Fatalf("git log: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func extract(t *testing.T, deb string) string {
	t.Helper()
	x := filepath.Join(t.TempDir(), "x")
	if out, err := exec.Command("dpkg-deb", "-R", deb, x).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -R: %v\n%s", err, out)
	}
	return x
}

func gunzip(t *testing.T, path string) ([]byte, *gzip.Header) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b, &zr.Header
}

// The package's entries: path -> mode; every one owned by root.
var wantEntries = map[string]string{
	"./":                                 "drwxr-xr-x",
	"./etc/":                             "drwxr-xr-x",
	"./etc/autopilot-health/":            "drwxr-xr-x",
	"./etc/autopilot-health/config.toml": "-rw-r--r--",
	"./usr/":                             "drwxr-xr-x",
	"./usr/bin/":                         "drwxr-xr-x",
	"./usr/bin/autopilot-health":         "-rwxr-xr-x",
	"./usr/lib/":                         "drwxr-xr-x",
	"./usr/lib/systemd/":                 "drwxr-xr-x",
	"./usr/lib/systemd/system/":          "drwxr-xr-x",
	"./usr/lib/systemd/system/autopilot-health.service":          "-rw-r--r--",
	"./usr/lib/systemd/system/autopilot-health.path":             "-rw-r--r--",
	"./usr/lib/systemd/system-preset/":                           "drwxr-xr-x",
	"./usr/lib/systemd/system-preset/80-autopilot-health.preset": "-rw-r--r--",
	"./usr/share/":                                                 "drwxr-xr-x",
	"./usr/share/doc/":                                             "drwxr-xr-x",
	"./usr/share/doc/autopilot-health/":                            "drwxr-xr-x",
	"./usr/share/doc/autopilot-health/changelog.gz":                "-rw-r--r--",
	"./usr/share/doc/autopilot-health/copyright":                   "-rw-r--r--",
	"./usr/share/lintian/":                                         "drwxr-xr-x",
	"./usr/share/lintian/overrides/":                               "drwxr-xr-x",
	"./usr/share/lintian/overrides/autopilot-health":               "-rw-r--r--",
	"./usr/share/man/":                                             "drwxr-xr-x",
	"./usr/share/man/man8/":                                        "drwxr-xr-x",
	"./usr/share/man/man8/autopilot-health.8.gz":                   "-rw-r--r--",
	"./usr/lib/autopilot-health/":                                  "drwxr-xr-x",
	"./usr/lib/autopilot-health/autopilot-health-privileged":       "-rwxr-xr-x",
	"./usr/lib/systemd/system/autopilot-health-privileged.service": "-rw-r--r--",
	"./usr/lib/systemd/system/autopilot-health-privileged.socket":  "-rw-r--r--",
	"./usr/lib/systemd/system/autopilot-health-refused.service":    "-rw-r--r--",
}

// TestDebianPackage builds the package for amd64 and arm64 (with a umask
// that would leave directories 0700) and checks each: exactly the expected
// entries, modes and owners, every timestamp SOURCE_DATE_EPOCH, the binary
// of its architecture, control, conffiles, md5sums, the man page and
// configuration printed by the binary, the changelog.
func TestDebianPackage(t *testing.T) {
	needDpkgDeb(t)
	const epoch = 1700000000 // 2023-11-14 22:13:20 UTC
	var config, man []byte
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			deb := buildDeb(t, arch, "1.2.3", "SOURCE_DATE_EPOCH="+strconv.Itoa(epoch))
			if filepath.Base(deb) != "autopilot-health_1.2.3_"+arch+".deb" {
				t.Errorf("package file %s", deb)
			}
			cmd := exec.Command("dpkg-deb", "--contents", deb)
			cmd.Env = append(os.Environ(), "TZ=UTC")
			list, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, line := range strings.Split(strings.TrimSpace(string(list)), "\n") {
				f := strings.Fields(line) // mode owner size date time path
				if len(f) != 6 {
					t.Errorf("entry %q", line)
					continue
				}
				mode, owner, when, path := f[0], f[1], f[3]+" "+f[4], f[5]
				seen[path] = true
				if want, ok := wantEntries[path]; !ok {
					t.Errorf("unexpected entry %s", line)
				} else if mode != want {
					t.Errorf("%s: mode %s, want %s", path, mode, want)
				}
				if owner != "root/root" {
					t.Errorf("%s: owner %s", path, owner)
				}
				if when != "2023-11-14 22:13" {
					t.Errorf("%s: time %s, want SOURCE_DATE_EPOCH (2023-11-14 22:13)", path, when)
				}
			}
			for p := range wantEntries {
				if !seen[p] {
					t.Errorf("package lacks %s", p)
				}
			}

			x := extract(t, deb)
			f, err := elf.Open(filepath.Join(x, "usr", "bin", "autopilot-health"))
			if err != nil {
				t.Fatal(err)
			}
			wantMachine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
			if f.Machine != wantMachine {
				t.Errorf("binary is for %s, want %s", f.Machine, wantMachine)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Error("binary has an interpreter: not static")
				}
			}
			f.Close()

			control, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "control"))
			for _, want := range []string{"Package: autopilot-health\n", "Version: 1.2.3\n", "Architecture: " + arch + "\n",
				"Depends: systemd, dbus\n", "Debian 12 (bookworm) and 13 (trixie)"} {
				if !bytes.Contains(control, []byte(want)) {
					t.Errorf("control lacks %q:\n%s", want, control)
				}
			}
			if m := regexp.MustCompile(`(?m)^Installed-Size: (\d+)$`).FindSubmatch(control); m == nil {
				t.Errorf("control has no Installed-Size:\n%s", control)
			} else if n, _ := strconv.Atoi(string(m[1])); n < 1024 {
				t.Errorf("Installed-Size %d KiB: less than the binary", n)
			}
			if b, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "conffiles")); string(b) != "/etc/autopilot-health/config.toml\n" {
				t.Errorf("conffiles %q", b)
			}
			// md5sums: every file but the conffile, each sum right.
			sums, _ := os.ReadFile(filepath.Join(x, "DEBIAN", "md5sums"))
			cmd = exec.Command("md5sum", "--check", "--quiet", "-")
			cmd.Dir, cmd.Stdin = x, bytes.NewReader(sums)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("md5sums: %v\n%s", err, out)
			}
			for p, mode := range wantEntries {
				listed := bytes.Contains(sums, []byte("  "+strings.TrimPrefix(p, "./")+"\n"))
				if want := mode[0] == '-' && !strings.HasPrefix(p, "./etc/"); listed != want {
					t.Errorf("md5sums lists %s: %v, want %v", p, listed, want)
				}
			}

			// The shipped config is valid and, all commented out, means the defaults.
			cfg := filepath.Join(x, "etc", "autopilot-health", "config.toml")
			if out, err := exec.Command(hostBinary(t), "config", "validate", cfg).CombinedOutput(); err != nil {
				t.Errorf("shipped config does not validate: %v\n%s", err, out)
			}
			b, _ := os.ReadFile(cfg)
			checkHeaderValidates(t, b)
			for _, line := range strings.Split(string(b), "\n") {
				if line != "" && !strings.HasPrefix(line, "#") {
					t.Errorf("uncommented line in the shipped config: %q", line)
				}
			}
			// The man page is the binary's own, dated SOURCE_DATE_EPOCH,
			// compressed without a name or time (gzip -9n).
			page, hdr := gunzip(t, filepath.Join(x, "usr", "share", "man", "man8", "autopilot-health.8.gz"))
			want, err := exec.Command(hostBinary(t), "man", "--date", "2023-11-14").Output()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(page, want) {
				t.Errorf("the man page is not what 'autopilot-health man --date 2023-11-14' prints")
			}
			if hdr.Name != "" || !hdr.ModTime.IsZero() {
				t.Errorf("man page gzip header: name %q, time %s (want none: gzip -n)", hdr.Name, hdr.ModTime)
			}
			// The same tree: both architectures ship the same page and configuration.
			if config == nil {
				config, man = b, page
			} else if !bytes.Equal(config, b) || !bytes.Equal(man, page) {
				t.Errorf("%s ships another configuration or man page than amd64", arch)
			}
			cl, _ := gunzip(t, filepath.Join(x, "usr", "share", "doc", "autopilot-health", "changelog.gz"))
			if !regexp.MustCompile(`^autopilot-health \(1\.2\.3\) unstable; urgency=medium\n\n  \* .*\n(?s:.*)\n -- Syself <support@syself\.com>  Tue, 14 Nov 2023 22:13:20 \+0000\n$`).Match(cl) {
				t.Errorf("changelog:\n%s", cl)
			}
		})
	}
}

// TestDebianPackageLintian: Debian's own checks find no error and no
// warning in either package; every override says why, and none is unused.
func TestDebianPackageLintian(t *testing.T) {
	needDpkgDeb(t)
	if _, err := exec.LookPath("lintian"); err != nil {
		testenv.Skip(t, "lintian not installed (apt install lintian)")
	}
	overrides, err := os.ReadFile("deb/lintian-overrides")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(overrides)), "\n")
	for i, line := range lines {
		if !strings.HasPrefix(line, "#") && (i == 0 || !strings.HasPrefix(lines[i-1], "#")) {
			t.Errorf("override without a reason (a comment above it): %q", line)
		}
	}
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			deb := buildDeb(t, arch, "1.2.3", "SOURCE_DATE_EPOCH=1700000000") // TestDebianPackage's
			cmd := exec.Command("lintian", "--display-info", "--fail-on", "error,warning", deb)
			cmd.Dir = t.TempDir()
			out, err := cmd.CombinedOutput()
			t.Logf("lintian:\n%s", out)
			if err != nil {
				t.Errorf("lintian: %v", err)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(line, "E: ") || strings.HasPrefix(line, "W: ") ||
					strings.Contains(line, "unused-override") || strings.Contains(line, "mismatched-override") {
					t.Errorf("lintian: %s", line)
				}
			}
		})
	}
}

// TestDebianPackageReproducible: two builds of one commit, under different
// umasks, one with SOURCE_DATE_EPOCH set to the commit's time and one with
// it unset (build.sh's default), are byte-identical.
func TestDebianPackageReproducible(t *testing.T) {
	needDpkgDeb(t)
	sum := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		return hex.EncodeToString(h[:])
	}
	gen := hostBinary(t)
	build := func(umask, epoch string) string {
		out := t.TempDir()
		cmd := exec.Command("bash", "-c", `umask "$0"; exec bash deb/build.sh "$@"`, umask, binary(t, "arm64"), out)
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "SOURCE_DATE_EPOCH=") {
				cmd.Env = append(cmd.Env, e)
			}
		}
		cmd.Env = append(cmd.Env, "GEN="+gen)
		if epoch != "" {
			cmd.Env = append(cmd.Env, "SOURCE_DATE_EPOCH="+epoch)
		}
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("build.sh: %v\n%s", err, b)
		}
		return strings.TrimSpace(string(b))
	}
	a := build("077", strconv.FormatInt(commitTime(t), 10))
	b := build("022", "")
	if sa, sb := sum(a), sum(b); sa != sb {
		ca, _ := exec.Command("dpkg-deb", "--contents", a).Output()
		cb, _ := exec.Command("dpkg-deb", "--contents", b).Output()
		t.Errorf("two builds differ: sha256 %s and %s\n%s\n%s", sa, sb, ca, cb)
	} else {
		t.Logf("both builds: sha256 %s", sa)
	}
	// build.sh's default is the commit's time: every entry carries it.
	cmd := exec.Command("dpkg-deb", "--contents", b)
	cmd.Env = append(os.Environ(), "TZ=UTC")
	list, _ := cmd.Output()
	want := time.Unix(commitTime(t), 0).UTC().Format("2006-01-02 15:04")
	if n := strings.Count(string(list), want); n != len(wantEntries) {
		t.Errorf("%d of %d entries dated %s (the commit):\n%s", n, len(wantEntries), want, list)
	}
}
