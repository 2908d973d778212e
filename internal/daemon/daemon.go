// Package daemon wires the daemon together: host detection, logging, the
// runner, the state file, the metrics listener and the systemd lifecycle.
package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
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
	Kube kubernetes.Interface
	// KubeconfigPoll is how often a daemon without a kubeconfig looks for
	// it (default 30 s).
	KubeconfigPoll time.Duration
}

// Daemon is one run of the daemon.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	env     *checks.Env
	store   *report.Store
	metrics *report.Metrics
	live    *Liveness
	runner  *checks.Runner
	details *report.Details
	notify  Notifier
	ln      net.Listener
	version string
	kube    kubernetes.Interface
	kubeM   *kube.Metrics
	events  *kube.EventQueue
	kmsg    *kmsg.Monitor
	bootID  string
	poll    time.Duration

	mu    sync.Mutex
	ready bool
	// replan gets a token when d.runner was replaced (the node's role or
	// GPU changed); envMu guards d.env and d.runner.
	replan chan struct{}
	envMu  sync.Mutex
	// firstPass is done once, by whichever runner completes it.
	firstPass sync.Once
}

// New prepares a daemon: detects the node, restores the state, builds the
// checks and binds the metrics listener. Any error here is a reason to
// refuse to start.
func New(cfg *config.Config, log *slog.Logger, opts Options) (*Daemon, error) {
	env, bootID := opts.Env, opts.BootID
	if env == nil {
		var id Identity
		var err error
		env, id, err = NewEnv(cfg, log)
		if err != nil {
			return nil, err
		}
		bootID = id.BootID
		log.Info("node detected", "node", id.NodeName, "node_source", id.NodeNameSource,
			"role", id.Role, "role_source", id.RoleSource, "gpu", id.GPU, "gpu_source", id.GPUSource)
	}
	d := &Daemon{cfg: cfg, log: log, env: env, notify: opts.Notifier, version: opts.Version, kube: opts.Kube, poll: opts.KubeconfigPoll}
	if d.poll <= 0 {
		d.poll = kubeconfigPoll
	}
	d.details = report.NewDetails()
	d.store = report.NewStore(bootID)
	d.metrics = report.NewMetrics(opts.Version)
	d.kubeM = kube.NewMetrics(d.metrics.Registry)
	// In-place repair (only the daemon repairs; the one-shot check does not).
	env.Repair = checks.NewRepairer(env.Systemd, log, time.Now, d.metrics.Registry)
	// Restarts of the critical units, as every reader of their properties
	// observes them (syself_node_unit_restarts), kept in the state file
	// (read back on first use, after Load below).
	env.Units = checks.NewUnitWatch(d.store, d.metrics.Registry)
	env.Repair.SetUnitWatch(env.Units)
	d.store.Observe(d.metrics)
	d.store.Observe(newLogObserver(log))
	if cfg.Kubernetes.Kubeconfig != "" || opts.Kube != nil {
		// Queue events from the start: the kubeconfig may appear later
		// (the kubelet writes it when the node joins).
		d.events = kube.NewEventQueue(d.kubeM)
		d.store.Observe(d.events)
	}
	d.bootID = bootID
	d.store.SetBootStart(BootStart())
	if cfg.Kmsg.Enabled {
		ko, err := KmsgOptions(cfg, env, d.store, d.metrics.Registry)
		if err != nil {
			return nil, err
		}
		d.kmsg = kmsg.NewMonitor(ko)
	}

	d.initMetrics(env, nil)

	res, err := d.store.Load(cfg.StateDir)
	switch {
	case err != nil:
		return nil, fmt.Errorf("state: %w", err)
	case res.Corrupt != nil:
		log.Error("state file unreadable; moved aside, starting with empty state", "err", res.Corrupt, "moved_to", res.CorruptPath)
	default:
		log.Info("state restored", "dir", cfg.StateDir, "conditions", res.Restored, "dropped", res.Dropped)
	}

	d.live = NewLiveness(time.Now)
	d.live.OnBeat = d.metrics.LoopProgress
	if d.runner, err = d.newRunner(env); err != nil {
		return nil, err
	}
	d.replan = make(chan struct{}, 1)

	d.ln = opts.Listener
	if d.ln == nil {
		d.ln, err = net.Listen("tcp", cfg.Metrics.ListenAddress)
		if err != nil {
			return nil, fmt.Errorf("metrics listener (metrics.listen_address): %w", err)
		}
	}
	return d, nil
}

// Store returns the condition store.
func (d *Daemon) Store() *report.Store { return d.store }

// Metrics returns the metrics.
func (d *Daemon) Metrics() *report.Metrics { return d.metrics }
