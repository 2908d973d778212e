//go:build integration

package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// eventLog collects events whose message contains a token.
type eventLog struct {
	mu     sync.Mutex
	token  string
	events []report.Event
	ch     chan struct{}
}

func newEventLog(token string) *eventLog { return &eventLog{token: token, ch: make(chan struct{}, 1)} }

// runKmsgDaemon runs the daemon on kmsgDaemonConfig, its events logged for
// tok's lines and tok its one critical task, until the test ends, and
// returns once the kernel conditions are False (its reader has the real
// /dev/kmsg open). A hung-task line has room for a token only in the task's
// name: with the default critical tasks, another test's (or another test
// binary's) "INFO: task kubelet:N blocked ..." and the kernel's own would
// set KernelDeadlock, and its message, too.
func runKmsgDaemon(t *testing.T, tok string) (*daemon.Daemon, *eventLog) {
	t.Helper()
	cfg := kmsgDaemonConfig(t)
	cfg.Kmsg.CriticalTasks = []string{tok}
	d, ev := startKmsgDaemon(t, cfg, tok)
	waitFor(t, d.Store(), nil, 10*time.Second, "the kernel conditions to start False", func() bool {
		c, ok := d.Store().Get("ReadonlyFilesystem")
		return ok && c.Status == report.StatusFalse
	})
	return d, ev
}

// startKmsgDaemon runs a daemon on cfg, its metrics on a port of its own
// and its events logged for tok's lines, until the test ends.
func startKmsgDaemon(t *testing.T, cfg *config.Config, tok string) (*daemon.Daemon, *eventLog) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(cfg, quiet(), daemon.Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ev := newEventLog(tok)
	d.Store().Observe(ev)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d, ev
}

func (e *eventLog) ConditionChanged(*report.Condition, report.Condition) {}
func (e *eventLog) ConditionRestored(report.Condition)                   {}
func (e *eventLog) EventEmitted(ev report.Event) {
	if !strings.Contains(ev.Message, e.token) {
		return
	}
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

func (e *eventLog) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.events)
}

// waitFor awaits cond, re-checking whenever the store changes or an event
// arrives, for at most limit.
func waitFor(t *testing.T, store *report.Store, ev *eventLog, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(limit)
	for !cond() {
		var evCh chan struct{}
		if ev != nil {
			evCh = ev.ch
		}
		select {
		case <-store.Changed():
		case <-evCh:
		case <-time.After(100 * time.Millisecond): // the reader's own pace (window ticks)
		case <-deadline:
			t.Fatalf("waiting for %s; conditions: %+v", what, store.All())
		}
	}
}

// kmsgDaemonConfig is the configuration of a daemon that reads the real
// /dev/kmsg: no Kubernetes, no host systemd, no first-run spread, a state
// directory of the test's own; kmsg.kernel_only off (lines written by the
// tests have facility user) and kmsg.from_boot_start off (start at the end:
// earlier tests' lines in the ring, user-written, so they count with
// kernel_only off, would set the conditions first).
func kmsgDaemonConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.NodeName, cfg.Role, cfg.GPU = "kmsg-node", "worker", "false"
	cfg.StateDir = t.TempDir()
	cfg.Kubernetes.Kubeconfig = ""
	cfg.Runner.FirstRunSpread = config.Duration{}
	cfg.Kmsg.KernelOnly = false
	cfg.Kmsg.FromBootStart = false
	noHostSystemd(cfg)
	return cfg
}

func write(t *testing.T, line string) {
	t.Helper()
	if err := harness.WriteKmsg(line); err != nil {
		t.Fatalf("writing to /dev/kmsg: %v", err)
	}
}

// The daemon's monitor reads lines written to the real /dev/kmsg and turns
// them into conditions and events through the runner's state.
func TestKmsgRealDeviceThroughTheDaemon(t *testing.T) {
	harness.HoldExt4Errors(t) // ReadonlyFilesystem's message is to be this test's line: the kernel's remounts carry no token
	tok := harness.Token()
	d, ev := runKmsgDaemon(t, tok)

	waitFor(t, d.Store(), nil, 10*time.Second, "the reader to open /dev/kmsg", func() bool {
		return strings.Contains(scrape(t, d), "autopilot_health_kmsg_reader_up 1")
	})

	ro := fmt.Sprintf("EXT4-fs (%s): Remounting filesystem read-only", tok)
	hung := fmt.Sprintf("INFO: task %s:%d blocked for more than 120 seconds.", tok, 40000+len(tok))
	start := time.Now()
	write(t, ro)
	write(t, hung)
	write(t, fmt.Sprintf("EXT4-fs error (device %s): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0", tok))
	for i := range 5 {
		write(t, fmt.Sprintf("I/O error, dev sd%s, sector %d op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", tok, i))
	}
	waitFor(t, d.Store(), ev, 10*time.Second, "conditions and events from the written lines", func() bool {
		a, _ := d.Store().Get("ReadonlyFilesystem")
		b, _ := d.Store().Get("KernelDeadlock")
		c, _ := d.Store().Get("DisksFailure")
		return a.Message == ro && b.Message == hung && c.Status == report.StatusTrue && ev.count() >= 6
	})
	t.Logf("lines written to visible in the store: %s", time.Since(start).Round(time.Millisecond))
	if c, _ := d.Store().Get("DisksFailure"); !strings.Contains(c.Message, "5 disk I/O errors") || !strings.Contains(c.Message, "sd"+tok) {
		t.Errorf("DisksFailure = %+v", c)
	}
	reasons := map[string]int{}
	ev.mu.Lock()
	for _, e := range ev.events {
		reasons[e.Reason]++
	}
	ev.mu.Unlock()
	if reasons["Ext4Error"] != 1 || reasons["BlockIOError"] != 5 || reasons["TaskHung"] != 1 {
		t.Errorf("events: %v", reasons)
	}
	// The hung task line also emits TaskHung: problem_counter counts it.
	if n, err := testutil.GatherAndCount(d.Metrics().Gatherer(), "problem_counter"); err != nil || n == 0 {
		t.Errorf("problem_counter: %d series, %v", n, err)
	}
	if !strings.Contains(scrape(t, d), `problem_counter{reason="TaskHung"} `) || strings.Contains(scrape(t, d), `problem_counter{reason="TaskHung"} 0`) {
		t.Errorf("problem_counter{reason=TaskHung} not counted")
	}
	if err := d.Healthy(); err != nil {
		t.Errorf("daemon not healthy: %v", err)
	}
}

func scrape(t *testing.T, d *daemon.Daemon) string {
	t.Helper()
	resp, err := http.Get("http://" + d.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func readBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b)), err
}

// A restart within the same boot resumes after the last record handled:
// lines written while the daemon was down are handled, none twice.
func TestKmsgResumeAfterRestart(t *testing.T) {
	tok := harness.Token()
	dir := t.TempDir()
	boot, _ := readBootID()
	run := func(ev *eventLog) (context.CancelFunc, chan struct{}, *report.Store) {
		t.Helper()
		store := report.NewStore(boot)
		store.Observe(ev)
		if _, err := store.Load(dir); err != nil {
			t.Fatal(err)
		}
		o := kmsgOpts(t, store)
		mon := kmsg.NewMonitor(o)
		mon.Start(time.Now(), kmsg.BootWall())
		rd := &kmsg.Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			ReadTimeout: 200 * time.Millisecond}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); store.Save(dir, time.Now()); close(done) }()
		waitFor(t, store, nil, 10*time.Second, "the reader to open /dev/kmsg", mon.Metrics().ReaderUp)
		return cancel, done, store
	}
	ev1 := newEventLog(tok)
	cancel, done, store := run(ev1)
	// The first reader starts at the end: wait until it reads, by writing a
	// line and seeing it.
	write(t, fmt.Sprintf("EXT4-fs warning (device %s): first", tok))
	waitFor(t, store, ev1, 10*time.Second, "line A", func() bool { return ev1.count() == 1 })
	cancel()
	<-done

	write(t, fmt.Sprintf("EXT4-fs warning (device %s): written while down", tok))
	ev2 := newEventLog(tok)
	cancel, done, store = run(ev2)
	defer func() { cancel(); <-done }()
	write(t, fmt.Sprintf("EXT4-fs warning (device %s): after restart", tok))
	waitFor(t, store, ev2, 10*time.Second, "lines B and C", func() bool { return ev2.count() >= 2 })
	// Give a duplicate a chance to show: read until a marker written last arrives.
	write(t, fmt.Sprintf("EXT4-fs warning (device %s): marker", tok))
	waitFor(t, store, ev2, 10*time.Second, "the marker", func() bool { return ev2.count() >= 3 })
	ev2.mu.Lock()
	defer ev2.mu.Unlock()
	var got []string
	for _, e := range ev2.events {
		got = append(got, e.Message[strings.Index(e.Message, ": ")+2:])
	}
	if strings.Join(got, "|") != "written while down|after restart|marker" {
		t.Errorf("after the restart the monitor handled %q", got)
	}
}

func kmsgOpts(t testing.TB, store *report.Store) kmsg.Options {
	t.Helper()
	cfg := config.Default()
	env := &checks.Env{Config: cfg, Role: report.RoleWorker}
	o, err := daemon.KmsgOptions(cfg, env, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.KernelOnly = false
	return o
}

// An unthrottled flood of 100,000 matching lines: the monitor keeps up and
// loses none that the kernel still held; what the ring buffer overwrote
// before anyone could read it is counted, never silently dropped.
func TestKmsgFlood(t *testing.T) {
	const n = 100000
	tok := harness.Token()
	boot, _ := readBootID()
	store := report.NewStore(boot)
	ev := newEventLog(tok)
	store.Observe(ev)
	mon := kmsg.NewMonitor(kmsgOpts(t, store))
	mon.Start(time.Now(), kmsg.BootWall())
	rd := &kmsg.Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, store, nil, 10*time.Second, "the reader to open /dev/kmsg", mon.Metrics().ReaderUp)

	start := time.Now()
	for i := range n {
		write(t, fmt.Sprintf("EXT4-fs warning (device %s): flood line %d", tok, i))
	}
	wrote := time.Since(start)
	write(t, fmt.Sprintf("EXT4-fs warning (device %s): flood end", tok))
	waitFor(t, store, ev, 30*time.Second, "the end of the flood", func() bool {
		ev.mu.Lock()
		defer ev.mu.Unlock()
		return len(ev.events) > 0 && strings.HasSuffix(ev.events[len(ev.events)-1].Message, "flood end")
	})
	handled := ev.count() - 1
	lost := mon.Metrics().Lost()
	t.Logf("flood: %d lines written in %s (%.0f lines/s); handled %d, lost to ring buffer overruns %v",
		n, wrote.Round(time.Millisecond), float64(n)/wrote.Seconds(), handled, lost)
	if float64(handled)+lost < n {
		t.Errorf("handled %d + lost %v < %d written: lines disappeared without being counted", handled, lost, n)
	}
	if handled < n/2 {
		t.Errorf("handled only %d of %d lines: the monitor did not keep up", handled, n)
	}
}

// The disk I/O errors in DisksFailure's window survive a restart within the
// same boot: 3 errors, restart, 2 more errors: DisksFailure.
func TestKmsgIOErrorWindowSurvivesRestart(t *testing.T) {
	tok := harness.Token()
	dir := t.TempDir()
	boot, _ := readBootID()
	run := func() (*report.Store, func()) {
		store := report.NewStore(boot)
		if _, err := store.Load(dir); err != nil {
			t.Fatal(err)
		}
		mon := kmsg.NewMonitor(kmsgOpts(t, store))
		mon.Start(time.Now(), kmsg.BootWall())
		rd := &kmsg.Reader{Path: "/dev/kmsg", Monitor: mon, Log: quiet(), ReadTimeout: 200 * time.Millisecond}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); store.Save(dir, time.Now()); close(done) }()
		waitFor(t, store, nil, 10*time.Second, "the reader to open /dev/kmsg", mon.Metrics().ReaderUp)
		return store, func() { cancel(); <-done }
	}
	ioerr := func(i int) {
		write(t, fmt.Sprintf("I/O error, dev sd%s, sector %d op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", tok, i))
	}
	store, stop := run()
	for i := range 3 {
		ioerr(i)
	}
	waitFor(t, store, nil, 10*time.Second, "3 errors counted", func() bool {
		c, _ := store.Get("DisksFailure")
		return strings.Contains(c.Message, "logged 3 disk I/O errors")
	})
	stop()
	store, stop = run()
	defer stop()
	if c, _ := store.Get("DisksFailure"); !strings.Contains(c.Message, "logged 3 disk I/O errors") {
		t.Errorf("after the restart the window holds: %q", c.Message)
	}
	ioerr(3)
	ioerr(4)
	waitFor(t, store, nil, 10*time.Second, "DisksFailure=True", func() bool {
		c, _ := store.Get("DisksFailure")
		return c.Status == report.StatusTrue
	})
}

// kmsg.from_boot_start = false, through the daemon: a daemon stopped
// before it handled any record (it started at the end of the log, and
// nothing was logged since), then started again, reads the lines logged
// while it was down: the start's position is its cursor, saved like a
// handled record's. Before, it was kept in memory only: the second start
// had no cursor, started at the end again, and the line written between
// the two starts was never read nor counted lost.
func TestKmsgRestartBeforeARecordReadsWhatWasLoggedBetween(t *testing.T) {
	tok := harness.Token()
	cfg := kmsgDaemonConfig(t)
	// start runs the daemon until its reader has read the log to its end;
	// the returned func stops it (cleanly: its final save).
	start := func(ev *eventLog) (*daemon.Daemon, func()) {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		d, err := daemon.New(cfg, quiet(), daemon.Options{Version: "test", Listener: ln})
		if err != nil {
			t.Fatal(err)
		}
		d.Store().Observe(ev)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		stop := func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("daemon: %v", err)
			}
		}
		waitFor(t, d.Store(), nil, 10*time.Second, "the reader to read /dev/kmsg to its end", func() bool {
			c, ok := d.Store().Get("ReadonlyFilesystem")
			return ok && c.Status != report.StatusUnknown && strings.Contains(scrape(t, d), "autopilot_health_kmsg_reader_up 1")
		})
		return d, stop
	}
	ev1 := newEventLog(tok)
	_, stop := start(ev1)
	stop()
	if n := ev1.count(); n != 0 {
		t.Fatalf("the first start handled %d of this test's lines; none was written yet", n)
	}

	write(t, fmt.Sprintf("EXT4-fs warning (device %s): written while down", tok))
	ev2 := newEventLog(tok)
	d, stop := start(ev2)
	defer stop()
	write(t, fmt.Sprintf("EXT4-fs warning (device %s): after restart", tok))
	waitFor(t, d.Store(), ev2, 10*time.Second, "the line written after the restart", func() bool {
		ev2.mu.Lock()
		defer ev2.mu.Unlock()
		for _, e := range ev2.events {
			if strings.HasSuffix(e.Message, ": after restart") {
				return true
			}
		}
		return false
	})
	ev2.mu.Lock()
	defer ev2.mu.Unlock()
	var got []string
	for _, e := range ev2.events {
		got = append(got, e.Message[strings.Index(e.Message, ": ")+2:])
	}
	if strings.Join(got, "|") != "written while down|after restart" {
		t.Errorf("after the restart the daemon handled %q; want the line written while it was down, then the one after", got)
	}
}

// Held against the real /dev/kmsg: a line with a multi-byte UTF-8 name and
// a control character (the kernel writes every byte of both \xNN) sets its
// condition with the message as dmesg shows it (é kept, ESC written
// \x1b); a record whose escaped form is about 4 KiB (900 control bytes,
// near the 1024 bytes the kernel takes in one write) fits the 8 KiB read
// buffer and is matched, and the record after it is a record of its own.
func TestKmsgEscapesAndLongRecordsFromTheRealDevice(t *testing.T) {
	harness.HoldExt4Errors(t) // ReadonlyFilesystem's message is to be this test's line: the kernel's remounts carry no token
	tok := harness.Token()
	d, ev := runKmsgDaemon(t, tok)
	long := fmt.Sprintf("EXT4-fs error (device %s): long %s", tok, strings.Repeat("\x01", 900))
	after := fmt.Sprintf("EXT4-fs warning (device %s): after the long one", tok)
	write(t, long)
	write(t, after)
	write(t, fmt.Sprintf("EXT4-fs (sdé%s\x1b[2J): Remounting filesystem read-only", tok))
	want := fmt.Sprintf(`EXT4-fs (sdé%s\x1b[2J): Remounting filesystem read-only`, tok)
	waitFor(t, d.Store(), ev, 10*time.Second, "the condition and both events", func() bool {
		c, _ := d.Store().Get("ReadonlyFilesystem")
		return c.Status == report.StatusTrue && ev.count() >= 2
	})
	if c, _ := d.Store().Get("ReadonlyFilesystem"); c.Message != want {
		t.Errorf("ReadonlyFilesystem's message = %q, want %q", c.Message, want)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.events) != 2 || ev.events[0].Reason != "Ext4Error" || ev.events[1].Reason != "Ext4Warning" || ev.events[1].Message != after ||
		!strings.HasPrefix(ev.events[0].Message, fmt.Sprintf(`EXT4-fs error (device %s): long \x01\x01`, tok)) {
		t.Errorf("events = %+v", ev.events)
	}
}

// With kmsg.from_boot_start false the daemon begins at the end of the real
// /dev/kmsg: a hung critical task logged just before its start is not read,
// and the kernel conditions' False says so, naming when it began, not that
// this boot's records were read, as DisksFailure's count of the last 10
// minutes does (TestFalseSaysWhatWasRead with a fake device). Before, the
// False said "this boot's, as far as the ring buffer still held them"
// after such a start too, and the count "0 disk I/O errors in the last
// 10m0s".
func TestKmsgStartAtTheEndSaysSoInTheFalse(t *testing.T) {
	tok := harness.Token()
	write(t, fmt.Sprintf("INFO: task %s:%d blocked for more than 120 seconds.", tok, 40000+len(tok)))
	before := time.Now().Truncate(time.Second)
	d, _ := runKmsgDaemon(t, tok)
	after := time.Now()
	// DisksFailure's kernel part is set in an update of its own, after
	// the conditions' False (under -race, make test-race found it not yet
	// set when KernelDeadlock was): both are awaited.
	waitFor(t, d.Store(), nil, 10*time.Second, "KernelDeadlock to be False and DisksFailure's kernel part read", func() bool {
		c, ok := d.Store().Get("KernelDeadlock")
		p, _ := d.Store().Part(report.SourceKmsg, "DisksFailure")
		return ok && c.Status == report.StatusFalse && p.Reason != report.ReasonNoData
	})
	c, _ := d.Store().Get("KernelDeadlock")
	const prefix = "no matching kernel message since the monitor began reading at the end of the kernel log at "
	const suffix = " (kmsg.from_boot_start = false: the records logged before were not read)"
	at, ok := strings.CutPrefix(c.Message, prefix)
	if at, ok = strings.CutSuffix(at, suffix); !ok {
		t.Fatalf("KernelDeadlock False says %q, want %q<time>%q", c.Message, prefix, suffix)
	}
	began, err := time.Parse(time.RFC3339, at)
	if err != nil || began.Before(before) || began.After(after) {
		t.Errorf("the start named in %q is not between %s and %s (%v)", c.Message, before.Format(time.RFC3339), after.Format(time.RFC3339), err)
	}
	// DisksFailure's count covers the errors since that start only, for
	// the window's 10 minutes.
	want := "the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5), read since " + at +
		" only (kmsg.from_boot_start = false: those logged before were not read)"
	if p, _ := d.Store().Part(report.SourceKmsg, "DisksFailure"); p.Message != want {
		t.Errorf("DisksFailure's kernel part says %q, want %q", p.Message, want)
	}
}

// Intel eMCA's extended error log (drivers/acpi/acpi_extlog.c) prints its
// CPER records with a prefix of "{N}" alone, no "[Hardware Error]: ": a
// record's lines, written to the real /dev/kmsg at the levels the driver
// prints them (KERN_INFO for a corrected error, KERN_ERR above), are the
// CPER events and condition as GHES's are. Before, the rules, written for
// "{N}[Hardware Error]: event severity: ...", matched none of them. The
// records' numbers, N, carry the test's token, their first digits: the
// lines have room for no other.
func TestKmsgExtlogCperLinesFromTheRealDevice(t *testing.T) {
	seq := 10 * (10000000 + mathrand.IntN(90000000)) // {seq}, {seq+1} and {seq+2} begin with tok
	tok := "{" + fmt.Sprint(seq/10)
	cfg := kmsgDaemonConfig(t)
	d, ev := startKmsgDaemon(t, cfg, tok)
	waitFor(t, d.Store(), nil, 10*time.Second, "the kernel conditions to start False", func() bool {
		c, ok := d.Store().Get("CperHardwareErrorFatal")
		return ok && c.Status == report.StatusFalse
	})
	lines := []struct {
		level int
		text  string
	}{
		{6, fmt.Sprintf("{%d}Hardware error detected on CPU3", seq)},
		{6, fmt.Sprintf("{%d}It has been corrected by h/w and requires no further action", seq)},
		{6, fmt.Sprintf("{%d}event severity: corrected", seq)},
		{6, fmt.Sprintf("{%d} Error 0, type: corrected", seq)},
		{3, fmt.Sprintf("{%d}Hardware error detected on CPU5", seq+1)},
		{3, fmt.Sprintf("{%d}event severity: recoverable", seq+1)},
		{3, fmt.Sprintf("{%d}event severity: fatal", seq+2)},
	}
	for _, l := range lines {
		if err := harness.WriteKmsgLevel(l.level, l.text); err != nil {
			t.Fatalf("writing %q: %v", l.text, err)
		}
	}
	fatal := lines[len(lines)-1].text
	waitFor(t, d.Store(), ev, 10*time.Second, "CperHardwareErrorFatal True and both events", func() bool {
		c, _ := d.Store().Get("CperHardwareErrorFatal")
		return c.Status == report.StatusTrue && c.Message == fatal && ev.count() >= 2
	})
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.events) != 2 || ev.events[0].Reason != "CperHardwareErrorCorrected" || ev.events[0].Message != lines[2].text ||
		ev.events[1].Reason != "CperHardwareErrorRecoverable" || ev.events[1].Message != lines[5].text {
		t.Errorf("events = %+v", ev.events)
	}
}

// The kernel's line about the BERT records it did not print
// (drivers/acpi/apei/bert.c, 6.0+: at most 5, none of 1 KiB or more),
// written to the real /dev/kmsg at its level (KERN_INFO), is in the
// daemon's log as a warning naming the count: a fatal error of the
// previous boot among those records sets no CperHardwareErrorFatal. The
// count is the test's token (the line has room for no other).
func TestKmsgBERTRecordsNotPrintedAreLogged(t *testing.T) {
	n := 100000000 + mathrand.IntN(900000000)
	cfg := kmsgDaemonConfig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), daemon.Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, d.Store(), nil, 10*time.Second, "the kernel conditions to start False", func() bool {
		c, ok := d.Store().Get("CperHardwareErrorFatal")
		return ok && c.Status == report.StatusFalse
	})
	line := fmt.Sprintf("BERT: [Hardware Error]: Skipped %d error records", n)
	if err := harness.WriteKmsgLevel(6, line); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("records=%d", n)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning with %s in the daemon's log after 10 s:\n%s", want, logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling interval of an awaited log line
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, want) && (!strings.Contains(l, "level=WARN") || !strings.Contains(l, "Boot Error Record Table (BERT)") ||
			!strings.Contains(l, "/sys/firmware/acpi/tables/data/BERT") || !strings.Contains(l, "component=kmsg")) {
			t.Errorf("the warning: %s", l)
		}
	}
	if c, _ := d.Store().Get("CperHardwareErrorFatal"); c.Status != report.StatusFalse {
		t.Errorf("CperHardwareErrorFatal %s after the line", c.Status)
	}
}
