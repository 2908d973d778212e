package packaging

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// wantSysextEntries: README ("As a system extension") lists what the image
// holds, everything under /usr, with these modes.
var wantSysextEntries = map[string]string{
	"":                          "drwxr-xr-x",
	"/usr":                      "drwxr-xr-x",
	"/usr/bin":                  "drwxr-xr-x",
	"/usr/bin/autopilot-health": "-rwxr-xr-x",
	"/usr/lib":                  "drwxr-xr-x",
	"/usr/lib/autopilot-health": "drwxr-xr-x",
	"/usr/lib/autopilot-health/autopilot-health-privileged":           "-rwxr-xr-x",
	"/usr/lib/extension-release.d":                                    "drwxr-xr-x",
	"/usr/lib/extension-release.d/extension-release.autopilot-health": "-rw-r--r--",
	"/usr/lib/systemd":                                                     "drwxr-xr-x",
	"/usr/lib/systemd/system":                                              "drwxr-xr-x",
	"/usr/lib/systemd/system/autopilot-health.service":                     "-rw-r--r--",
	"/usr/lib/systemd/system/autopilot-health.path":                        "-rw-r--r--",
	"/usr/lib/systemd/system/autopilot-health-refused.service":             "-rw-r--r--",
	"/usr/lib/systemd/system/autopilot-health-privileged.socket":           "-rw-r--r--",
	"/usr/lib/systemd/system/autopilot-health-privileged.service":          "-rw-r--r--",
	"/usr/lib/systemd/system/multi-user.target.d":                          "drwxr-xr-x",
	"/usr/lib/systemd/system/multi-user.target.d/10-autopilot-health.conf": "-rw-r--r--",
	"/usr/lib/systemd/system-preset":                                       "drwxr-xr-x",
	"/usr/lib/systemd/system-preset/80-autopilot-health.preset":            "-rw-r--r--",
	"/usr/share":                              "drwxr-xr-x",
	"/usr/share/autopilot-health":             "drwxr-xr-x",
	"/usr/share/autopilot-health/config.toml": "-rw-r--r--",
}

// TestSysextImageEntries: the image holds exactly what README lists, every
// entry root's with its mode and every time SOURCE_DATE_EPOCH, whatever the
// umask of the build (077 here); its extension-release says ID=_any,
// SYSEXT_ID, SYSEXT_VERSION_ID and EXTENSION_RELOAD_MANAGER=1; and two
// builds of the same binary are the same bytes.
func TestSysextImageEntries(t *testing.T) {
	for _, tool := range []string{"mksquashfs", "unsquashfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Skip(t, tool+" not installed (apt install squashfs-tools)")
		}
	}
	bin := hostBinary(t)
	build := func(umask string) []byte {
		t.Helper()
		out := t.TempDir()
		cmd := exec.Command("bash", "-c", "umask "+umask+" && exec bash sysext/build.sh \"$0\" \"$1\" 1.2.3", bin, out)
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000", "TZ=UTC")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		img, err := cmd.Output()
		if err != nil {
			t.Fatalf("sysext/build.sh: %v\n%s", err, stderr.String())
		}
		b, err := os.ReadFile(strings.TrimSpace(string(img)))
		must(t, err)
		return b
	}
	a, b := build("022"), build("077")
	if !bytes.Equal(a, b) {
		t.Errorf("two builds of the same binary (umask 022, 077) differ")
	}
	img := filepath.Join(t.TempDir(), "autopilot-health.raw")
	must(t, os.WriteFile(img, b, 0o644))
	cmd := exec.Command("unsquashfs", "-lls", "-d", "", img)
	cmd.Env = append(os.Environ(), "TZ=UTC")
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("unsquashfs -lls: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(list), "\n") {
		f := strings.Fields(line) // mode owner size date time path
		if len(f) == 5 && strings.HasPrefix(f[0], "d") {
			f = append(f, "") // the root entry: -d "" names it with nothing
		}
		if len(f) != 6 || (f[0][0] != 'd' && f[0][0] != '-' && f[0][0] != 'l') {
			continue // unsquashfs's own lines
		}
		mode, owner, when, p := f[0], f[1], f[3]+" "+f[4], f[5]
		seen[p] = true
		if want, ok := wantSysextEntries[p]; !ok {
			t.Errorf("unexpected entry %s", line)
		} else if mode != want {
			t.Errorf("%q: mode %s, want %s", p, mode, want)
		}
		if owner != "root/root" {
			t.Errorf("%q: owner %s", p, owner)
		}
		if when != "2023-11-14 22:13" {
			t.Errorf("%q: time %s, want SOURCE_DATE_EPOCH (2023-11-14 22:13)", p, when)
		}
	}
	for p := range wantSysextEntries {
		if !seen[p] {
			t.Errorf("the image lacks %q", p)
		}
	}
	x := filepath.Join(t.TempDir(), "x")
	if out, err := exec.Command("unsquashfs", "-no-xattrs", "-d", x, img).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, out)
	}
	rel, err := os.ReadFile(filepath.Join(x, "usr/lib/extension-release.d/extension-release.autopilot-health"))
	must(t, err)
	for _, want := range []string{"ID=_any\n", "\nSYSEXT_ID=autopilot-health\n", "\nSYSEXT_VERSION_ID=1.2.3\n", "\nEXTENSION_RELOAD_MANAGER=1\n",
		"\nARCHITECTURE=" + map[string]string{"amd64": "x86-64", "arm64": "arm64"}[runtime.GOARCH] + "\n"} {
		if !strings.Contains("\n"+string(rel), "\n"+strings.TrimPrefix(want, "\n")) {
			t.Errorf("extension-release lacks %q:\n%s", strings.TrimSpace(want), rel)
		}
	}
	dropIn, err := os.ReadFile(filepath.Join(x, "usr/lib/systemd/system/multi-user.target.d/10-autopilot-health.conf"))
	must(t, err)
	if !strings.Contains(string(dropIn), "\nUpholds=autopilot-health.path\n") {
		t.Errorf("the multi-user.target drop-in does not uphold the path unit:\n%s", dropIn)
	}
}
