package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/report"
)

// The helper reads the host's own root: a daemon given one and a fixture
// host root refuses to start, naming the key.
func TestHelperWithAnotherHostRootRefusesToStart(t *testing.T) {
	cfg := testConfig(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	_, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Helper: &privileged.Client{Path: "/nonexistent"}})
	if err == nil || !strings.Contains(err.Error(), "host_root") || !strings.Contains(err.Error(), "--privileged-helper") {
		t.Fatalf("New with a helper and host_root %s: %v", cfg.HostRoot, err)
	}
}

// A kernel log device other than /dev/kmsg is opened in process, and its
// error says why the helper was not asked; /dev/kmsg goes to the helper.
func TestHelperKmsgOpen(t *testing.T) {
	h := &privileged.Client{Path: filepath.Join(t.TempDir(), "none.sock")}
	open := helperKmsgOpen(h)
	if _, err := open(context.Background(), filepath.Join(t.TempDir(), "kmsg")); err == nil || !strings.Contains(err.Error(), "kmsg.device is not /dev/kmsg") {
		t.Errorf("another device: %v", err)
	}
	if _, err := open(context.Background(), "/dev/kmsg"); err == nil || !strings.Contains(err.Error(), "privileged helper") {
		t.Errorf("/dev/kmsg with no helper answering: %v", err)
	}
}

// A reload under the privileged helper (the unit's run) of a file that
// sets a host_root other than "/" is refused for what it is, with the
// words run and config validate --privileged-helper give it: the helper
// reads this host's own root. Before, the reload said only that host_root
// "needs a restart (systemctl restart autopilot-health)", and the restart
// it sent the operator to refused the file, exit 2: the node had no
// health daemon until the file was fixed.
func TestReloadUnderTheHelperRefusesAnotherHostRoot(t *testing.T) {
	base := testConfig(t)
	base.HostRoot = "/"
	f := &fileDaemon{base: base, path: filepath.Join(t.TempDir(), "config.toml"), logs: &syncBuffer{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.listen = ln.Addr().String()
	f.write(t, "")
	cfg, _, err := config.Load(f.path, false)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := Options{Version: "test", Listener: ln, BootID: "b1", ConfigPath: f.path, Helper: &privileged.Client{Path: filepath.Join(t.TempDir(), "none.sock")},
		Env: &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}}
	if f.Daemon, err = New(cfg, log, opts); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := os.WriteFile(f.path, []byte(strings.Replace(reloadTOML(base, f.listen, ""), `host_root = "/"`, fmt.Sprintf("host_root = %q", other), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = f.Reload()
	want := f.path + ":1: key host_root: " + fmt.Sprintf("%q", other) + ": the privileged helper reads this host's own root only; run without --privileged-helper"
	if err == nil || err.Error() != want {
		t.Fatalf("reload of a file with host_root %s under the helper: %v\nwant %s", other, err, want)
	}
}

// A reload that changes host_root to no directory on this host is refused
// as run refuses such a file, naming file, line and key: before, "needs a
// restart (systemctl restart autopilot-health)", and that restart refused
// the file. A host_root changed to a directory still needs a restart.
func TestReloadRefusesAHostRootThatIsNoDirectory(t *testing.T) {
	f := newFileDaemon(t, "", Options{})
	missing := filepath.Join(t.TempDir(), "absent")
	root := fmt.Sprintf("host_root = %q", f.base.HostRoot)
	if err := os.WriteFile(f.path, []byte(strings.Replace(reloadTOML(f.base, f.listen, ""), root, fmt.Sprintf("host_root = %q", missing), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := f.Reload()
	want := f.path + ":1: key host_root: " + fmt.Sprintf("%q", missing) + `: no such directory on this host: every host path, /proc and /sys are read under it ("/" for this host's own root)`
	if err == nil || err.Error() != want {
		t.Fatalf("reload of host_root %s: %v\nwant %s", missing, err, want)
	}
	other := t.TempDir()
	if err := os.WriteFile(f.path, []byte(strings.Replace(reloadTOML(f.base, f.listen, ""), root, fmt.Sprintf("host_root = %q", other), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Reload(); err == nil || !strings.Contains(err.Error(), "key host_root: needs a restart") {
		t.Fatalf("reload of host_root %s, a directory: %v, want needs a restart", other, err)
	}
}
