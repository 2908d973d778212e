//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// benchGather is the reader's gathering time in BenchmarkKmsgReader: the
// daemon's unless KMSG_GATHER says otherwise (a duration, 0 for off).
var benchGather = func() time.Duration {
	if v := os.Getenv("KMSG_GATHER"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			panic("KMSG_GATHER: " + err.Error())
		}
		return d
	}
	return kmsg.GatherTime
}()

// kmsgWriterEnv makes the test binary a kernel log writer (see
// BenchmarkKmsgReader): "lines,rate,token"; it writes and exits.
const kmsgWriterEnv = "AUTOPILOT_HEALTH_KMSG_BENCH_WRITER"

func init() {
	spec := os.Getenv(kmsgWriterEnv)
	if spec == "" {
		return
	}
	if err := writeKmsgPaced(spec); err != nil {
		fmt.Fprintln(os.Stderr, "kmsg writer:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// benchNoise is what no rule matches (network, audit and filesystem lines
// of a busy node), 19 lines in 20 as in ../shared/bench/kmsg-flood.
var benchNoise = []string{
	"IPv6: ADDRCONF(NETDEV_CHANGE): lxc8f2a1c3b4d5e: link becomes ready",
	"eth0: renamed from tmp4b1c2",
	`audit: type=1400 audit(1700000000.123:4242): apparmor="DENIED" operation="open" profile="cri-containerd.apparmor.d" name="/proc/sys/kernel/random/boot_id" pid=4242 comm="python3"`,
	"cni0: port 3(veth6f1e2d3c) entered forwarding state",
	"overlayfs: idmapped layers are currently not supported",
}

// writeKmsgPaced writes lines to /dev/kmsg at rate lines/s (0: as fast as
// it can), opening the device for each line (the kernel rate-limits what
// one open file writes). Every 20th line, and the last, match a temp rule.
func writeKmsgPaced(spec string) error {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		return fmt.Errorf("want lines,rate,token, got %q", spec)
	}
	n, err := strconv.Atoi(parts[0])
	if err != nil {
		return err
	}
	rate, err := strconv.ParseFloat(parts[1], 64)
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
				time.Sleep(d)
			}
		}
		line := benchNoise[i%len(benchNoise)]
		if i%20 == 19 || i == n-1 {
			line = fmt.Sprintf("EXT4-fs warning (device %s): bench line %d written at %d", parts[2], i, monoUsec())
		}
		if err := harness.WriteKmsg(line); err != nil {
			return err
		}
	}
	return nil
}

// latencies records, for each event of the bench's token, how long after
// its line was written it reached the store: the writer puts the time of
// the write (CLOCK_MONOTONIC, the clock of both processes) in the line. The
// kernel's own timestamp of a record is not that clock (local_clock
// drifts from it by a millisecond or so on this machine).
type latencies struct {
	mu    sync.Mutex
	token string
	lat   []time.Duration
	bad   int // events without a valid time of writing
	last  chan struct{}
}

func (l *latencies) ConditionChanged(*report.Condition, report.Condition) {}
func (l *latencies) ConditionRestored(report.Condition)                   {}
func (l *latencies) EventEmitted(ev report.Event) {
	if !strings.Contains(ev.Message, l.token) {
		return
	}
	now := monoUsec()
	if strings.HasSuffix(ev.Message, " last") {
		close(l.last)
		return
	}
	_, at, _ := strings.Cut(ev.Message, " written at ")
	usec, err := strconv.ParseUint(at, 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || usec > now {
		l.bad++
		return
	}
	l.lat = append(l.lat, time.Duration(now-usec)*time.Microsecond)
}

// monoUsec is CLOCK_MONOTONIC in microseconds, the same in the writer and
// the reader process: read once by a system call, then advanced by
// time.Now's monotonic reading (a clock_gettime system call per line would
// add to the reading process's cost what the daemon does not do).
func monoUsec() uint64 { return monoBase + uint64(time.Since(monoAt)/time.Microsecond) }

var monoAt, monoBase = func() (time.Time, uint64) {
	// Between two readings of time.Now close together: a process
	// preempted in between would be off by as long as it waited.
	for i := 0; ; i++ {
		var ts unix.Timespec
		t1 := time.Now()
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		t2 := time.Now()
		if d := t2.Sub(t1); d < 20*time.Microsecond || i == 1000 {
			return t1.Add(d / 2), uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3
		}
	}
}()

// usage returns this process's CPU time, the part of it in the kernel, and
// how often its threads went to sleep (voluntary context switches: the
// wake-ups that follow).
func usage() (cpu, sys time.Duration, sleeps int64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano()), ru.Nvcsw
}

// BenchmarkKmsgReader measures the kernel log reader on the real /dev/kmsg,
// set up as the daemon runs it (reader, monitor, store, default rules): a
// separate process (this binary again, so its CPU is not counted) writes
// lines at a set pace, 1 in 20 matching a rule. It reports the reading
// process's CPU per line written (cpu-us/line; sys-us/line of it in the
// kernel) and the latency from the
// writing of a matching line to its event in the store (p50-ms,
// p99-ms, over the matching lines), and how often its threads went to sleep
// per line (sleeps/line: each is a wake-up, the cost that batching cuts). Each run writes to the shared kernel
// log: run it with -benchtime=1x.
//
//	go test -tags integration ./tests -run '^$' -bench KmsgReader -benchtime=1x -v
func BenchmarkKmsgReader(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to write /dev/kmsg")
	}
	for _, c := range []struct {
		name  string
		lines int
		rate  float64
	}{
		{"rate=100", 2000, 100},
		{"rate=1000", 20000, 1000},
		{"rate=5000", 20000, 5000},
		{"unthrottled", 20000, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			var cpu, sys, p50, p99 time.Duration
			var sleeps int64
			for range b.N {
				c1, k1, s1, l50, l99 := kmsgReaderTrial(b, c.lines, c.rate)
				cpu, sys, sleeps, p50, p99 = cpu+c1, sys+k1, sleeps+s1, p50+l50, p99+l99
			}
			runs := b.N
			b.ReportMetric(float64(cpu.Microseconds())/float64(runs*c.lines), "cpu-us/line")
			b.ReportMetric(float64(sys.Microseconds())/float64(runs*c.lines), "sys-us/line")
			b.ReportMetric(float64(sleeps)/float64(runs*c.lines), "sleeps/line")
			b.ReportMetric(float64(p50.Microseconds())/float64(runs)/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/float64(runs)/1000, "p99-ms")
		})
	}
}

func kmsgReaderTrial(b *testing.B, lines int, rate float64) (cpu, sys time.Duration, sleeps int64, p50, p99 time.Duration) {
	tok := harness.Token()
	boot, _ := readBootID()
	store := report.NewStore(boot)
	lat := &latencies{token: tok, last: make(chan struct{})}
	store.Observe(lat)
	mon := kmsg.NewMonitor(kmsgOpts(b, store))
	mon.Start(time.Now(), kmsg.BootWall())
	rd := &kmsg.Reader{Path: "/dev/kmsg", Monitor: mon, Log: quiet(), ReadTimeout: 10 * time.Second, Gather: benchGather}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for !mon.Metrics().ReaderUp() {
		if time.Now().After(deadline) {
			b.Fatal("the reader did not open /dev/kmsg")
		}
		time.Sleep(10 * time.Millisecond)
	}
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	w := exec.Command(self)
	w.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%g,%s", kmsgWriterEnv, lines, rate, tok))
	w.Stderr = os.Stderr
	cpu0, sys0, sleeps0 := usage()
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		b.Fatalf("writer: %v", err)
	}
	if err := harness.WriteKmsg(fmt.Sprintf("EXT4-fs warning (device %s): last", tok)); err != nil {
		b.Fatal(err)
	}
	select {
	case <-lat.last:
	case <-time.After(30 * time.Second):
		b.Fatal("the last line did not reach the store in 30 s")
	}
	cpu, sys, sleeps = usage()
	cpu, sys, sleeps = cpu-cpu0, sys-sys0, sleeps-sleeps0
	lat.mu.Lock()
	defer lat.mu.Unlock()
	if want := lines / 20; len(lat.lat) != want || lat.bad > 0 || mon.Metrics().Lost() > 0 {
		b.Fatalf("%d of %d matching lines reached the store (%d without their time), %v records lost", len(lat.lat), want, lat.bad, mon.Metrics().Lost())
	}
	l := slices.Clone(lat.lat)
	slices.Sort(l)
	return cpu, sys, sleeps, l[len(l)/2], l[len(l)*99/100]
}
