package packaging

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// pathWithoutGo is $PATH less every directory that holds a go command: an
// image build that gets the binaries as artifacts has no Go toolchain.
func pathWithoutGo() string {
	var keep []string
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(d, "go")); err == nil {
			continue
		}
		keep = append(keep, d)
	}
	return strings.Join(keep, string(filepath.ListSeparator))
}

// TestSysextImageOfEachArchitecture builds the system extension of the amd64
// and of the arm64 binary on this machine, with no Go toolchain on PATH and
// GOARCH naming the other architecture (left over from a cross build), and
// with GEN, the binary that runs here, printing the configuration as for
// the Debian package. The image carries the binary it was given and its
// extension-release names that binary's own architecture in systemd's
// names: systemd-sysext refuses an extension whose ARCHITECTURE is not the
// kernel's, and the node then runs no daemon.
func TestSysextImageOfEachArchitecture(t *testing.T) {
	for _, tool := range []string{"mksquashfs", "unsquashfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Skip(t, tool+" not installed (apt install squashfs-tools)")
		}
	}
	gen := hostBinary(t)
	for goarch, want := range map[string]string{"amd64": "x86-64", "arm64": "arm64"} {
		t.Run(goarch, func(t *testing.T) {
			other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[goarch]
			out := t.TempDir()
			cmd := exec.Command("bash", "sysext/build.sh", binary(t, goarch), out, "1.2.3")
			for _, e := range os.Environ() {
				if !strings.HasPrefix(e, "PATH=") && !strings.HasPrefix(e, "GOARCH=") {
					cmd.Env = append(cmd.Env, e)
				}
			}
			cmd.Env = append(cmd.Env, "PATH="+pathWithoutGo(), "GOARCH="+other, "GEN="+gen)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			img, err := cmd.Output()
			if err != nil {
				t.Fatalf("sysext/build.sh: %v\n%s", err, stderr.String())
			}
			x := filepath.Join(t.TempDir(), "x")
			if b, err := exec.Command("unsquashfs", "-no-xattrs", "-d", x, strings.TrimSpace(string(img))).CombinedOutput(); err != nil {
				t.Fatalf("unsquashfs: %v\n%s", err, b)
			}
			rel, err := os.ReadFile(filepath.Join(x, "usr/lib/extension-release.d/extension-release.autopilot-health"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(rel), "\nARCHITECTURE="+want+"\n") {
				t.Errorf("extension-release of the %s binary, want ARCHITECTURE=%s:\n%s", goarch, want, rel)
			}
			for in, packaged := range map[string]string{
				binary(t, goarch): "usr/bin/autopilot-health",
				filepath.Join(filepath.Dir(binary(t, goarch)), "autopilot-health-privileged"): "usr/lib/autopilot-health/autopilot-health-privileged",
			} {
				a, _ := os.ReadFile(in)
				b, err := os.ReadFile(filepath.Join(x, packaged))
				if err != nil || !bytes.Equal(a, b) {
					t.Errorf("/%s is not the %s binary given to build.sh (%v)", packaged, goarch, err)
				}
			}
			def, err := exec.Command(gen, "config", "default").Output()
			if err != nil {
				t.Fatal(err)
			}
			conf, err := os.ReadFile(filepath.Join(x, "usr/share/autopilot-health/config.toml"))
			if err != nil {
				t.Fatal(err)
			}
			checkHeaderValidates(t, conf)
			// Every key of the defaults, commented out.
			keys := 0
			for _, line := range strings.Split(string(def), "\n") {
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				keys++
				if !strings.Contains(string(conf), "\n# "+line+"\n") {
					t.Errorf("config.toml lacks %q commented out", line)
				}
			}
			if keys == 0 {
				t.Fatalf("config default printed no key:\n%s", def)
			}
		})
	}
}

// TestSysextVersionIsThePackages: built from one tree with no version given
// (make sysext, make deb), the extension's SYSEXT_VERSION_ID is the Debian
// package's Version (packaging/deb/version.sh, for both) in os-release's
// characters (0-9 a-z . _ -: "~" and ":" as "_", "+" as "."). The
// extension's own version is SYSEXT_VERSION_ID (os-release(5)); its
// VERSION_ID would name the host OS version it is built for, which ID=_any
// leaves out. Before, the
// extension took git describe --always (a bare hash, or v1.2.3-4-gabc)
// where the package of the same commit said 0.0.0~git<time>.<hash> or
// 1.2.3+4.gabc, and an operator could not match one to the other. Both
// build scripts run as they are; only the archivers, which take most of
// their time, are stand-ins on PATH that keep the one file this test reads
// (DEBIAN/control, the extension-release).
func TestSysextVersionIsThePackages(t *testing.T) {
	gen := hostBinary(t)
	stubs := t.TempDir()
	for name, script := range map[string]string{
		// dpkg-deb --root-owner-group -Zxz --threads-max=1 --build ROOT DEB
		"dpkg-deb": `#!/bin/sh
while [ "$1" != --build ]; do shift; done
cp "$2/DEBIAN/control" "$3"
`,
		// mksquashfs ROOT IMAGE options...
		"mksquashfs": `#!/bin/sh
cp "$1/usr/lib/extension-release.d/extension-release.autopilot-health" "$2"
`,
	} {
		must(t, os.WriteFile(filepath.Join(stubs, name), []byte(script), 0o755))
	}
	field := func(script, key string) string {
		t.Helper()
		cmd := exec.Command("bash", script, gen, t.TempDir())
		cmd.Env = append(os.Environ(), "PATH="+stubs+string(filepath.ListSeparator)+os.Getenv("PATH"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, stderr.String())
		}
		b, err := os.ReadFile(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, key); ok {
				return v
			}
		}
		t.Fatalf("%s wrote no %s line:\n%s", script, key, b)
		return ""
	}
	pkg := field("deb/build.sh", "Version: ")
	ext := field("sysext/build.sh", "SYSEXT_VERSION_ID=")
	if want := strings.NewReplacer("~", "_", ":", "_", "+", ".").Replace(pkg); pkg == "" || ext != want {
		t.Errorf("built from one tree, the extension's SYSEXT_VERSION_ID is %q and the package's Version %q (want %q)", ext, pkg, want)
	} else {
		t.Logf("package %s, extension %s", pkg, ext)
	}
}
