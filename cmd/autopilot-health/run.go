package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/logsink"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/internal/trim"
)

// crashBySignal makes the Go runtime end the process by SIGABRT, after its
// goroutine dump, where it exits 2 by default: on SIGABRT (systemd's
// watchdog, WatchdogSignal=) and on a fatal error (a panic no one
// recovers, concurrent map writes, out of memory). Exit 2 is a refused
// configuration file, which the unit does not restart
// (RestartPreventExitStatus=2): a daemon the watchdog stopped, or one that
// crashed, stayed down until its file changed.
func crashBySignal() { debug.SetTraceback("crash") }

func cmdRun(args []string, stdout, stderr io.Writer) int {
	crashBySignal()
	// This start reads the file again: an earlier refusal is not one to
	// start the daemon for (config refused-changed), and a refused flag
	// records none. A record it cannot remove is logged once the logger
	// is set (a refusal replaces it anyway); it names an earlier start,
	// which config refused-changed does not start the daemon for.
	forgetErr := forgetRefusal()
	fs := newFlags("run", "run [--config FILE] [--privileged-helper SOCKET]", stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML); the default path may be absent")
	helper := fs.String("privileged-helper", "", "ask the privileged helper (autopilot-health-privileged) listening on this socket for what needs privileges: /dev/kmsg, NVMe, device-mapper, LVM, the NodeTampered scan")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health run: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	// SIGHUP reloads the configuration (systemctl reload): caught from
	// here on, so that an early one does not end the process (Go's
	// default for SIGHUP) but waits for the daemon to run.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	explicit := flagSet(fs, "config")
	cfg, fromFile, digest, log, sink, code := loadForRun(*cfgPath, explicit, *helper, stderr)
	if code >= 0 {
		return code
	}
	// The last lines (stopped, or why not) reach stderr before the exit,
	// while it takes them: a journald that does not read does not hold up
	// the stop beyond this (TimeoutStopSec= is 30 s).
	defer sink.Close(logFlushOnExit)
	if forgetErr != nil {
		log.Warn("cannot remove the record of an earlier refusal of the configuration file; autopilot-health-refused.service will not start the daemon for it (it names an earlier start)", "err", forgetErr)
	}
	procs := limitProcs()
	// A page fault in the binary's code maps that page, not the 64 KiB
	// around it (internal/trim): the idle daemon's resident set is what
	// it reads of its binary.
	faultAround := "off"
	if err := trim.NoFaultAround(); err != nil {
		faultAround = "on"
		log.Debug("fault-around stays on for the binary's pages", "err", err)
	}
	// client-go logs through klog: route it into the same handler.
	klog.SetSlogLogger(log.With("component", "client-go"))
	from := *cfgPath
	if !fromFile {
		from = "(embedded defaults; " + *cfgPath + " absent)"
	}
	log.Info("starting", "version", Version(), "config", from, "gomaxprocs", procs, "fault_around", faultAround)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	opts := daemon.Options{Version: Version(), ControlSocket: cfg.ControlSocket,
		ConfigPath: *cfgPath, ConfigOptional: !explicit, ConfigDigest: digest, Reload: hup,
		LogDropped: sink.Dropped}
	if *helper != "" {
		opts.Helper = &privileged.Client{Path: *helper}
		log.Info("privileged reads go through the helper", "socket", *helper)
	}
	d, err := newDaemonWaitingForStateDir(ctx, cfg, log, opts)
	if err != nil && ctx.Err() != nil {
		// Stopped (systemctl stop) while it waited for the state
		// directory: a clean stop, not a failed unit.
		log.Info("stopped before it started (the state directory was another daemon's)")
		return exitOK
	}
	if err != nil {
		// Not the file's fault (another daemon holds the control socket
		// or the state directory, the node not detected): exit 1, which
		// the unit restarts, unlike a refused file's 2
		// (RestartPreventExitStatus=2), which only a change of the file
		// starts again (autopilot-health.path).
		log.Error("could not start", "err", err)
		return exitProblem
	}
	err = d.Run(ctx)
	stopProfile()
	if err != nil {
		log.Error("stopped with an error", "err", err)
		return exitProblem
	}
	log.Info("stopped")
	return exitOK
}

// stateDirWaits are the waits between the starts a daemon under systemd
// tries again while another daemon holds its state directory
// (newDaemonWaitingForStateDir); a variable for tests.
var stateDirWaits = readRetryWaits

// newDaemonWaitingForStateDir is daemon.New, which refuses to start while
// another daemon holds the state directory (daemon.StateLockedError). Run
// by hand, that is the answer, at once (exit 1; nothing starts it again).
// Under systemd ($INVOCATION_ID: a copy of the unit under another name,
// the unit started while a daemon run by hand holds the directory) exit 1
// is restarted every RestartSec= (5 s) for ever, each a process's start
// and its lines in the journal: so the start is tried again in the
// process, stateDirWaits apart (about a minute), taking the directory as
// soon as the other daemon is gone, and only then exits 1. The refusal is
// logged once, and why the exit, again at its end. A stop (SIGTERM)
// meanwhile ends the wait.
func newDaemonWaitingForStateDir(ctx context.Context, cfg *config.Config, log *slog.Logger, opts daemon.Options) (*daemon.Daemon, error) {
	d, err := daemon.New(cfg, log, opts)
	var locked *daemon.StateLockedError
	if !errors.As(err, &locked) || os.Getenv("INVOCATION_ID") == "" {
		return d, err
	}
	log.Warn("the state directory is another daemon's; trying again, and exiting 1 if it still is", "err", err, "for", sumWaits(stateDirWaits))
	// systemctl status shows the unit activating: STATUS= says why, and
	// until when (the line is replaced by the summary once it starts).
	until := time.Now().Add(sumWaits(stateDirWaits)).UTC().Format("15:04:05")
	if serr := (daemon.Notifier{}).Status("waiting for the state directory (exit 1 at " + until + "Z if it is still held): " + err.Error()); serr != nil {
		log.Debug("cannot tell systemd the status", "err", serr)
	}
	for _, wait := range stateDirWaits {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		if d, err = daemon.New(cfg, log, opts); !errors.As(err, &locked) {
			if err == nil {
				log.Info("the state directory is free now; starting", "dir", cfg.StateDir)
			}
			return d, err
		}
	}
	return nil, err
}

// logFlushOnExit is how long run waits at its exit for stderr to take the
// lines still queued.
const logFlushOnExit = 2 * time.Second

// nonBlockingLog puts the daemon's log behind a logsink.Sink: a write to a
// stderr that does not take it (the journal's stream socket full while
// journald is stopped or stuck on its disk) blocked the loop that logged,
// then every loop behind the handler's lock and the condition store's, so
// the checks stopped, the Node was no longer updated and systemd's watchdog
// aborted the daemon (TestDaemonWorksOnWhileJournaldIsStopped). Lines that
// find the sink full are dropped and counted, and said in one line once
// stderr takes lines again, written directly (direct, as the configuration
// is valid: its format and level built log).
func nonBlockingLog(stderr io.Writer, cfg *config.Config, direct *slog.Logger) (*slog.Logger, *logsink.Sink) {
	sink := logsink.New(stderr, logsink.DefaultBytes)
	sink.Note = func(n uint64) {
		direct.Warn("log lines dropped while the journal did not take them", "dropped", n)
	}
	log, err := daemon.NewLogger(sink, cfg.Log.Format, cfg.Log.Level)
	if err != nil { // the same format and level built direct
		panic(err)
	}
	return log, sink
}

// afterRefusal runs between a refusal and the look at the file again
// (tests change the file there).
var afterRefusal = func() {}

// readRetryWaits are the waits between the reads of a file that could not
// be read for a reason that may pass (an I/O error), before run gives up
// with exit 1; readRetrySleep waits (tests replace both).
var (
	readRetryWaits = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second, 30 * time.Second}
	readRetrySleep = time.Sleep
)

func sumWaits(w []time.Duration) time.Duration {
	var d time.Duration
	for _, x := range w {
		d += x
	}
	return d
}

// helperRefuses is the refusal of a file that does not go with
// --privileged-helper SOCKET (helper, "" without it): daemon.HelperRefuses.
// run refuses it as the file's, exit 2 (daemon.New says the same, too late
// for that code), and config validate --privileged-helper the same way,
// which the package's postinst runs before it starts or restarts the
// daemon: without it, an image built on such a file shipped a daemon that
// could not start. A reload of the daemon run with the helper says the
// same.
func helperRefuses(cfg *config.Config, file, helper string) error {
	if helper == "" {
		return nil
	}
	return daemon.HelperRefuses(cfg, file)
}

// refusalRereads bounds how many times a start reads a file again that
// changed while it was refused.
const refusalRereads = 3

// loadForRun loads the configuration file and the logger it sets for run:
// code is -1 to go on, else run's exit status, the reason said on stderr.
//
// Exit 2 on the file refused (or a flag that does not go with it): the
// unit does not restart that (RestartPreventExitStatus=2; every 5 s for
// ever, it read the same file again and spun), autopilot-health.path
// starts it again when the file changes (README: "Under systemd"). A
// change made while the refusing daemon still runs is not one to the path
// unit: its start of a unit activating is a no-op, and once the unit is
// failed nothing starts it. So before the exit the file is looked at
// again: changed since the read that was refused, it is read again, at
// most refusalRereads times; a file that kept changing is exit 1, which
// the unit restarts in 5 s, rather than a change lost. A change after that
// last look is autopilot-health-refused.service's, once the unit failed:
// the refusal is recorded (recordRefusal) with the file as last read.
func loadForRun(path string, explicit bool, helper string, stderr io.Writer) (*config.Config, bool, string, *slog.Logger, *logsink.Sink, int) {
	for n := 0; ; n++ {
		cfg, fromFile, digest, err := config.LoadDigest(path, !explicit)
		for i := 0; err != nil && !config.FileFault(err) && i < len(readRetryWaits); i++ {
			// A read that may pass is tried again in the process,
			// backing off, before the exit that systemd restarts 5 s
			// later: a file that keeps failing so costs a start about
			// a minute, not every 5 s.
			if i == 0 {
				fmt.Fprintf(stderr, "autopilot-health: cannot read the configuration file, trying again for %s: %v\n", sumWaits(readRetryWaits), err)
			}
			readRetrySleep(readRetryWaits[i])
			cfg, fromFile, digest, err = config.LoadDigest(path, !explicit)
		}
		if err != nil && !config.FileFault(err) {
			// Not the file's (an I/O error reading it, no descriptor
			// left): exit 1, restarted in 5 s. As a refusal, the node
			// stayed without its daemon until someone changed a file
			// that was good.
			fmt.Fprintf(stderr, "autopilot-health: could not start: cannot read the configuration file: %v\n", err)
			return nil, false, "", nil, nil, exitProblem
		}
		var log *slog.Logger
		if err == nil {
			log, err = daemon.NewLogger(stderr, cfg.Log.Format, cfg.Log.Level)
		}
		if err == nil {
			err = helperRefuses(cfg, path, helper)
		}
		if err == nil {
			err = daemon.HostRootRefuses(cfg, path)
		}
		if err == nil {
			log, sink := nonBlockingLog(stderr, cfg, log)
			return cfg, fromFile, digest, log, sink, -1
		}
		fmt.Fprintf(stderr, "autopilot-health: refusing to start: %v\n", err)
		afterRefusal()
		if config.FileDigest(path) == digest {
			recordRefusal(path, digest, stderr)
			return nil, false, "", nil, nil, exitError
		}
		if n == refusalRereads {
			fmt.Fprintf(stderr, "autopilot-health: could not start: the configuration file kept changing while it was refused (read %d times); exiting to be started again\n", n+1)
			return nil, false, "", nil, nil, exitProblem
		}
		fmt.Fprintln(stderr, "autopilot-health: the configuration file changed while it was refused; reading it again")
	}
}
