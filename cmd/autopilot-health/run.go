package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/internal/trim"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
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
	// Exit 2 on the file (or a flag) refused: the unit does not restart
	// that (RestartPreventExitStatus=2; every 5 s for ever, it read the
	// same file again and spun), autopilot-health.path starts it again
	// when the file changes (README: "Under systemd").
	cfg, fromFile, digest, err := config.LoadDigest(*cfgPath, !explicit)
	if err != nil && !config.FileFault(err) {
		// Not the file's (an I/O error reading it, no descriptor left):
		// exit 1, restarted in 5 s. As a refusal, the node stayed without
		// its daemon until someone changed a file that was good.
		fmt.Fprintf(stderr, "autopilot-health: could not start: cannot read the configuration file: %v\n", err)
		return exitProblem
	}
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health: refusing to start: %v\n", err)
		return exitError
	}
	log, err := daemon.NewLogger(stderr, cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health: refusing to start: %v\n", err)
		return exitError
	}
	// A file that names a host_root does not go with the helper, which
	// reads this host's root: refused as the file's, exit 2 (daemon.New
	// says the same, too late for that code).
	if *helper != "" && cfg.HostRoot != "" && cfg.HostRoot != "/" {
		fmt.Fprintf(stderr, "autopilot-health: refusing to start: host_root = %q: the privileged helper reads this host's own root only; run without --privileged-helper\n", cfg.HostRoot)
		return exitError
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
		ConfigPath: *cfgPath, ConfigOptional: !explicit, ConfigDigest: digest, Reload: hup}
	if *helper != "" {
		opts.Helper = &privileged.Client{Path: *helper}
		log.Info("privileged reads go through the helper", "socket", *helper)
	}
	d, err := daemon.New(cfg, log, opts)
	if err != nil {
		// Not the file's fault (another daemon holds the control socket,
		// the node not detected): exit 1, which the unit restarts, unlike
		// a refused file's 2 (RestartPreventExitStatus=2), which only a
		// change of the file starts again (autopilot-health.path).
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
