// Package daemon wires the daemon together: host detection, logging, the
// runner, the state file, the metrics listener and the systemd lifecycle.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
)

// Options are the parts of a daemon run that tests replace.
type Options struct {
	Version string
	// Listener, if set, is used instead of listening on metrics.listen_address.
	Listener net.Listener
	// Notifier talks to systemd.
	Notifier Notifier
	// Env, if set, replaces the detected environment.
	Env *checks.Env
	// BootID is used with Env.
	BootID string
	// Kube, if set, is used instead of a client from kubernetes.kubeconfig.
	Kube kube.Client
	// KubeconfigPoll is how often a daemon without a kubeconfig looks for
	// it (default 30 s).
	KubeconfigPoll time.Duration
	// KmsgOpen, if set, opens the kernel log instead of the device at
	// kmsg.device; it returns once ctx is done (kmsg.Reader.Open).
	KmsgOpen func(ctx context.Context, path string) (kmsg.Device, error)
	// Helper, if set, is the privileged helper: it does what needs
	// privileges the daemon's unit does not give it (checks.Env.Helper),
	// and opens /dev/kmsg where kmsg.device is that and KmsgOpen is not
	// set.
	Helper *privileged.Client
	// ControlSocket, if set, is where the daemon listens for the
	// operator's requests (control_socket; tamper clear).
	ControlSocket string
	// ConfigPath is the configuration file the daemon was started with,
	// read again by Reload; ConfigOptional: it may be absent (the default
	// path: the embedded defaults apply), as at start.
	ConfigPath     string
	ConfigOptional bool
	// ConfigDigest identifies the file the configuration was loaded from
	// (config.LoadDigest); empty: the file as New finds it.
	ConfigDigest string
	// Reload, if set, delivers the signals (SIGHUP) that reload the
	// configuration.
	Reload <-chan os.Signal
	// LogDropped, if set, is how many log lines the log's writer dropped
	// while stderr did not take them (logsink.Sink.Dropped), exposed as
	// autopilot_health_log_lines_dropped_total (0 without it).
	LogDropped func() uint64
}

// Daemon is one run of the daemon.
type Daemon struct {
	cfg *config.Config
	log *slog.Logger
	// helper: run with the privileged helper (Options.Helper), whose
	// files a reload judges as run does (HelperRefuses).
	helper bool
	// parts are what Assemble built; store, metrics, details, kmsg and live
	// are the same parts, named for short. env and runner start as the
	// assembled ones and are replaced when the node's role or GPU changes.
	parts   *Parts
	env     *checks.Env
	store   *report.Store
	metrics *report.Metrics
	// gate bounds the metrics listener's connections.
	gate    *metricsGate
	live    *Liveness
	runner  *checks.Runner
	details *report.Details
	notify  Notifier
	// sdMu serializes what is sent with notify (tell); sdStopping: the
	// daemon said STOPPING=1, and sends nothing more.
	sdMu       sync.Mutex
	sdStopping bool
	// sdExtendedFor is the runner whose first pass systemd was last told
	// the length of (extendStart); under sdMu.
	sdExtendedFor *checks.Runner
	// stateW writes the state file (persist, and the final save of Run).
	stateW  stateWriter
	version string
	kube    kube.Client
	kubeM   *kube.Metrics
	events  *kube.EventQueue
	kmsg    *kmsg.Monitor
	poll    time.Duration
	// kmsgOpen is Options.KmsgOpen.
	kmsgOpen func(ctx context.Context, path string) (kmsg.Device, error)
	// control is the control socket's listener (nil: none); controlWG
	// and controlN: its requests in flight (their handlers), which a stop
	// waits for a while (awaitControl).
	control net.Listener
	// statusLn: the status socket's listener once serveStatus bound it,
	// or one not bound yet where something not a socket was at its path
	// at the start (nil: none). Under mu. watchSockets binds it again, and
	// control, where their files are removed, and binds the one not bound
	// yet once that is gone.
	statusLn *socketListener
	// socketEvent, where set (tests), runs after each event of the
	// sockets' watch is handled.
	socketEvent func()
	// rebinds: autopilot_health_socket_rebinds_total{socket} (nil: a
	// Daemon not made by New).
	rebinds   *prometheus.CounterVec
	controlWG sync.WaitGroup
	controlN  atomic.Int32
	// clearMu serializes the operators' tamper clears from their
	// preparation to their application (ClearTamper).
	clearMu sync.Mutex
	// cfgPath and cfgOptional: the configuration file (Options.ConfigPath);
	// reloadSig: Options.Reload.
	cfgPath     string
	cfgOptional bool
	reloadSig   <-chan os.Signal
	// reloadReq asks reloadLoop for a reload (becomeReady: the file
	// changed while the daemon started).
	reloadReq chan struct{}
	// readySent is closed once the start's READY=1 is sent: the reload
	// reloadReq asks for speaks after it.
	readySent chan struct{}
	// cfgSince: when the configuration in effect was loaded; cfgAbsent:
	// the file was absent then (the defaults); lastReload: the last
	// reload's outcome (nil: none yet). Under mu.
	cfgSince   time.Time
	cfgAbsent  bool
	lastReload *ReloadOutcome
	// notes: the configuration's notes logged (config.Note: the file's
	// values taken otherwise than written), by Run and the reloads since.
	// Under mu.
	notes []config.Note
	// readDigest identifies the file as the start or the last reload read
	// it (config.FileDigest). Under mu.
	readDigest string
	// reloadMu serializes the reloads asked for (a signal, the control
	// socket): each one's RELOADING=1 ... READY=1 is its own.
	reloadMu sync.Mutex
	// planMu serializes the re-plans: a reload and a change of the node's
	// role or GPU (redetect).
	planMu sync.Mutex

	mu    sync.Mutex
	ready bool
	// stopping: Run got its stop (Status).
	stopping bool
	// metricsBind: the metrics listener, or why it is not bound yet.
	metricsBind metricsBind
	// statusWake asks statusLoop for a new status line (the metrics
	// listener's state changed).
	statusWake chan struct{}
	// statusMu serializes sendStatus; lastStatus is the line it sent last.
	statusMu   sync.Mutex
	lastStatus string
	// started is when Run began; kubeState and kubeDetail say how the
	// daemon reports to Kubernetes (see Status).
	started               time.Time
	kubeState, kubeDetail string
	// kubeSource, once set, makes the detail while reporting through a
	// kubeconfig's client: its server and credentials may change.
	kubeSource func() string
	// replan gets a token when d.runner was replaced (the node's role or
	// GPU changed); envMu guards d.env and d.runner.
	replan chan struct{}
	envMu  sync.Mutex
	// firstPass is done once, by whichever runner completes it.
	firstPass sync.Once
	// firstPassDone is closed by becomeReady (the report annotations wait
	// for it).
	firstPassDone chan struct{}
	// unlockState releases the state directory's lock (lockState), once
	// Run's final saves are done: nothing writes state after them.
	unlockState func()
}

// HelperRefuses is the refusal of a configuration that does not go with
// the privileged helper: a host_root other than "/" (the helper reads this
// host's own root). run --privileged-helper (the unit's) refuses such a
// file as its own, exit 2, config validate --privileged-helper says the
// same, and so does a reload of the daemon run with the helper: before, a
// reload said host_root "needs a restart", and that restart refused the
// file. The error names file, and the key's line in it where cfg has one.
func HelperRefuses(cfg *config.Config, file string) error {
	if cfg.HostRoot == "" || cfg.HostRoot == "/" {
		return nil
	}
	return &config.Error{File: file, Line: cfg.Line("host_root"), Key: "host_root",
		Msg: fmt.Sprintf("%q: the privileged helper reads this host's own root only; run without --privileged-helper", cfg.HostRoot)}
}

// HostRootRefuses is the refusal of a host_root that is no directory on
// this host (absent, or a file): every host path is read under it, so
// nothing could be. run and check refuse it as a bad value of the file
// (exit 2, not restarted every 5 s for ever), with file, line and key, and
// so does a reload that changes host_root to it, with run's words (not
// "needs a restart": that restart would refuse it). Before, run said
// "could not start: cannot read the boot id: open /host/proc/sys/kernel/
// random/boot_id: no such file or directory", exit 1, naming no key. Not
// config validate's: it checks the file, which may be validated on another
// host than the one it is for (an image's build host, a container's /host
// not mounted there). "/" is always one; another error of stat
// (permission, I/O) is not the file's and is left to the start.
func HostRootRefuses(cfg *config.Config, file string) error {
	if cfg.HostRoot == "" || cfg.HostRoot == "/" {
		return nil
	}
	fi, err := os.Stat(cfg.HostRoot)
	var why string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		why = "no such directory"
	case err != nil:
		return nil
	case !fi.IsDir():
		why = "not a directory"
	default:
		return nil
	}
	return &config.Error{File: file, Line: cfg.Line("host_root"), Key: "host_root",
		Msg: fmt.Sprintf("%q: %s on this host: every host path, /proc and /sys are read under it (\"/\" for this host's own root)", cfg.HostRoot, why)}
}

// New prepares a daemon: detects the node, restores the state, builds the
// checks (Assemble) and binds the metrics listener. Any error here is a
// reason to refuse to start, except a metrics address that cannot be bound
// (bindMetrics: Run tries again until it can).
func New(cfg *config.Config, log *slog.Logger, opts Options) (*Daemon, error) {
	ao := AssembleOptions{Purpose: ForRun, Version: opts.Version, Env: opts.Env, BootID: opts.BootID}
	if opts.Helper != nil {
		if cfg.HostRoot != "" && cfg.HostRoot != "/" {
			return nil, fmt.Errorf("host_root = %q: the privileged helper reads this host's own root only; run without --privileged-helper", cfg.HostRoot)
		}
		ao.Helper = opts.Helper
		if opts.KmsgOpen == nil {
			opts.KmsgOpen = helperKmsgOpen(opts.Helper)
		}
	}
	// The control socket first: a second daemon (one run by hand beside
	// the unit's) refuses before it touches the running one's files (the
	// state directory's temp files, which a start removes as a crash's).
	var control net.Listener
	if opts.ControlSocket != "" {
		var err error
		if control, err = listenControl(opts.ControlSocket, log); err != nil {
			return nil, fmt.Errorf("control socket (control_socket): %w", err)
		}
	}
	// Then the state directory's lock, before any state is read or
	// written there (Assemble's load removes a crash's temp files): a
	// second daemon with a control socket of its own refuses here, and
	// its socket goes with it (lockState).
	unlockState, err := lockState(cfg.StateDir, log)
	if err != nil {
		if control != nil {
			control.Close()
		}
		return nil, fmt.Errorf("state directory (state_dir) %w", err)
	}
	p, err := Assemble(cfg, log, ao)
	if err != nil {
		if control != nil {
			control.Close()
		}
		unlockState()
		return nil, err
	}
	d := &Daemon{
		cfg: cfg, log: log, parts: p, notify: opts.Notifier, version: opts.Version, kube: opts.Kube, poll: opts.KubeconfigPoll, kmsgOpen: opts.KmsgOpen,
		env: p.Env, runner: p.Runner, store: p.Store, metrics: p.Metrics, details: p.Details, kmsg: p.Kmsg, live: p.Live,
		replan: make(chan struct{}, 1), firstPassDone: make(chan struct{}), statusWake: make(chan struct{}, 1),
		cfgPath: opts.ConfigPath, cfgOptional: opts.ConfigOptional, reloadSig: opts.Reload, reloadReq: make(chan struct{}, 1), readySent: make(chan struct{}),
		cfgSince: time.Now(), readDigest: opts.ConfigDigest, helper: opts.Helper != nil, notes: cfg.Notes(),
		unlockState: unlockState,
	}
	if d.readDigest == "" && d.cfgPath != "" {
		d.readDigest = config.FileDigest(d.cfgPath)
	}
	d.cfgAbsent = d.cfgPath != "" && d.readDigest == config.AbsentDigest
	d.metrics.ConfigLoaded(d.cfgSince)
	if d.poll <= 0 {
		d.poll = kubeconfigPoll
	}
	d.kubeM = kube.NewMetrics(d.metrics.Registry)
	d.kubeM.SetWake(d.wakeStatus) // the Node said not updated, or updated again
	d.gate = newMetricsGate(log, d.metrics.Registry)
	d.gate.wake = d.wakeStatus
	d.rebinds = newRebindCounter(d.metrics.Registry)
	registerLogDropped(d.metrics.Registry, opts.LogDropped)
	if cfg.Kubernetes.Kubeconfig != "" || opts.Kube != nil {
		// Queue events from the start: the kubeconfig may appear later
		// (the kubelet writes it when the node joins).
		d.events = kube.NewEventQueue(d.kubeM)
		d.store.Observe(d.events)
		// Kept in the state file from the start too: the kernel log
		// cursor saved beside them counts the records whose events
		// they are as handled (kube.EventQueue).
		d.events.KeepIn(d.store)
	}
	if opts.Listener != nil {
		d.metricsBind.ln = opts.Listener
	} else {
		d.bindMetrics()
	}
	d.control = control
	d.watchTamperWrites()
	return d, nil
}

// Store returns the condition store.
func (d *Daemon) Store() *report.Store { return d.store }

// Metrics returns the metrics.
func (d *Daemon) Metrics() *report.Metrics { return d.metrics }
