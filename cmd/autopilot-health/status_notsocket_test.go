package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/testenv"
)

// A regular file at the status socket's path comes there in two ways, and
// status's words hold for both: at the daemon's start (it logs that its
// status socket is not served), or while it runs, renamed over its socket's
// file (it logs that the socket is not bound again); either daemon binds
// the socket once the file is moved away, which this test does and sees
// status answer. Before, status said "a daemon that found it at start" in
// the second case too, where the daemon had found it as it ran; and then
// that a daemon that found it at its start served no status until it
// restarted, which it did then. A daemon of this process (daemon.New, Run) with sockets and a
// state directory of its own, and the command as an operator runs it.
func TestStatusOfAFileAtTheSocketPathAtStartOrWhileItRuns(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "the control socket answers root only: run by make test as root (CI)")
	}
	dir := t.TempDir()
	status, control := filepath.Join(dir, "run", "status.sock"), filepath.Join(dir, "run", "control.sock")
	os.MkdirAll(filepath.Dir(status), 0o700)
	want := "autopilot-health status: " + status + " is not a socket but a regular file: the daemon serves no status there; move it away: " +
		"the daemon binds its socket then, whether it found it there at its start or while it ran (its socket's file removed, or renamed over); " +
		"journalctl -u autopilot-health says so\n"
	start := func() (logs *testenv.SyncBuffer, stop func()) {
		cfg := config.Default()
		root := filepath.Join(dir, "root")
		for p, s := range map[string]string{"proc/sys/kernel/random/boot_id": "b00t\n", "proc/self/mountinfo": "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"} {
			os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
			os.WriteFile(filepath.Join(root, p), []byte(s), 0o644)
		}
		cfg.HostRoot, cfg.StateDir, cfg.NodeName, cfg.Role, cfg.GPU = root, filepath.Join(dir, "state"), "n1", "worker", "false"
		cfg.Kubernetes.Kubeconfig, cfg.Kmsg.Enabled, cfg.Status.Socket = "", false, status
		cfg.Runner.FirstRunSpread = config.Duration{}
		cfg.Checks.KubeletUnhealthy.Enabled, cfg.Checks.ContainerRuntimeUnhealthy.Enabled = false, false
		cfg.Checks.ServiceNotRecovering.Enabled, cfg.Checks.NodeServiceDown.Enabled = false, false
		logs = &testenv.SyncBuffer{}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(logs, nil)), daemon.Options{Version: "test", Listener: ln, ControlSocket: control})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		return logs, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the daemon's run: %v", err)
			}
		}
	}
	await := func(what string, ok func() bool, logs *testenv.SyncBuffer) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 20s; the daemon's log:\n%s", what, logs.String())
			}
		}
	}
	answers := func() bool {
		code, _, _ := run(t, "status", "--socket", status)
		return code != exitError
	}

	// While it runs: a file renamed over its socket.
	logs, stop := start()
	await("status answering", answers, logs)
	tmp := filepath.Join(dir, "run", "x")
	if err := os.WriteFile(tmp, []byte("not a socket\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, status); err != nil {
		t.Fatal(err)
	}
	await("log that the status socket is not bound again", func() bool {
		return strings.Contains(logs.String(), "status socket's file was removed while the daemon ran, and is not bound again")
	}, logs)
	if code, out, errs := run(t, "status", "--socket", status); code != exitError || out != "" || errs != want {
		t.Errorf("a file renamed over the socket while the daemon ran: exit %d, stdout %q, stderr\n%q\nwant exit 2 and\n%q", code, out, errs, want)
	}
	// Moved away: bound again, as the words say.
	if err := os.Remove(status); err != nil {
		t.Fatal(err)
	}
	await("status answering once the file is moved away", answers, logs)
	stop()

	// At its start: the file there before it.
	if err := os.WriteFile(status, []byte("not a socket\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logs, stop = start()
	defer stop()
	await("log that the status socket is not served", func() bool { return strings.Contains(logs.String(), "status socket not served") }, logs)
	if code, out, errs := run(t, "status", "--socket", status); code != exitError || out != "" || errs != want {
		t.Errorf("a file at the socket's path at the daemon's start: exit %d, stdout %q, stderr\n%q\nwant exit 2 and\n%q", code, out, errs, want)
	}
	// Moved away: bound, as the words say, without a restart.
	if err := os.Rename(status, filepath.Join(dir, "run", "moved-away")); err != nil {
		t.Fatal(err)
	}
	await("status answering once the file found at the start is moved away", answers, logs)
}
