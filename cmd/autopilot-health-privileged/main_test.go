package main

import (
	"errors"
	"fmt"
	"github.com/syself/autopilot-health/internal/testenv"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/privileged"
)

// Without a socket from systemd and without --listen the helper refuses to
// start, saying how to start it.
func TestNoSocketRefuses(t *testing.T) {
	t.Setenv("LISTEN_PID", "")
	t.Setenv("LISTEN_FDS", "")
	if _, err := listener(""); err == nil || !strings.Contains(err.Error(), "autopilot-health-privileged.socket") {
		t.Errorf("listener with no socket: %v", err)
	}
	if code := run([]string{"--bogus"}, io.Discard); code != 2 {
		t.Errorf("a bad flag: exit %d, want 2", code)
	}
}

// --listen PATH serves there, mode 0600, lets go of its pages at start and
// after requests, and SIGTERM ends it with 0.
func TestListenServesAndStops(t *testing.T) {
	defer func(d time.Duration) { quietFor = d }(quietFor)
	quietFor = 50 * time.Millisecond
	p := filepath.Join(t.TempDir(), "helper.sock")
	done := make(chan int, 1)
	var logs syncBuffer
	go func() { done <- run([]string{"--listen", p, "--debug"}, &logs) }()
	c := &privileged.Client{Path: p}
	var err error
	for range 200 { // the helper listens within a few ms; await it
		// ENOENT before its bind, ECONNREFUSED between its bind and
		// its listen.
		_, err = c.Identify("nvme99")
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "privileged helper") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var re *privileged.RemoteError
	if !errors.As(err, &re) {
		t.Fatalf("no answer from the helper on %s: %v", p, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v %v, want mode 0600", fi, err)
	}
	// The binary's start-up pages let go, as the daemon does.
	if l := logs.String(); !strings.Contains(l, `msg="trimmed the pages of the binary" after=start-up`) {
		t.Errorf("no trim at start in the log:\n%s", l)
	}
	// And, quietFor after the last request, of what the requests touched.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), `msg="trimmed the pages of the binary" after=requests`); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no trim after the requests in the log:\n%s", logs.String())
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d after SIGTERM", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the helper did not stop on SIGTERM")
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer = testenv.SyncBuffer

// The helper lets go quietFor after the last poke: not before the first,
// once for pokes closer together than that, and again after the next.
func TestQuietAfterTheLastPoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		runs := func() int { return int(n.Load()) }
		q := afterQuiet(10*time.Second, func() { n.Add(1) })
		defer q.stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		if runs() != 0 {
			t.Fatalf("%d runs before a poke", runs())
		}
		q.poke()
		time.Sleep(5 * time.Second)
		q.poke() // a burst's next connection closed
		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		if runs() != 0 {
			t.Fatalf("ran %d times within quietFor of the last poke", runs())
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if runs() != 1 {
			t.Fatalf("%d runs quietFor after the last poke, want 1", runs())
		}
		time.Sleep(time.Minute)
		q.poke()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if runs() != 2 {
			t.Fatalf("%d runs after the next burst, want 2", runs())
		}
	})
}

// A request still open when the wait ends (one that outlasted quietFor
// after another closed) is still the burst: no trim until it closes.
func TestNoTrimWithAConnectionOpen(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	letGo(log, func() int { return 1 })
	if l := logs.String(); strings.Contains(l, "trimmed") || !strings.Contains(l, `msg="not trimming the pages of the binary: a connection is open" open=1`) {
		t.Errorf("with a connection open:\n%s", l)
	}
	letGo(log, func() int { return 0 })
	if l := logs.String(); !strings.Contains(l, `msg="trimmed the pages of the binary" after=requests`) {
		t.Errorf("with none open:\n%s", l)
	}
}

// Under systemd (stderr the journal stream, JOURNAL_STREAM naming it) each
// line carries its priority, as the daemon's do: a warning is found by
// journalctl -u autopilot-health-privileged -p warning, and --debug's lines
// are debug, not info. Before, the helper wrote plain text lines, which
// journald files at the unit's SyslogLevel= (info) whatever their level.
func TestJournalLinesCarryTheirPriority(t *testing.T) {
	var st syscall.Stat_t
	if err := syscall.Fstat(2, &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	dir := t.TempDir()
	lvm := filepath.Join(dir, "lvm")
	if err := os.WriteFile(lvm, nil, 0o644); err != nil { // not executable: a warning
		t.Fatal(err)
	}
	var logs syncBuffer
	// No such directory for the socket: an error, and the helper stops.
	if code := run([]string{"--debug", "--lvm", lvm, "--listen", filepath.Join(dir, "none", "helper.sock")}, &logs); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	want := []string{`<4>level=WARN msg="cannot execute lvm`, `<3>level=ERROR msg="no socket to serve"`}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("log:\n%s\nwant %d lines", logs.String(), len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start with %q", i+1, lines[i], w)
		}
	}
	// Outside the journal: text lines, without the prefix.
	t.Setenv("JOURNAL_STREAM", "")
	logs = syncBuffer{}
	run([]string{"--lvm", lvm, "--listen", filepath.Join(dir, "none", "helper.sock")}, &logs)
	if l := logs.String(); !strings.HasPrefix(l, "level=WARN ") {
		t.Errorf("outside the journal:\n%s", l)
	}
}

// panicChildEnv marks the re-executed test binary that panics as the
// helper's process would.
const panicChildEnv = "AUTOPILOT_HEALTH_PRIVILEGED_TEST_PANIC_CHILD"

// Exit 2 is a refused command line, which the unit does not restart
// (RestartPreventExitStatus=2); the Go runtime ends a process on a panic
// no one recovers with exit 2 too by default. The helper ends it by
// SIGABRT, which the unit restarts.
func TestPanicEndsBySignalNotExitTwo(t *testing.T) {
	if os.Getenv(panicChildEnv) != "" {
		syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{})
		crashBySignal() // as main does first
		done := make(chan struct{})
		go func() { panic("a bug in a goroutine of the helper") }()
		<-done
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPanicEndsBySignalNotExitTwo$")
	cmd.Env = append(os.Environ(), panicChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the panicking helper ended with %v, want an abort:\n%s", err, out)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
		t.Errorf("the panicking helper ended with %v (exit status %d), want killed by SIGABRT", err, ws.ExitStatus())
	}
	if !strings.Contains(string(out), "panic: a bug in a goroutine of the helper") {
		t.Errorf("the panic is not on stderr:\n%s", out)
	}
}

// A positional argument is refused like a bad flag: exit 2, said.
func TestUnexpectedArgumentRefuses(t *testing.T) {
	t.Setenv("LISTEN_PID", "")
	t.Setenv("LISTEN_FDS", "")
	var b strings.Builder
	if code := run([]string{"--lvm=/usr/sbin/lvm", "extra"}, &b); code != 2 || !strings.Contains(b.String(), `unexpected argument "extra"`) {
		t.Errorf("an extra argument: exit %d, %q; want 2 and the argument named", code, b.String())
	}
}
