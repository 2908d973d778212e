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
	cfg, fromFile, digest, err := config.LoadDigest(*cfgPath, !explicit)
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health: refusing to start: %v\n", err)
		return exitError
	}
	log, err := daemon.NewLogger(stderr, cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health: refusing to start: %v\n", err)
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
		log.Error("refusing to start", "err", err)
		return exitError
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
