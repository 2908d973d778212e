package packaging

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// unitHelperFlag is the --privileged-helper argument of the shipped
// unit's ExecStart=.
func unitHelperFlag(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "units", "autopilot-health.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ExecStart=/usr/bin/autopilot-health run .*?(--privileged-helper=\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the unit's ExecStart= passes no --privileged-helper")
	}
	return string(m[1])
}

// checkHeaderValidates: the shipped configuration's header names the
// command that checks it as the unit's daemon reads it (every flag of the
// unit's ExecStart= that changes what is refused: --privileged-helper), and
// that command, run on the shipped file, says it is valid, and on the file
// with host_root uncommented to another root refuses it as the unit's run
// does (exit 2). Before, the header said 'autopilot-health config validate
// FILE', which passed such a file: the daemon started on it exited 2.
func checkHeaderValidates(t *testing.T, conf []byte) {
	t.Helper()
	flag := unitHelperFlag(t)
	m := regexp.MustCompile(`(?m)^#   autopilot-health (config validate .*) /etc/autopilot-health/config\.toml$`).FindSubmatch(conf)
	if m == nil {
		t.Fatalf("the shipped configuration's header names no 'autopilot-health config validate ... /etc/autopilot-health/config.toml' line:\n%s", headerOf(conf))
	}
	args := strings.Fields(string(m[1]))
	if !strings.Contains(string(m[1]), flag) {
		t.Errorf("the header's %q lacks the unit's %s", m[1], flag)
	}
	dir := t.TempDir()
	shipped, other := filepath.Join(dir, "config.toml"), filepath.Join(dir, "other-root.toml")
	os.WriteFile(shipped, conf, 0o644)
	edited := strings.Replace(string(conf), "\n# host_root = \"/\"\n", "\nhost_root = \"/srv/other\"\n", 1)
	if edited == string(conf) {
		t.Fatal("the shipped configuration has no '# host_root = \"/\"' line")
	}
	os.WriteFile(other, []byte(edited), 0o644)
	if out, err := exec.Command(hostBinary(t), append(args, shipped)...).CombinedOutput(); err != nil {
		t.Errorf("the header's command on the shipped file: %v\n%s", err, out)
	}
	out, err := exec.Command(hostBinary(t), append(args, other)...).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "host_root") {
		t.Errorf("the header's command on a file with another host_root: %v, %s; want it refused (exit 2), as the unit's run refuses it", err, out)
	}
}

func headerOf(conf []byte) string {
	var h []string
	for _, l := range strings.Split(string(conf), "\n") {
		if l != "#" && !strings.HasPrefix(l, "# ") {
			break
		}
		h = append(h, l)
		if l == "#" {
			break
		}
	}
	return strings.Join(h, "\n")
}
