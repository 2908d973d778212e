package checks

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// cpuNow is this process's user+system CPU time.
func cpuNow(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdlePass runs every check of the default configuration once per
// iteration against this host (host_root "/", no systemd: the checks that
// need D-Bus fail at once), as a node's idle daemon runs them. Each
// sub-benchmark reports the CPU of one run (cpu-us/run) and, weighted by the
// check's default interval, its CPU per minute of idle (cpu-ms/min); the
// sum is what the checks cost an idle daemon on this host. README, Cost.
func BenchmarkIdlePass(b *testing.B) {
	cfg := config.Default()
	env := &Env{Config: cfg, NodeName: "bench", Role: report.RoleWorker, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Sys: RealSys(), Now: time.Now}
	var names []string
	for name := range registry {
		if com, ok := cfg.Checks.Common(name); ok && com.Enabled {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		c, err := registry[name](env)
		if err != nil {
			b.Logf("%s: %v", name, err)
			continue
		}
		com, _ := cfg.Checks.Common(name)
		b.Run(name, func(b *testing.B) {
			start := cpuNow(b)
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), com.Timeout.Duration)
				c.Probe(ctx)
				cancel()
			}
			perRun := cpuNow(b) - start
			perRun /= time.Duration(b.N)
			b.ReportMetric(float64(perRun.Microseconds()), "cpu-us/run")
			b.ReportMetric(float64(perRun)/1e6*float64(time.Minute)/float64(com.Interval.Duration), "cpu-ms/min")
		})
	}
}
