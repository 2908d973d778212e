package daemon

import (
	"context"
	"fmt"
	"github.com/syself/autopilot-health/internal/testenv"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

// halfFull is a host whose every filesystem is half full.
type halfFull struct{ checks.Sys }

func (halfFull) Statfs(path string, st *unix.Statfs_t) error {
	*st = unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bfree: 500, Bavail: 500, Files: 1000, Ffree: 900}
	return nil
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer = testenv.SyncBuffer

// flapWatch records every status change of a condition after the start.
type flapWatch struct {
	mu      sync.Mutex
	changes []string
}

func (f *flapWatch) ConditionChanged(prev *report.Condition, cur report.Condition) {
	if prev != nil && prev.Status != cur.Status {
		f.mu.Lock()
		f.changes = append(f.changes, fmt.Sprintf("%s %s->%s", cur.Type, prev.Status, cur.Status))
		f.mu.Unlock()
	}
}
func (f *flapWatch) ConditionRestored(report.Condition) {}
func (f *flapWatch) EventEmitted(report.Event)          {}

// reloadTOML is testConfig as a file, with extra appended.
func reloadTOML(cfg *config.Config, listen, extra string) string {
	return fmt.Sprintf(`host_root = %q
state_dir = %q
node_name = %q
role = "worker"
gpu = "false"
[metrics]
listen_address = %q
[status]
socket = ""
[kubernetes]
kubeconfig = ""
[runner]
first_run_spread = "0s"
[kmsg]
enabled = false
[checks.KubeletUnhealthy]
enabled = false
[checks.ContainerRuntimeUnhealthy]
enabled = false
[checks.ServiceNotRecovering]
enabled = false
[checks.NodeServiceDown]
enabled = false
%s`, cfg.HostRoot, cfg.StateDir, cfg.NodeName, listen, extra)
}

// fileDaemon is a daemon started from a configuration file (reloadTOML with
// first), as `run --config` starts it, on a host whose every filesystem is
// half full.
type fileDaemon struct {
	*Daemon
	path, listen string
	logs         *syncBuffer
	base         *config.Config
}

// newFileDaemon builds it; opts gets the listener, the host, the file and
// a boot id.
func newFileDaemon(t *testing.T, first string, opts Options) *fileDaemon {
	t.Helper()
	f := &fileDaemon{base: testConfig(t), path: filepath.Join(t.TempDir(), "config.toml"), logs: &syncBuffer{}}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	f.listen = ln.Addr().String()
	f.write(t, first)
	cfg, _, err := config.Load(f.path, false)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.Version, opts.Listener, opts.BootID, opts.ConfigPath = "test", ln, "b1", f.path
	opts.Env = &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}
	if f.Daemon, err = New(cfg, log, opts); err != nil {
		t.Fatal(err)
	}
	return f
}

// write replaces the file with reloadTOML and extra.
func (f *fileDaemon) write(t *testing.T, extra string) {
	t.Helper()
	if err := os.WriteFile(f.path, []byte(reloadTOML(f.base, f.listen, extra)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs the daemon until the test ends.
func (f *fileDaemon) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Error(err)
		}
	})
}

// SIGHUP reloads the configuration in place, over systemd's reload
// protocol (RELOADING=1 with MONOTONIC_USEC, then READY=1): a changed
// threshold shows in the check's next result while its condition stays
// True since the same time (no flap); a check disabled leaves the store
// and its metric series; a file that does not load, or that changes a key
// needing a restart, is refused with the file, line and key, counted, and
// the daemon runs on as it was; a file without changes says so.
func TestReloadOnSIGHUP(t *testing.T) {
	sock := notifySocket(t)
	hup := make(chan os.Signal, 1)
	f := newFileDaemon(t, "[checks.DiskUsageHigh]\nspace_percent = 40\n", Options{Reload: hup})
	d, path, listen, logs := f.Daemon, f.path, f.listen, f.logs
	write := func(extra string) { f.write(t, extra) }
	flaps := &flapWatch{}
	d.Store().Observe(flaps)
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	before, _ := d.Store().Get("DiskUsageHigh")
	if before.Status != report.StatusTrue || !strings.Contains(before.Message, "50% of space used (threshold 40%)") {
		t.Fatalf("DiskUsageHigh before the reload: %+v", before)
	}
	if _, ok := d.Store().Get("NodeInfoStale"); !ok {
		t.Fatal("NodeInfoStale not evaluated before the reload")
	}
	metricsURL := "http://" + listen + "/metrics"
	loadedAt := func() float64 {
		t.Helper()
		_, page := get(t, metricsURL)
		m := regexp.MustCompile(`(?m)^autopilot_health_config_last_reload_success_timestamp_seconds (\S+)$`).FindStringSubmatch(page)
		if m == nil {
			t.Fatal("config_last_reload_success_timestamp_seconds not exposed")
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	started := loadedAt()
	if started <= 0 {
		t.Errorf("the configuration loaded at start has no time: %v", started)
	}

	reload := func() string {
		t.Helper()
		hup <- syscall.SIGHUP
		rel := next(t, sock, "RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
		if !regexp.MustCompile(`^RELOADING=1\nMONOTONIC_USEC=\d+\n`).MatchString(rel) {
			t.Errorf("reload notification %q", rel)
		}
		return next(t, sock, "READY=1 after the reload", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	}

	// A good file: the threshold changed, NodeInfoStale disabled.
	write("[checks.DiskUsageHigh]\nspace_percent = 45\n[checks.NodeInfoStale]\nenabled = false\n")
	reload()
	await(t, d, "the new threshold in DiskUsageHigh's message", func() bool {
		c, _ := d.Store().Get("DiskUsageHigh")
		return strings.Contains(c.Message, "(threshold 45%)")
	})
	after, _ := d.Store().Get("DiskUsageHigh")
	if after.Status != report.StatusTrue || !after.LastTransitionTime.Equal(before.LastTransitionTime) {
		t.Errorf("DiskUsageHigh across the reload: %s since %v, before %s since %v", after.Status, after.LastTransitionTime, before.Status, before.LastTransitionTime)
	}
	if _, ok := d.Store().Get("NodeInfoStale"); ok {
		t.Error("NodeInfoStale, disabled, is still in the store")
	}
	if slices.Contains(d.live.Loops(), "check/NodeInfoStale") {
		t.Error("the liveness still expects NodeInfoStale's loop (the watchdog would stop)")
	}
	if !strings.Contains(logs.String(), "msg=\"config reloaded from "+path+": checks changed: DiskUsageHigh; stopped: NodeInfoStale\"") {
		t.Errorf("reload log:\n%s", logs.String())
	}
	_, page := get(t, metricsURL)
	for _, want := range []string{`autopilot_health_config_reloads_total{result="ok"} 1`, `autopilot_health_config_last_reload_successful 1`} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(page, `condition="NodeInfoStale"`) {
		t.Error("NodeInfoStale's series are still exposed")
	}
	reloaded := loadedAt()
	if reloaded <= started {
		t.Errorf("config_last_reload_success_timestamp_seconds %v after the reload, %v at start", reloaded, started)
	}

	// A bad file: refused with the text of `config validate`.
	write("[checks.DiskUsageHigh]\nspace_percentt = 3\n")
	_, _, loadErr := config.Load(path, false)
	if loadErr == nil {
		t.Fatal("the bad file loads")
	}
	ready := reload()
	if !strings.Contains(ready, "STATUS=configuration reload refused (running on the previous one): "+path+":25: key checks.DiskUsageHigh.space_percentt") {
		t.Errorf("status after a refused reload: %q", ready)
	}
	if want := fmt.Sprintf("err=%q", loadErr.Error()); !strings.Contains(logs.String(), "configuration reload refused; running on the previous configuration\" "+want) {
		t.Errorf("refusal not logged as %s:\n%s", want, logs.String())
	}
	if !strings.Contains(loadErr.Error(), path+":25: key checks.DiskUsageHigh.space_percentt: unknown key") {
		t.Errorf("the error does not name file, line and key: %v", loadErr)
	}

	// A key that needs a restart: refused as a whole.
	write("[checks.DiskUsageHigh]\nspace_percent = 30\n[detect]\ninterval = \"2m\"\n")
	reload()
	if !strings.Contains(logs.String(), path+":27: key detect.interval: needs a restart (systemctl restart autopilot-health); nothing applied") {
		t.Errorf("restart key refusal not logged:\n%s", logs.String())
	}
	c, _ := d.Store().Get("DiskUsageHigh")
	if !strings.Contains(c.Message, "(threshold 45%)") {
		t.Errorf("a refused reload changed the check: %+v", c)
	}
	if v := loadedAt(); v != reloaded {
		t.Errorf("a refused reload moved config_last_reload_success_timestamp_seconds to %v", v)
	}
	_, page = get(t, metricsURL)
	for _, want := range []string{`autopilot_health_config_reloads_total{result="error"} 2`, `autopilot_health_config_last_reload_successful 0`} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}

	// The same file again: no changes.
	write("[checks.DiskUsageHigh]\nspace_percent = 45\n[checks.NodeInfoStale]\nenabled = false\n")
	reload()
	if !strings.Contains(logs.String(), "msg=\"config reloaded, no changes\" file="+path) {
		t.Errorf("no-change reload not logged:\n%s", logs.String())
	}
	if len(flaps.changes) != 0 {
		t.Errorf("conditions flapped: %v", flaps.changes)
	}
}

// DisksFailure's check disabled by a reload while the kernel log monitor
// runs: the SMART check's part goes, the kernel's part decides alone, as at
// a start with the check disabled.
func TestReloadDisablesOnePartOfACondition(t *testing.T) {
	base := testConfig(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	write := func(extra string) {
		toml := strings.Replace(reloadTOML(base, ln.Addr().String(), extra), "[kmsg]\nenabled = false\n", "[kmsg]\n", 1)
		if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	cfg, _, err := config.Load(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Kmsg.Enabled {
		t.Fatal("the kernel log monitor is off")
	}
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, ConfigPath: path,
		KmsgOpen: func(context.Context, string) (kmsg.Device, error) { return &quietKmsg{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	defer func() { cancel(); <-runErr }()
	await(t, d, "DisksFailure from both parts", func() bool {
		c, _ := d.Store().Get("DisksFailure")
		return strings.Contains(c.Message, "no NVMe drives") && strings.Contains(c.Message, "the kernel logged 0 disk I/O errors")
	})
	write("[checks.DisksFailure]\nenabled = false\n")
	r, err := d.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Checks.Stopped, []string{"DisksFailure"}) {
		t.Errorf("reload stopped %v", r.Checks.Stopped)
	}
	c, ok := d.Store().Get("DisksFailure")
	if !ok || c.Status != report.StatusFalse || strings.Contains(c.Message, "NVMe") || !strings.HasPrefix(c.Message, "the kernel logged 0 disk I/O errors") {
		t.Errorf("DisksFailure after its check was disabled: %+v (held %v)", c, ok)
	}
}

// A reload asked for on the control socket (`autopilot-health reload`, the
// unit's ExecReload=) answers with its outcome, so that `systemctl reload`
// fails for a refused file: a good file answers what changed, a bad one
// its file, line and key, a key that needs a restart names the key; each
// speaks systemd's reload protocol as a signal's reload does, and counts.
func TestReloadOverTheControlSocket(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "the control socket answers root only (TestControlRefusesANonRootPeer)")
	}
	sock := notifySocket(t)
	control := filepath.Join(t.TempDir(), "control.sock")
	f := newFileDaemon(t, "[checks.DiskUsageHigh]\nspace_percent = 40\n", Options{ControlSocket: control})
	d, path, listen, logs := f.Daemon, f.path, f.listen, f.logs
	write := func(extra string) { f.write(t, extra) }
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })

	reload := func() (string, error) {
		t.Helper()
		type answer struct {
			what string
			err  error
		}
		got := make(chan answer, 1)
		go func() { w, err := RequestReload(control); got <- answer{w, err} }()
		next(t, sock, "RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
		next(t, sock, "READY=1 after the reload", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
		a := <-got
		return a.what, a.err
	}

	write("[checks.DiskUsageHigh]\nspace_percent = 45\n")
	if what, err := reload(); err != nil || what != "1 key checks.DiskUsageHigh.space_percent changed; checks changed: DiskUsageHigh" {
		t.Errorf("a good file: %q, %v", what, err)
	}
	if what, err := reload(); err != nil || what != "no changes" {
		t.Errorf("the same file again: %q, %v", what, err)
	}
	write("[checks.DiskUsageHigh]\nspace_percentt = 3\n")
	if what, err := reload(); err == nil || !strings.Contains(err.Error(), path+":25: key checks.DiskUsageHigh.space_percentt: unknown key") {
		t.Errorf("a bad file: %q, %v; want refused with file, line and key", what, err)
	}
	write("[checks.DiskUsageHigh]\nspace_percent = 30\n[detect]\ninterval = \"2m\"\n")
	if what, err := reload(); err == nil || !strings.Contains(err.Error(), path+":27: key detect.interval: needs a restart") {
		t.Errorf("a key that needs a restart: %q, %v", what, err)
	}
	if c, _ := d.Store().Get("DiskUsageHigh"); !strings.Contains(c.Message, "(threshold 45%)") {
		t.Errorf("a refused reload changed the check: %+v", c)
	}
	_, page := get(t, "http://"+listen+"/metrics")
	for _, want := range []string{`autopilot_health_config_reloads_total{result="ok"} 2`, `autopilot_health_config_reloads_total{result="error"} 2`} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if n := strings.Count(logs.String(), "configuration reload refused"); n != 2 {
		t.Errorf("%d refusals logged, want 2:\n%s", n, logs.String())
	}
}

// systemd folds a `systemctl reload` asked for while the unit starts into
// the start job: a file changed before the first pass is over is read once
// the daemon is ready, and applied (a good one) or refused, logged and
// counted (a bad one), with the refusal kept in STATUS= until a reload
// applies.
func TestReloadOfAFileChangedWhileStarting(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		ok          bool
	}{
		{"good", "[checks.DiskUsageHigh]\nspace_percent = 45\n", true},
		{"bad", "[checks.DiskUsageHigh]\nspace_percnt = 45\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := notifySocket(t)
			f := newFileDaemon(t, "[checks.DiskUsageHigh]\nspace_percent = 40\n", Options{})
			d, path, listen, logs := f.Daemon, f.path, f.listen, f.logs
			// Written while the daemon starts (before its first pass).
			f.write(t, tc.extra)
			f.start(t)
			next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
			ready := next(t, sock, "READY=1 after the reload", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
			_, page := get(t, "http://"+listen+"/metrics")
			if tc.ok {
				await(t, d, "the threshold of the file written while starting", func() bool {
					c, _ := d.Store().Get("DiskUsageHigh")
					return strings.Contains(c.Message, "(threshold 45%)")
				})
				if !strings.Contains(page, "autopilot_health_config_reloads_total{result=\"ok\"} 1\n") {
					t.Error("the reload is not counted")
				}
				return
			}
			if !strings.Contains(ready, "STATUS=configuration reload refused (running on the previous one): "+path+":25: key checks.DiskUsageHigh.space_percnt: unknown key") {
				t.Errorf("STATUS after the refusal: %q", ready)
			}
			if !strings.Contains(page, "autopilot_health_config_reloads_total{result=\"error\"} 1\n") {
				t.Error("the refusal is not counted")
			}
			if !strings.Contains(logs.String(), "the configuration file changed while the daemon started") || !strings.Contains(logs.String(), "configuration reload refused") {
				t.Errorf("not logged:\n%s", logs.String())
			}
			if st := d.Status(time.Now()); st.Config.LastReload == nil || st.Config.LastReload.Result != "refused" || st.Config.File != path {
				t.Errorf("status config: %+v", st.Config)
			}
			// The refusal stays in STATUS= as conditions change.
			if s := d.StatusLine(); !strings.HasPrefix(s, "configuration reload refused") {
				t.Errorf("status line %q", s)
			}
		})
	}
}

// At ready the file is compared with what the start or the last reload
// read, not with what is in effect: a file refused during the start and
// put right again before the first pass ends is read again (the refusal
// ends, nothing changes); one left as it was is not refused twice.
func TestReloadAtReadyAfterARefusal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		putRight bool
	}{{"put right", true}, {"left bad", false}} {
		t.Run(tc.name, func(t *testing.T) {
			sock := notifySocket(t)
			good := "[checks.DiskUsageHigh]\nspace_percent = 40\n"
			f := newFileDaemon(t, good, Options{})
			f.write(t, "[checks.DiskUsageHigh]\nspace_percnt = 40\n")
			if _, err := f.Reload(); err == nil {
				t.Fatal("the bad file was not refused")
			}
			if tc.putRight {
				f.write(t, good)
			}
			f.start(t)
			ready := next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
			if tc.putRight {
				next(t, sock, "READY=1 after the reload", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
				if s := f.StatusLine(); strings.Contains(s, "refused") {
					t.Errorf("the refusal stays after the file was put right: %q", s)
				}
				if st := f.Status(time.Now()); st.Config.LastReload == nil || st.Config.LastReload.Result != "ok" || st.Config.LastReload.Changed != "no changes" {
					t.Errorf("last reload %+v", st.Config.LastReload)
				}
			} else if !strings.Contains(ready, "configuration reload refused") {
				t.Errorf("READY=1 without the refusal: %q", ready)
			}
			_, page := get(t, "http://"+f.listen+"/metrics")
			wantOK := map[bool]string{true: "1", false: "0"}[tc.putRight]
			for _, want := range []string{`autopilot_health_config_reloads_total{result="error"} 1`, `autopilot_health_config_reloads_total{result="ok"} ` + wantOK} {
				if !strings.Contains(page, want+"\n") {
					t.Errorf("metrics lack %s", want)
				}
			}
		})
	}
}

// A condition whose check was disabled while the daemon was down leaves at
// the restart, as it leaves at a reload: the state file restores it, and the
// daemon drops it from the store and the metrics (a True left there would
// keep an alert firing), while a condition still evaluated is restored. A
// condition of another role or of a GPU node is dropped too, as the
// reporter removes it from the Node at start (README, "Reporting to
// Kubernetes"): were it kept, the first patch would both set and delete it.
func TestStartDropsRestoredConditionsNoLongerEvaluated(t *testing.T) {
	cfg := testConfig(t)
	prev := report.NewStore("0f6c4a0e-3b1d-4a57-9a3c-5d1f6f0b2c11")
	now := time.Now()
	prev.Set(report.Condition{Type: "ProxyNotServing", Status: report.StatusTrue, Reason: report.ReasonProxyNotReady, Message: "ready 0"}, now)
	prev.Set(report.Condition{Type: "CertRenewalFailing", Status: report.StatusFalse, Reason: report.ReasonCertificatesValid, Message: "ok"}, now)
	prev.Set(report.Condition{Type: "GpuFallenOffBus", Status: report.StatusTrue, Reason: report.ReasonGpuFellOffBus, Message: "NVRM: GPU 0000:01:00.0 has fallen off the bus."}, now)
	prev.Set(report.Condition{Type: "APIServerSourceIPUnavailable", Status: report.StatusFalse, Reason: report.ReasonSourceIPAvailable, Message: "ok"}, now)
	// DisksFailure's two parts; the kernel log monitor is off in this start.
	prev.SetPart(report.SourceKmsg, report.Condition{Type: "DisksFailure", Status: report.StatusTrue, Reason: report.ReasonDiskIOErrors, Message: "5 errors"}, now)
	prev.SetPart(report.SourceCheck, report.Condition{Type: "DisksFailure", Status: report.StatusFalse, Reason: report.ReasonDisksHealthy, Message: "nvme0 ok"}, now)
	if err := prev.Save(cfg.StateDir, now); err != nil {
		t.Fatal(err)
	}
	cfg.Checks.ProxyNotServing.Enabled = false
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := d.Store().Get("ProxyNotServing"); ok {
		t.Errorf("the disabled check's condition was restored: %+v", c)
	}
	if c, ok := d.Store().Get("CertRenewalFailing"); !ok || c.Status != report.StatusFalse {
		t.Errorf("an evaluated condition was not restored: %+v, %v", c, ok)
	}
	if c, ok := d.Store().Part(report.SourceKmsg, "DisksFailure"); ok {
		t.Errorf("the kernel's part of DisksFailure was restored with the kernel log monitor off: %+v", c)
	}
	if c, ok := d.Store().Part(report.SourceCheck, "DisksFailure"); !ok || c.Status != report.StatusFalse {
		t.Errorf("the SMART check's part of DisksFailure was not restored: %+v, %v", c, ok)
	}
	// testConfig's node: a worker without a GPU.
	for _, ty := range []string{"GpuFallenOffBus", "APIServerSourceIPUnavailable"} {
		if c, ok := d.Store().Get(ty); ok {
			t.Errorf("%s restored on a worker without a GPU: %+v", ty, c)
		}
	}
	mfs, err := d.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_condition_status" && mf.GetName() != "problem_gauge" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "condition" || l.GetName() == "type" {
					series[mf.GetName()+"/"+l.GetValue()] = true
				}
			}
		}
	}
	if series["autopilot_health_condition_status/ProxyNotServing"] || series["problem_gauge/ProxyNotServing"] || !series["autopilot_health_condition_status/CertRenewalFailing"] {
		t.Errorf("condition series: %v", series)
	}
}

// The record of the hung calls (checks.Env.Stuck: statfs, lvm, the NVMe
// commands) is made once, where the parts are assembled, and a reload's
// Env and a re-detect's Env carry the same one: the checks they build
// again see the calls still hanging from before. Fails when Assemble makes
// none (nil: each check instance keeps its own, and a reload starts a
// second hung call) or when a reload or re-detect makes a new one.
func TestReloadAndRedetectKeepTheStuckCalls(t *testing.T) {
	f := newFileDaemon(t, "[checks.DiskUsageHigh]\nspace_percent = 40\n", Options{})
	first := f.currentEnv().Stuck
	if first == nil {
		t.Fatal("Assemble made no record of the stuck calls (Env.Stuck nil)")
	}
	f.write(t, "[checks.DiskUsageHigh]\nspace_percent = 45\n")
	if r, err := f.Reload(); err != nil || len(r.Keys) == 0 {
		t.Fatalf("Reload: %+v, %v", r, err)
	}
	if got := f.currentEnv().Stuck; got != first {
		t.Errorf("a reload's Env has another record of the stuck calls (%p, want %p)", got, first)
	}
	f.replanIdentity(report.RoleControlPlane, "test", true, "test")
	if env := f.currentEnv(); env.Role != report.RoleControlPlane || env.Stuck != first {
		t.Errorf("after a re-detect: role %s, record %p, want control-plane and %p", env.Role, env.Stuck, first)
	}
}

// The default path with no file there is the embedded defaults, at start
// and at a reload alike. A file deleted (or moved away) while the daemon
// runs, then reloaded: the refusal says the file is absent and what the
// daemon read instead, not only that keys need a restart, since a restart
// would start on those defaults.
func TestReloadOfADeletedFileSaysItIsAbsent(t *testing.T) {
	f := newFileDaemon(t, "[checks.DiskUsageHigh]\nspace_percent = 40\n", Options{ConfigOptional: true})
	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	_, err := f.Reload()
	if err == nil {
		t.Fatal("the defaults, which change the node's identity keys, applied")
	}
	want := "embedded defaults (" + f.path + " absent): keys host_root"
	if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "need a restart (systemctl restart autopilot-health); nothing applied") {
		t.Errorf("refusal %q, want it to start %q", err, want)
	}
	if !strings.Contains(f.logs.String(), "configuration reload refused; running on the previous configuration\" err=\""+want) {
		t.Errorf("refusal not logged so:\n%s", f.logs.String())
	}
}

// A tamper finding stays set until an operator's clear ("Tamper
// conditions"); a reload that disables its check still removes the
// condition, as any disabled check's, but not silently: the finding it
// takes off the Node is logged as a warning with its message, for the
// audit trail a clear's log line and Event give.
func TestReloadThatDisablesATamperFindingLogsIt(t *testing.T) {
	f := newFileDaemon(t, "", Options{})
	f.start(t)
	await(t, f.Daemon, "the first pass", f.readyNow)
	f.Store().Set(report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged,
		Message: "/etc/kubernetes/manifests/evil.yaml added"}, time.Now())
	f.write(t, "[checks.NodeTampered]\nenabled = false\n")
	r, err := f.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Checks.Stopped, "NodeTampered") {
		t.Fatalf("reload stopped %v", r.Checks.Stopped)
	}
	if _, ok := f.Store().Get("NodeTampered"); ok {
		t.Error("NodeTampered still held after its check was disabled")
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "tamper finding removed") ||
		!strings.Contains(logs, "evil.yaml added") || strings.Count(logs, report.TamperFindingRemovedLog) != 1 {
		t.Errorf("the removed finding is not logged once as a warning with its message:\n%s", logs)
	}
}

// A reload of a file whose max_age or max_error would fix the check's
// answer (config's bounds) is refused with config validate's words, at its
// file, line and key, and logged; nothing of it applies. Reload loads the
// file as run does (config.LoadDigest): the same refusal.
func TestReloadRefusesAValueThatFixesTheAnswer(t *testing.T) {
	f := newFileDaemon(t, "[checks.NodeInfoStale]\nmax_age = \"5m\"\n", Options{})
	for key, extra := range map[string]string{
		"checks.NodeInfoStale.max_age":          "[checks.NodeInfoStale]\nmax_age = \"1ns\"\n",
		"checks.ClockNotSynchronized.max_error": "[checks.ClockNotSynchronized]\nmax_error = \"1ns\"\n",
	} {
		f.write(t, extra)
		data, _ := os.ReadFile(f.path)
		line := strings.Count(string(data[:strings.Index(string(data), "\"1ns\"")]), "\n") + 1
		want := fmt.Sprintf("%s:%d: key %s: must be at least ", f.path, line, key)
		if _, err := f.Reload(); err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), `, got "1ns"`) {
			t.Errorf("reload of %s: %v, want it refused as %q...", key, err, want)
		}
		if !strings.Contains(f.logs.String(), "configuration reload refused; running on the previous configuration\" err=\""+want) {
			t.Errorf("refusal of %s not logged so:\n%s", key, f.logs.String())
		}
	}
	if got := f.Status(time.Now()).Config.LastReload; got == nil || got.Result != "refused" {
		t.Errorf("last reload %+v, want refused", got)
	}
	k := f.currentEnv().Config.Checks
	if k.NodeInfoStale.MaxAge.Duration != 5*time.Minute || k.ClockNotSynchronized.MaxError.Duration != 5*time.Second {
		t.Errorf("in effect after the refusals: max_age %s, max_error %s; want the file's first 5m and the default 5s", k.NodeInfoStale.MaxAge, k.ClockNotSynchronized.MaxError)
	}
}
