package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A SIGHUP before the first pass is done (systemctl reload, or kill -HUP,
// while the unit starts): the reload applies, no RELOADING=1 is sent (it
// would end the start), and READY=1 comes once the first pass of the new
// plan is done: here at once, the reload having left only a check that
// it restarted with first_run_spread 0s, where the file at start spread
// the first runs over 2 minutes.
func TestReloadBeforeReady(t *testing.T) {
	sock := notifySocket(t)
	base := testConfig(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	listen := ln.Addr().String()
	write := func(spread, extra string) {
		c := strings.Replace(reloadTOML(base, listen, extra), `first_run_spread = "0s"`, fmt.Sprintf("first_run_spread = %q", spread), 1)
		if err := os.WriteFile(path, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("2m", "[checks.DiskUsageHigh]\nspace_percent = 40\n")
	cfg, _, err := config.Load(path, false)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	env := &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}
	hup := make(chan os.Signal, 1)
	d, err := New(cfg, log, Options{Version: "test", Listener: ln, Env: env, BootID: "b1", ConfigPath: path, Reload: hup})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.currentRunner().Checks()); n < 3 {
		t.Fatalf("only %d checks: the first pass would not take long", n)
	}
	var off strings.Builder
	for _, name := range config.Default().Checks.Names() {
		if name != "DiskUsageHigh" && !strings.Contains(reloadTOML(base, listen, ""), "[checks."+name+"]") {
			fmt.Fprintf(&off, "[checks.%s]\nenabled = false\n", name)
		}
	}
	write("0s", "[checks.DiskUsageHigh]\nspace_percent = 45\n"+off.String())
	hup <- syscall.SIGHUP
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Error(err)
		}
	}()
	var seen []string
	next(t, sock, "READY=1", func(m string) bool {
		seen = append(seen, strings.SplitN(m, "\n", 2)[0])
		return strings.HasPrefix(m, "READY=1")
	})
	for _, m := range seen {
		if strings.HasPrefix(m, "RELOADING=1") {
			t.Errorf("RELOADING=1 sent before READY=1: %q", seen)
		}
	}
	// READY=1 is sent from within the reload (its Apply ends the first
	// pass), before the reload logs.
	await(t, d, "the reload before ready logged", func() bool {
		return strings.Contains(logs.String(), "config reloaded from "+path)
	})
	c, _ := d.Store().Get("DiskUsageHigh")
	if !strings.Contains(c.Message, "(threshold 45%)") {
		t.Errorf("DiskUsageHigh at READY=1: %+v", c)
	}
	if got := d.currentRunner().Checks(); len(got) != 1 {
		t.Errorf("checks after the reload: %v", got)
	}
}

// status answers while reloads apply (each one disabling or enabling a
// check, changing another's threshold): it never waits for one, and sees
// either plan whole (go test -race: no data race between them).
func TestStatusDuringReloads(t *testing.T) {
	f := newFileDaemon(t, "[checks.DiskUsageHigh]\nspace_percent = 40\n", Options{})
	d := f.Daemon
	write := func(extra string) { f.write(t, extra) }
	f.start(t)
	await(t, d, "DiskUsageHigh evaluated", func() bool { _, ok := d.Store().Get("DiskUsageHigh"); return ok })
	stop := make(chan struct{})
	answered := make(chan int)
	go func() {
		n := 0
		defer func() { answered <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st := d.Status(time.Now())
			if st.Node != "test-node" || len(st.Conditions) == 0 {
				t.Errorf("status during a reload: %+v", st)
				return
			}
			n++
		}
	}()
	for i := range 6 {
		write(fmt.Sprintf("[checks.DiskUsageHigh]\nspace_percent = %d\n[checks.NodeInfoStale]\nenabled = %t\n", 41+i, i%2 == 0))
		if _, err := d.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if n := <-answered; n == 0 {
		t.Error("status never answered during the reloads")
	}
	c, _ := d.Store().Get("DiskUsageHigh")
	if c.Status != report.StatusTrue {
		t.Errorf("DiskUsageHigh after the reloads: %+v", c)
	}
}

// The STATUS= sent with READY=1 after a reload is the summary after it:
// a reload that disables the check of the only problem does not leave
// systemctl status saying "1 problem" (it sent the summary from before the
// reload, after the status loop had sent the new one).
func TestReloadStatusIsTheNewSummary(t *testing.T) {
	sock := notifySocket(t)
	base := testConfig(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	listen := ln.Addr().String()
	var off strings.Builder
	for _, name := range config.Default().Checks.Names() {
		if name != "DiskUsageHigh" && !strings.Contains(reloadTOML(base, listen, ""), "[checks."+name+"]") {
			fmt.Fprintf(&off, "[checks.%s]\nenabled = false\n", name)
		}
	}
	write := func(extra string) {
		if err := os.WriteFile(path, []byte(reloadTOML(base, listen, extra+off.String())), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("[checks.DiskUsageHigh]\nspace_percent = 40\n")
	cfg, _, err := config.Load(path, false)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(&syncBuffer{}, nil))
	env := &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}
	hup := make(chan os.Signal, 1)
	d, err := New(cfg, log, Options{Version: "test", Listener: ln, Env: env, BootID: "b1", ConfigPath: path, Reload: hup})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Error(err)
		}
	}()
	ready := next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	if !strings.Contains(ready, "1 problem (DiskUsageHigh)") {
		t.Fatalf("before the reload: %q", ready)
	}
	write("[checks.DiskUsageHigh]\nenabled = false\n")
	hup <- syscall.SIGHUP
	next(t, sock, "RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
	ready = next(t, sock, "READY=1 after the reload", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	if want := "STATUS=" + d.Summary(); !strings.Contains(ready, want) || strings.Contains(ready, "DiskUsageHigh") {
		t.Errorf("READY=1 after the reload: %q, want %q", ready, want)
	}
}

// systemd reads a notification into 4096 bytes (NOTIFY_BUFFER_MAX) and
// ignores a longer one whole: the READY=1 that ends a reload refused with a
// long error (a bad regular expression is quoted whole) must fit, or the
// unit stays "reloading" until its timeout and `systemctl status` keeps the
// old line. The refusal is cut in STATUS=; the journal and `status` have it.
func TestRefusedReloadNotifiesWithinSystemdsBuffer(t *testing.T) {
	sock := notifySocket(t)
	hup := make(chan os.Signal, 1)
	f := newFileDaemon(t, "", Options{Reload: hup})
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	f.write(t, "[checks.DiskUsageHigh]\nmount_points_exclude = \"^/("+strings.Repeat("a|", 3000)+"\"\n")
	hup <- syscall.SIGHUP
	next(t, sock, "RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
	buf := make([]byte, 64<<10)
	sock.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		n, err := sock.Read(buf)
		if err != nil {
			t.Fatalf("waiting for READY=1 after the refused reload: %v", err)
		}
		m := string(buf[:n])
		if n > 4096 {
			t.Fatalf("a notification of %d bytes, which systemd ignores: %.200q...", n, m)
		}
		if strings.HasPrefix(m, "READY=1") {
			if !strings.Contains(m, "STATUS=configuration reload refused (running on the previous one): "+f.path+":") ||
				!strings.Contains(m, ": key checks.DiskUsageHigh.mount_points_exclude: invalid regular expression") || !strings.HasSuffix(m, f.Summary()) {
				t.Errorf("READY=1 after the refused reload: %.300q", m)
			}
			break
		}
	}
	if got := f.Status(time.Now()).Config.LastReload; got == nil || len(got.Error) < 6000 {
		t.Errorf("status lost the whole refusal: %+v", got)
	}
}
