//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// idleConfig: every check at its default, on a healthy node: the stand-in
// kubelet answers /healthz, Debian's containerd serves CRI.
const idleConfig = `# written by tests/idle_bench_test.go
node_name = %[3]q
role = "worker"
gpu = "false"
[metrics]
listen_address = "127.0.0.1:%[1]d"
[checks.KubeletUnhealthy]
healthz_url = "http://127.0.0.1:%[2]d/healthz"
[kubernetes]
kubeconfig = %[4]q
`

// BenchmarkIdleOnAHealthyNode measures the daemon's idle CPU under its
// shipped unit in a real systemd, every check at its default interval, on
// a node where the checks of the units find nothing: the stand-in kubelet
// healthy, Debian's containerd serving CRI, D-Bus and journald up, a
// stand-in tunnel agent unit active. Cilium's API, kube-proxy's metrics,
// the tunnel agent's page and NTP are not here: those probes (30 s and
// 1 min) fail at connecting, a little cheaper than a healthy answer would
// be. The kernel log monitor
// reads the machine's /dev/kmsg (other work writing there costs it too);
// the daemon reports to the tests' real kube-apiserver with the node's
// credentials, as on a node (IDLE_STANDALONE=1: no Kubernetes reporting).
// After the first pass and IDLE_WARMUP (30s), over IDLE_WINDOW (120s): the
// CPU of the daemon's threads (schedstat) in ms/min, that of its unit's
// cgroup (unit-cpu-ms/min: the threads and the processes the daemon starts,
// journalctl for KubeletHeartbeatFailed), the times its threads
// waited (most of an idle daemon's CPU on a VM is waking up) and were
// preempted per minute, its VmRSS at the end, and the heap it allocated
// (MB/min) and its garbage collections per minute (from its go_* metrics,
// read just outside the window); and its privileged helper's CPU (its
// slice's cpu.stat, systemd's work to start it included), starts, running
// share and VmRSS, and the VmRSS of the two. Runs of 2 minutes vary by
// a quarter and more: IDLE_WINDOW=10m for figures to keep. IDLE_ENV sets
// environment for the daemon's unit (IDLE_ENV=GOGC=50).
//
//	go test -tags integration ./tests -run '^$' -bench IdleOnAHealthyNode -benchtime=1x
//
// A profile of the daemon:
//
//	GOFLAGS=-tags=profile IDLE_CPUPROFILE=/tmp/idle.prof go test -tags integration ./tests -run '^$' -bench IdleOnAHealthyNode -benchtime=1x
func BenchmarkIdleOnAHealthyNode(b *testing.B) {
	if why := harness.SystemdAvailable(); why != "" {
		b.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	needContainerd(b)
	warmup, window := envDuration(b, "IDLE_WARMUP", 30*time.Second), envDuration(b, "IDLE_WINDOW", 120*time.Second)
	kubeletPort, metricsPort := freeTCPPort(b), freeTCPPort(b)
	units := map[string]string{
		"kubelet.service":             fmt.Sprintf("[Unit]\nDescription=stand-in kubelet (/healthz)\nDefaultDependencies=no\n\n[Service]\nExecStart=/usr/bin/standin kubelet 127.0.0.1:%d /run/standin/kubelet-broken\n", kubeletPort),
		"syself-tunnel-agent.service": "[Unit]\nDescription=stand-in tunnel agent\nDefaultDependencies=no\n\n[Service]\nExecStart=/bin/sleep infinity\n",
	}
	for k, v := range containerdDropIn {
		units[k] = v
	}
	// IDLE_CPUPROFILE=FILE with GOFLAGS=-tags=profile (the daemon's build
	// then writes a CPU profile of its run, README, Cost): the profile,
	// from start to stop, is copied to FILE.
	profile := os.Getenv("IDLE_CPUPROFILE")
	if profile != "" {
		units["autopilot-health.service.d/20-profile.conf"] = "[Service]\nEnvironment=AUTOPILOT_HEALTH_CPUPROFILE=/var/lib/autopilot-health/cpu.prof\n"
	}
	// IDLE_HEAPPROFILE=FILE with GOFLAGS=-tags=profile: a profile of the
	// heap live at the daemon's stop (GODEBUG=memprofilerate=1 in IDLE_ENV
	// to see every allocation), copied to FILE.
	heapProfile := os.Getenv("IDLE_HEAPPROFILE")
	if heapProfile != "" {
		units["autopilot-health.service.d/22-heapprofile.conf"] = "[Service]\nEnvironment=AUTOPILOT_HEALTH_HEAPPROFILE=/var/lib/autopilot-health/heap.prof\n"
	}
	// IDLE_TRACE=FILE with GOFLAGS=-tags=profile: an execution trace of
	// the daemon's 60 s from 90 s after its start (IDLE_WARMUP and
	// IDLE_WINDOW must reach past them), copied to FILE at the end.
	traceOut := os.Getenv("IDLE_TRACE")
	if traceOut != "" {
		units["autopilot-health.service.d/21-trace.conf"] = "[Service]\nEnvironment=AUTOPILOT_HEALTH_TRACE=/var/lib/autopilot-health/trace.out\n"
	}
	// IDLE_ENV: environment for the daemon's unit (a drop-in's
	// Environment=, e.g. IDLE_ENV=GOGC=50), to see what a runtime setting
	// costs.
	if env := os.Getenv("IDLE_ENV"); env != "" {
		units["autopilot-health.service.d/30-bench-env.conf"] = "[Service]\nEnvironment=" + env + "\n"
	}
	// The helper in a slice of its own: the slice's cpu.stat sums the CPU
	// of all its starts, systemd's setting up of each included, where its
	// own cgroup goes with each exit. Nothing else about it changes.
	units["autopilot-health-privileged.service.d/50-bench-slice.conf"] = "[Service]\nSlice=benchhelper.slice\n"
	s, _ := shippedUnitSystemd(b, "autopilot-health-idle-", units, true)
	ctx := context.Background()
	node, kubeconfig := "idle-"+harness.Token(), ""
	if os.Getenv("IDLE_STANDALONE") == "" {
		api := apiServer(b)
		registerNode(b, api, node)
		installNodeKubeconfig(b, s, api, node)
		kubeconfig = "/etc/autopilot-health/kubeconfig"
	}
	startContainerd(b, s)
	for _, u := range []string{"kubelet.service", "syself-tunnel-agent.service"} {
		if err := s.StartUnit(ctx, u); err != nil {
			b.Fatal(err)
		}
	}
	cfg := s.Root("/etc/autopilot-health/config.toml")
	os.MkdirAll(filepath.Dir(cfg), 0o755)
	// IDLE_EXTRA: more TOML for the configuration (a check disabled, to
	// see what it costs).
	if err := os.WriteFile(cfg, fmt.Appendf(fmt.Appendf(nil, idleConfig, metricsPort, kubeletPort, node, kubeconfig), "%s\n", os.Getenv("IDLE_EXTRA")), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		b.Fatalf("start: %v\n%s", err, s.Journal("autopilot-health.service"))
	}
	p, err := s.Properties(ctx, "autopilot-health.service", "Service")
	if err != nil {
		b.Fatal(err)
	}
	pid, _ := p["MainPID"].Value().(uint32)
	proc, _, err := hostStatus(s, pid)
	if err != nil {
		b.Fatal(err)
	}
	// The conditions a healthy node holds False: the probes found nothing.
	// (The daemon's first pass asked its privileged helper, which runs from
	// then on.)
	for _, ty := range []string{"KubeletUnhealthy", "ContainerRuntimeUnhealthy", "NodeServiceDown", "ServiceNotRecovering"} {
		eventually(b, 30*time.Second, ty+" False", func() (bool, string) {
			page, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
			if err != nil {
				return false, err.Error()
			}
			v, ok := metricValue(page, fmt.Sprintf(`autopilot_health_condition_status{condition=%q,status="False"}`, ty))
			return ok && v == 1, lastBytes(s.Journal("autopilot-health.service"), 2000)
		})
	}
	// The heap allocated and the collections, from the daemon's own
	// metrics, read outside the window (a scrape costs CPU): before the
	// warm-up and after VmRSS is read.
	runtimeStats := func() (alloc, gcs float64) {
		page, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil {
			b.Fatal(err)
		}
		alloc, _ = metricValue(page, "go_memstats_alloc_bytes_total")
		gcs, _ = metricValue(page, "go_gc_duration_seconds_count")
		return alloc, gcs
	}
	at := time.Now()
	alloc0, gc0 := runtimeStats()
	time.Sleep(warmup - time.Since(at))          // the measurement's own pace: nothing to await
	helperSlice := s.Cgroup("benchhelper.slice") // no dash: a dash nests a slice
	// The daemon's unit's cgroup: its threads and the processes it starts
	// (journalctl for KubeletHeartbeatFailed), which its threads' figures
	// do not count; systemctl status shows this one.
	unitCgroup := s.Cgroup("system.slice/autopilot-health.service")
	b.ResetTimer()
	threads0, at0 := threadStats(b, proc), time.Now()
	helperID := helperInvocation(ctx, s)
	helper0, unit0 := cgroupCPU(b, helperSlice), cgroupCPU(b, unitCgroup)
	// The helper may come and go (a crash and restart, or a helper that
	// exits when idle, as a trial had it): once a second, is it running,
	// is it a new start, its VmRSS.
	helper := watchHelper(ctx, s, window, helperID)
	threads1, at1 := threadStats(b, proc), time.Now()
	helper1, unit1 := cgroupCPU(b, helperSlice), cgroupCPU(b, unitCgroup)
	if id := helperInvocation(ctx, s); id != "" && id != helper.last {
		helper.starts++ // in the window's last second
	}
	b.StopTimer()
	all0, all1 := total(threads0), total(threads1)
	// Each thread's share (the runtime's sysmon is the second thread, the
	// main thread's id + 1).
	for tid, t1 := range threads1 {
		t0 := threads0[tid]
		b.Logf("thread %s: %.2f ms/min CPU, %.0f waits/min", tid, float64(t1.cpu-t0.cpu)/1e6/at1.Sub(at0).Minutes(), float64(t1.waits-t0.waits)/at1.Sub(at0).Minutes())
	}
	rss := statusMiB(proc, "VmRSS")
	// What the daemon's VmRSS is made of: memory of its own (heap,
	// stacks) and pages of its binary (page cache the kernel can take
	// back).
	rssAnon, rssFile := statusMiB(proc, "RssAnon"), statusMiB(proc, "RssFile")
	alloc1, gc1 := runtimeStats()
	if traceOut != "" {
		raw, err := os.ReadFile(s.Root("/var/lib/autopilot-health/trace.out"))
		if err != nil {
			b.Fatalf("no trace (was the daemon built with GOFLAGS=-tags=profile, and the window long enough?): %v", err)
		}
		if err := os.WriteFile(traceOut, raw, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if profile != "" || heapProfile != "" {
		if err := s.StopUnit(ctx, "autopilot-health.service"); err != nil {
			b.Fatal(err)
		}
		for _, p := range [][2]string{{profile, "cpu.prof"}, {heapProfile, "heap.prof"}} {
			if p[0] == "" {
				continue
			}
			raw, err := os.ReadFile(s.Root("/var/lib/autopilot-health/" + p[1]))
			if err != nil {
				b.Fatalf("no profile (was the daemon built with GOFLAGS=-tags=profile?): %v", err)
			}
			if err := os.WriteFile(p[0], raw, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	// IDLE_JOURNAL=FILE: the daemon's journal, copied to FILE at the end
	// (what a diagnostic build of the daemon wrote to its stderr: README,
	// "Where the idle minute's wake-ups go").
	if f := os.Getenv("IDLE_JOURNAL"); f != "" {
		if err := os.WriteFile(f, []byte(s.Journal("autopilot-health.service")), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(all1.cpu-all0.cpu)/1e6/at1.Sub(at0).Minutes(), "cpu-ms/min")
	b.ReportMetric(float64(unit1-unit0)/1e6/at1.Sub(at0).Minutes(), "unit-cpu-ms/min")
	b.ReportMetric(float64(all1.waits-all0.waits)/at1.Sub(at0).Minutes(), "waits/min")
	b.ReportMetric(float64(all1.preempted-all0.preempted)/at1.Sub(at0).Minutes(), "preempted/min")
	b.ReportMetric(rss, "VmRSS-MiB")
	b.ReportMetric(rssAnon, "RssAnon-MiB")
	b.ReportMetric(rssFile, "RssFile-MiB")
	// The privileged helper beside it (a process of its own, with
	// systemd's work to start it): its CPU, its starts, the share of the
	// window it ran, its largest VmRSS, and the two processes' VmRSS
	// averaged over the window (the daemon's at its end).
	b.ReportMetric(float64(helper1-helper0)/1e6/at1.Sub(at0).Minutes(), "helper-cpu-ms/min")
	b.ReportMetric(float64(helper.starts)/at1.Sub(at0).Minutes(), "helper-starts/min")
	b.ReportMetric(helper.running, "helper-running-share")
	b.ReportMetric(helper.maxRSS, "helper-VmRSS-MiB")
	b.ReportMetric(rss+helper.meanRSS, "pair-VmRSS-MiB")
	// Over the warm-up and the window.
	b.ReportMetric((alloc1-alloc0)/1e6/time.Since(at).Minutes(), "alloc-MB/min")
	b.ReportMetric((gc1-gc0)/time.Since(at).Minutes(), "gc/min")
	b.ReportMetric(0, "ns/op")
}

// cgroupCPU is the CPU used in the cgroup dir and below, in ns (cpu.stat's
// usage_usec; a removed child's usage stays counted in its parent).
func cgroupCPU(b *testing.B, dir string) int64 {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("%s: %q", dir, line)
			}
			return us * 1000
		}
	}
	b.Fatalf("no usage_usec in %s/cpu.stat", dir)
	return 0
}

// helperInvocation is the InvocationID of the privileged helper's unit in
// s, "" if systemd does not answer.
func helperInvocation(ctx context.Context, s *harness.Systemd) string {
	p, err := s.Properties(ctx, "autopilot-health-privileged.service", "Unit")
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%x", p["InvocationID"].Value())
}

// helperWatch is what watchHelper saw of the privileged helper.
type helperWatch struct {
	last            string  // the last InvocationID seen
	starts          int     // invocations begun
	running         float64 // the share of samples it ran in
	maxRSS, meanRSS float64 // its largest VmRSS, and its VmRSS averaged over all samples (0 while not running), in MiB
}

// watchHelper samples the privileged helper's unit in s once a second for
// d: each new invocation (after the one named first) is a start; two
// within one second count as one.
func watchHelper(ctx context.Context, s *harness.Systemd, d time.Duration, first string) (w helperWatch) {
	last := first
	var samples, running int
	var rssSum float64
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Second) { // the sampling's own pace
		id := helperInvocation(ctx, s)
		if id == "" {
			continue
		}
		sp, _ := s.Properties(ctx, "autopilot-health-privileged.service", "Service")
		pid, _ := sp["MainPID"].Value().(uint32)
		samples++
		if last != "" && id != last {
			w.starts++
		}
		last = id
		if pid == 0 {
			continue
		}
		proc, _, err := hostStatus(s, pid)
		if err != nil {
			continue
		}
		running++
		rss := statusMiB(proc, "VmRSS")
		rssSum += rss
		w.maxRSS = max(w.maxRSS, rss)
	}
	w.last = last
	if samples > 0 {
		w.running, w.meanRSS = float64(running)/float64(samples), rssSum/float64(samples)
	}
	return w
}

// statusMiB is the field of /proc/PID/status (a size in kB) of the
// process whose /proc directory is proc, in MiB; 0 when it cannot be read
// (a helper that has just exited).
func statusMiB(proc, field string) float64 {
	kb, _ := statusKB(proc, field)
	return float64(kb) / 1024
}

// schedstat is the CPU time of a process's threads, in ns.
func schedstat(b *testing.B, proc string) int64 {
	b.Helper()
	return total(threadStats(b, proc)).cpu
}

// threadStat is a thread's CPU (ns, schedstat) and how often it was
// switched out: waits (voluntary: mostly the daemon's own wake-ups) and
// preempted (nonvoluntary: mostly other work on the machine).
type threadStat struct{ cpu, waits, preempted int64 }

// threadStats is each of a process's threads' threadStat, by id.
func threadStats(b *testing.B, proc string) map[string]threadStat {
	b.Helper()
	tasks, err := filepath.Glob(filepath.Join(proc, "task", "*"))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("no threads under %s: %v", proc, err)
	}
	out := map[string]threadStat{}
	for _, dir := range tasks {
		var t threadStat
		raw, err := os.ReadFile(filepath.Join(dir, "schedstat"))
		if err != nil {
			continue // a thread gone
		}
		fmt.Sscan(string(raw), &t.cpu)
		raw, _ = os.ReadFile(filepath.Join(dir, "status"))
		for line := range strings.SplitSeq(string(raw), "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch k {
			case "voluntary_ctxt_switches":
				t.waits, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			case "nonvoluntary_ctxt_switches":
				t.preempted, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		out[filepath.Base(dir)] = t
	}
	return out
}

// total is the sum of the threads' stats.
func total(threads map[string]threadStat) (t threadStat) {
	for _, s := range threads {
		t.cpu, t.waits, t.preempted = t.cpu+s.cpu, t.waits+s.waits, t.preempted+s.preempted
	}
	return t
}

// envDuration is the duration in the environment variable name, or def.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}
