package daemon

import (
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// checkSeries are the series of a check's own in a scrape: its runs,
// durations and loop progress.
func checkSeries(page, check string) []string {
	var out []string
	for line := range strings.SplitSeq(page, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, `check="`+check+`"`) || strings.Contains(line, `loop="check/`+check+`"`) {
			out = append(out, line)
		}
	}
	return out
}

// checkRuns sums check_runs_total of a check in a scrape.
func checkRuns(page, check string) float64 {
	sum := 0.0
	re := regexp.MustCompile(`(?m)^autopilot_health_check_runs_total\{check="` + check + `",result="[a-z]+"\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// A check a reload disables leaves the metrics (README: "it leaves the
// daemon's conditions, the state file, the metrics and the Node"): its
// loop progress, runs and durations are gone from the next scrape, no
// frozen progress timestamp stays for an alert to find; the check a later
// reload enables again makes its series anew.
func TestReloadDropsTheStoppedCheckSeries(t *testing.T) {
	sock := notifySocket(t)
	hup := make(chan os.Signal, 1)
	f := newFileDaemon(t, "", Options{Reload: hup})
	d := f.Daemon
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	reload := func() {
		t.Helper()
		hup <- syscall.SIGHUP
		next(t, sock, "RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
		next(t, sock, "READY=1 after the reload", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	}
	metricsURL := "http://" + f.listen + "/metrics"
	// What readiness announces shows every check's first run; the scrape
	// keeps the texts it encoded (a removal must move their version).
	_, page := get(t, metricsURL)
	series := checkSeries(page, "NodeInfoStale")
	for _, want := range []string{"autopilot_health_check_runs_total{", "autopilot_health_check_duration_seconds_count{", "autopilot_health_loop_last_progress_timestamp_seconds{"} {
		if !strings.Contains(strings.Join(series, "\n"), want) {
			t.Fatalf("before the reload, NodeInfoStale has no %s series:\n%s", want, page)
		}
	}

	f.write(t, "[checks.NodeInfoStale]\nenabled = false\n")
	reload()
	_, page = get(t, metricsURL)
	if left := checkSeries(page, "NodeInfoStale"); len(left) > 0 {
		t.Errorf("NodeInfoStale, disabled by the reload, still has series:\n%s", strings.Join(left, "\n"))
	}
	for _, want := range []string{`check="DiskUsageHigh"`, `loop="check/DiskUsageHigh"`} {
		if !strings.Contains(page, want) {
			t.Errorf("a check the reload kept lost its %s series", want)
		}
	}
	if err := d.Healthy(); err != nil {
		t.Errorf("after the reload: %v", err)
	}

	// Enabled again: fresh series, from its first run since (its loop's
	// progress from the reload that started it).
	f.write(t, "")
	reload()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, page = get(t, metricsURL)
		if strings.Contains(page, `loop="check/NodeInfoStale"`) && checkRuns(page, "NodeInfoStale") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodeInfoStale, enabled again, never made progress:\n%s", page)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := checkRuns(page, "NodeInfoStale"); n != 1 {
		t.Errorf("NodeInfoStale enabled again: %v runs counted, want 1 (its run since)", n)
	}
}

// A check the node's new role no longer has leaves the metrics as one a
// reload disables.
func TestRoleChangeDropsTheStoppedCheckSeries(t *testing.T) {
	sock := notifySocket(t)
	f := newFileDaemon(t, "", Options{})
	d := f.Daemon
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	metricsURL := "http://" + f.listen + "/metrics"
	_, page := get(t, metricsURL)
	if len(checkSeries(page, "ProxyNotServing")) == 0 {
		t.Fatalf("the worker-only check has no series on a worker:\n%s", page)
	}
	d.replanIdentity(report.RoleControlPlane, "test", false, "test")
	_, page = get(t, metricsURL)
	if left := checkSeries(page, "ProxyNotServing"); len(left) > 0 {
		t.Errorf("ProxyNotServing, not run on a control plane node, still has series:\n%s", strings.Join(left, "\n"))
	}
	if !strings.Contains(page, `loop="check/DiskUsageHigh"`) {
		t.Error("a check the new role keeps lost its loop progress")
	}
}

// A reload that changes nothing applies (it is not refused): the
// configuration in effect was loaded by it, for the metric and for status
// alike (README: "at start, or by the last reload that applied").
func TestNoChangeReloadMovesConfigSince(t *testing.T) {
	f := newFileDaemon(t, "", Options{})
	d := f.Daemon
	loadedAt := func() float64 {
		t.Helper()
		mfs, err := d.Metrics().Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "autopilot_health_config_last_reload_success_timestamp_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("config_last_reload_success_timestamp_seconds not exposed")
		return 0
	}
	agree := func(step string) time.Time {
		t.Helper()
		since := d.Status(time.Now()).Config.Since
		if m := loadedAt(); math.Abs(m-float64(since.UnixNano())/1e9) > 1e-3 {
			t.Errorf("%s: config_last_reload_success_timestamp_seconds %f, status in effect since %v (%f)", step, m, since, float64(since.UnixNano())/1e9)
		}
		return since
	}
	started := agree("at start")
	time.Sleep(20 * time.Millisecond)
	r, err := d.Reload()
	if err != nil || len(r.Keys) != 0 {
		t.Fatalf("the same file again: %v, %v", r.Keys, err)
	}
	if since := agree("after a reload that changed nothing"); !since.After(started) {
		t.Errorf("status: in effect since %v after a reload that applied, %v at start", since, started)
	}
	// A refused reload moves neither.
	before := d.Status(time.Now()).Config.Since
	f.write(t, "[checks.DiskUsageHigh]\nspace_percentt = 3\n")
	time.Sleep(20 * time.Millisecond)
	if _, err := d.Reload(); err == nil {
		t.Fatal("a bad file applied")
	}
	if since := agree("after a refused reload"); !since.Equal(before) {
		t.Errorf("a refused reload moved the configuration's time from %v to %v", before, since)
	}
}

// A daemon started on the default path with no file there runs on the
// embedded defaults, and status says so, not that the path is in effect;
// once the file is written and reloaded, status names it.
func TestStatusSaysTheConfigFileIsAbsent(t *testing.T) {
	f := &fileDaemon{base: testConfig(t), path: filepath.Join(t.TempDir(), "config.toml"), logs: &syncBuffer{}}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	f.listen = ln.Addr().String()
	f.write(t, "")
	cfg, _, err := config.Load(f.path, false)
	if err != nil {
		t.Fatal(err)
	}
	// The start found no file (its values stand in for the defaults: the
	// reload below changes no key).
	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(f.logs, nil))
	env := &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}
	d, err := New(cfg, log, Options{Version: "test", Listener: ln, BootID: "b1", Env: env, ConfigPath: f.path, ConfigOptional: true})
	if err != nil {
		t.Fatal(err)
	}
	if cs := d.Status(time.Now()).Config; cs.File != f.path || !cs.Absent {
		t.Errorf("started without the file: status config %+v, want %s absent", cs, f.path)
	}
	f.write(t, "")
	if _, err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	if cs := d.Status(time.Now()).Config; cs.File != f.path || cs.Absent {
		t.Errorf("reloaded from the file: status config %+v, want %s not absent", cs, f.path)
	}
}

// conditionSeries are the series of a condition in a scrape: its status
// and problem gauges.
func conditionSeries(page, cond string) []string {
	var out []string
	for line := range strings.SplitSeq(page, "\n") {
		if !strings.HasPrefix(line, "#") && (strings.Contains(line, `condition="`+cond+`"`) || strings.Contains(line, `type="`+cond+`"`)) {
			out = append(out, line)
		}
	}
	return out
}

// A check a reload disables before its first run (the first runs spread
// over runner.first_run_spread after a start) had no condition yet, but
// the start made its condition's series at 0: they leave the metrics as
// those of a check that ran, and as at a start with the check disabled
// (README: "it leaves the daemon's conditions, the state file, the
// metrics and the Node").
func TestReloadBeforeTheFirstRunDropsTheConditionSeries(t *testing.T) {
	base := testConfig(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	listen := ln.Addr().String()
	write := func(extra string) {
		t.Helper()
		// The first runs spread over 5 minutes: NodeInfoStale's, not the
		// first check's, is minutes away.
		c := strings.Replace(reloadTOML(base, listen, extra), `first_run_spread = "0s"`, `first_run_spread = "5m"`, 1)
		if err := os.WriteFile(path, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	cfg, _, err := config.Load(path, false)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	env := &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}
	d, err := New(cfg, log, Options{Version: "test", Listener: ln, Env: env, BootID: "b1", ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	if cs := d.currentRunner().Checks(); len(cs) < 2 || cs[0] == "NodeInfoStale" || !slices.Contains(cs, "NodeInfoStale") {
		t.Fatalf("checks %v: NodeInfoStale's first run would not be minutes away", cs)
	}
	runDaemon(t, d)
	metricsURL := "http://" + listen + "/metrics"
	_, page := get(t, metricsURL)
	if _, ran := d.Store().Get("NodeInfoStale"); ran {
		t.Fatal("NodeInfoStale ran already")
	}
	if len(conditionSeries(page, "NodeInfoStale")) == 0 {
		t.Fatalf("before the reload, NodeInfoStale's condition has no series:\n%s", page)
	}

	write("[checks.NodeInfoStale]\nenabled = false\n")
	r, err := d.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Checks.Stopped, []string{"NodeInfoStale"}) {
		t.Fatalf("the reload stopped %v", r.Checks.Stopped)
	}
	_, page = get(t, metricsURL)
	if left := conditionSeries(page, "NodeInfoStale"); len(left) > 0 {
		t.Errorf("NodeInfoStale, disabled before its first run, still has series:\n%s", strings.Join(left, "\n"))
	}
	desc, _ := report.Lookup("NodeInfoStale")
	for _, r := range desc.ProblemReasons {
		if l := grepLines(page, `problem_counter{reason="`+string(r)+`"}`); l != "" {
			t.Errorf("NodeInfoStale, disabled before its first run, still counts its problems:\n%s", l)
		}
	}
	if len(conditionSeries(page, "DiskUsageHigh")) == 0 {
		t.Error("a condition the reload kept lost its series")
	}
}
