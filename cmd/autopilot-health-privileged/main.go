// Command autopilot-health-privileged is the daemon's privileged helper: it
// does for autopilot-health what needs a capability or a raw device (the
// kernel log's descriptor, NVMe admin commands, device-mapper tables, LVM
// reports, the protected-path scan) and nothing else, on a Unix socket only
// root may use, without a network (internal/privileged;
// units/autopilot-health-privileged.service).
//
// Under systemd it serves the socket its socket unit passes it; with
// --listen PATH it listens there itself (tests, and a node without the
// socket unit).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/journallog"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/internal/trim"
)

var version = "devel"

func main() {
	crashBySignal()
	os.Exit(run(os.Args[1:], os.Stderr))
}

// crashBySignal makes the Go runtime end the process by SIGABRT, after its
// goroutine dump, where it exits 2 by default: on SIGABRT and on a fatal
// error (a panic no one recovers). Exit 2 is a refused command line, which
// the unit does not restart (RestartPreventExitStatus=2); a crash is.
func crashBySignal() { debug.SetTraceback("crash") }

// unitName is the helper's unit, named in a refusal's answer.
const unitName = "autopilot-health-privileged.service"

// refuse ends a helper that refuses its command line (exit 2, which its
// unit does not restart): under its socket unit, the requests already
// queued are answered with the reason (privileged.Refuse). Left queued, one
// would start the helper again at once, to refuse again, for ever; and the
// daemon would wait for its answer until it timed out, not knowing why.
// The next request of the daemon starts the helper again, which refuses it
// the same way: one refusal per request, and the daemon's requests back
// off.
func refuse(reason string, listen string) int {
	if listen == "" && os.Getenv("LISTEN_FDS") != "" {
		if l, err := listener(""); err == nil {
			privileged.Refuse(l, "the privileged helper refuses to start: "+reason+
				" (its command line: ExecStart= of "+unitName+" or a drop-in; journalctl -u "+unitName+")")
		}
	}
	return 2
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("autopilot-health-privileged", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "listen on this Unix socket path instead of the one systemd passes")
	debug := fs.Bool("debug", false, "log each failed request")
	lvm := fs.String("lvm", "/usr/sbin/lvm", "the lvm binary, the one program the helper runs (the daemon's checks.DiskUsageHigh.lvm_command must name it)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		// The flag package has written the error and the usage.
		return refuse(err.Error(), *listen)
	}
	if fs.NArg() > 0 {
		err := fmt.Sprintf("unexpected argument %q", fs.Arg(0))
		fmt.Fprintln(stderr, "autopilot-health-privileged: "+err)
		return refuse(err, *listen)
	}
	if *showVersion {
		fmt.Println(version)
		return 0
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := newLogger(stderr, level, journallog.StderrIsJournal())
	// access(2) honours noexec mounts: an lvm the unit's NoExecPaths=/
	// ExecPaths= keep from running is named now, not at each report.
	if err := unix.Access(*lvm, unix.X_OK); err != nil && !errors.Is(err, unix.ENOENT) {
		log.Warn("cannot execute lvm: the disk check's LVM reports will fail (the unit runs programs from /usr only: ExecPaths=/usr)", "lvm", *lvm, "err", err)
	}
	l, err := listener(*listen)
	if err != nil {
		log.Error("no socket to serve", "err", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// What start-up touched of the binary need not stay resident
	// (internal/trim, as the daemon does), nor what a burst of the daemon's
	// requests touched, once it is over; and what faults back in is the
	// pages read, not the 64 KiB around each (fault-around off).
	faultAround := "off"
	if err := trim.NoFaultAround(); err != nil {
		faultAround = "on"
		log.Debug("fault-around stays on for the binary's pages", "err", err)
	}
	log.Info("serving the daemon's privileged requests", "socket", l.Addr().String(), "lvm", *lvm, "version", version, "fault_around", faultAround)
	trimPages(log, "start-up")
	srv := &privileged.Server{Log: log, LVM: *lvm}
	q := afterQuiet(quietFor, func() { letGo(log, srv.Open) })
	defer q.stop()
	srv.Idle = q.poke
	if err := srv.Serve(ctx, l); err != nil {
		log.Error("serving failed", "err", err)
		return 1
	}
	return 0
}

// quietFor is how long after its last connection closed the helper lets go
// of what the requests touched (letGo). The daemon's requests come in
// bursts: the kernel log's descriptor at its start, the NVMe, verity and
// tamper checks every 5 minutes, the LVM report on the 2-minute grid of
// DiskUsageHigh; the requests of one burst follow each other within
// milliseconds.
var quietFor = 10 * time.Second // a variable for tests

// letGo lets go of the pages of the binary that a burst of requests
// touched (internal/trim; they fault back in from the page cache at the
// next burst), unless a connection is open: a request that outlasts
// quietFor (a slow LVM report, a large scan) after another one closed is
// still the burst, and its close starts the wait again. The heap is left to
// the runtime: returning its free memory as well (debug.FreeOSMemory)
// left more resident, not less (README, Cost: "The privileged helper
// between bursts").
func letGo(log *slog.Logger, open func() int) {
	if n := open(); n > 0 {
		log.Debug("not trimming the pages of the binary: a connection is open", "open", n)
		return
	}
	trimPages(log, "requests")
}

// quiet runs f once d has passed since the last poke (and not before the
// first).
type quiet struct {
	t *time.Timer
	d time.Duration
}

func afterQuiet(d time.Duration, f func()) quiet {
	t := time.AfterFunc(d, f)
	t.Stop()
	return quiet{t, d}
}

// poke (re)starts the wait; it never blocks.
func (q quiet) poke() { q.t.Reset(q.d) }

// stop ends the wait.
func (q quiet) stop() { q.t.Stop() }

func trimPages(log *slog.Logger, after string) {
	if n, err := trim.StartupPages(); err != nil {
		log.Debug("not trimming the pages of the binary", "after", after, "err", err)
	} else {
		log.Debug("trimmed the pages of the binary", "after", after, "advised_bytes", n)
	}
}

// newLogger logs text lines without their time, which the journal adds;
// to the journal (journal: stderr is its stream) each line starts with its
// priority, which journald files it under (journallog), as the daemon's.
func newLogger(w io.Writer, level slog.Level, journal bool) *slog.Logger {
	if journal {
		return slog.New(journallog.NewHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: dropTime}))
}

// dropTime leaves the time to the journal.
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

func listener(path string) (*net.UnixListener, error) {
	if path != "" {
		os.Remove(path)
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return nil, err
		}
		if err := os.Chmod(path, 0o600); err != nil {
			l.Close()
			return nil, err
		}
		return l, nil
	}
	ls, err := activation.Listeners()
	if err != nil {
		return nil, err
	}
	if len(ls) != 1 {
		return nil, errors.New("systemd passed no socket (or several): start it through autopilot-health-privileged.socket, or give --listen PATH")
	}
	u, ok := ls[0].(*net.UnixListener)
	if !ok {
		return nil, fmt.Errorf("the socket systemd passed is not a Unix stream socket (%T)", ls[0])
	}
	return u, nil
}
