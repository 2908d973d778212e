package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
)

// NewEnv detects the node and builds the checks' environment.
func NewEnv(cfg *config.Config, log *slog.Logger) (*checks.Env, Identity, error) {
	id, err := Detect(cfg)
	if err != nil {
		return nil, id, err
	}
	env := &checks.Env{
		Config: cfg, NodeName: id.NodeName, Role: id.Role, GPU: id.GPU,
		Log: log, Sys: checks.RealSys(), Now: time.Now,
		Systemd: systemd.NewDBus(),
	}
	return env, id, nil
}

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

// loopSlack is added to every loop's allowed silence.
const loopSlack = 30 * time.Second

// persistEvery bounds how long the persister loop waits without a change.
const persistEvery = time.Minute

// Store returns the condition store.
func (d *Daemon) Store() *report.Store { return d.store }

// Metrics returns the metrics.
func (d *Daemon) Metrics() *report.Metrics { return d.metrics }

// Addr returns the metrics listener's address.
func (d *Daemon) Addr() net.Addr { return d.ln.Addr() }

// Healthy returns nil when every loop makes progress.
func (d *Daemon) Healthy() error {
	err := d.live.Check()
	d.metrics.SetHealthy(err == nil)
	return err
}

// Run runs until ctx is done, then shuts down cleanly: conditions are left
// as they are (saved, never cleared).
func (d *Daemon) Run(ctx context.Context) error {
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(d.ln) }()
	d.log.Info("serving metrics", "addr", d.ln.Addr().String(), "checks", len(d.currentRunner().Checks()))

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { d.persist(rctx) })
	wg.Go(func() { d.watchdog(rctx, WatchdogInterval()) })
	wg.Go(func() { d.statusLoop(rctx) })
	wg.Go(func() { d.reportToKubernetes(rctx) })
	if d.kmsg != nil {
		// Before the first pass: the kernel conditions start False (or as
		// restored from this boot) and the reader follows the log.
		d.kmsg.Start(time.Now(), kmsg.BootWall())
		d.live.Expect("kmsg", 15*time.Second+loopSlack)
		wg.Go(func() { d.newReader().Run(rctx) })
	}
	d.notify.Status(fmt.Sprintf("starting: first pass of %d checks", len(d.currentRunner().Checks())))
	wg.Go(func() { d.runChecks(rctx) })
	if d.cfg.Role == "" || d.cfg.GPU == "auto" {
		wg.Go(func() { d.redetect(rctx, d.cfg.Detect.Interval.Duration) })
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-srvErr:
		runErr = fmt.Errorf("metrics server: %w", err)
	}
	d.notify.Stopping()
	d.log.Info("shutting down; conditions are left as they are")
	cancel()
	wg.Wait()
	shCtx, shCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer shCancel()
	srv.Shutdown(shCtx)
	if err := d.store.Save(d.cfg.StateDir, time.Now()); err != nil {
		d.log.Error("saving state on shutdown failed", "dir", d.cfg.StateDir, "err", err)
		d.metrics.StateWrite(err)
		if runErr == nil {
			runErr = err
		}
	}
	return runErr
}

// kubeconfigPoll is how often a standalone daemon looks for a kubeconfig
// (Options.KubeconfigPoll).
const kubeconfigPoll = 30 * time.Second

// reportToKubernetes runs the Kubernetes reporter. Without a kubeconfig the
// daemon runs standalone (logs, metrics, local state), says so once, and
// starts reporting as soon as the kubeconfig appears (the kubelet writes it
// when it joins the cluster).
func (d *Daemon) reportToKubernetes(ctx context.Context) {
	client := d.kube
	path := d.cfg.HostPath(d.cfg.Kubernetes.Kubeconfig)
	if client == nil && d.cfg.Kubernetes.Kubeconfig == "" {
		d.log.Warn("not reporting to Kubernetes: kubernetes.kubeconfig is empty; running standalone (logs, metrics, local state)")
		d.kubeM.SetReporting(false)
		return
	}
	lastErr := ""
	for client == nil {
		c, host, err := kube.NewClient(path, "autopilot-health/"+d.version)
		if err == nil {
			d.log.Info("reporting to Kubernetes", "server", host, "kubeconfig", path, "node", d.currentEnv().NodeName)
			client = c
			break
		}
		if err.Error() != lastErr {
			if lastErr == "" && errors.Is(err, kube.ErrNoKubeconfig) {
				d.log.Warn("not reporting to Kubernetes: running standalone (logs, metrics, local state) until the kubeconfig appears", "err", err)
				d.kubeM.SetReporting(false)
			} else {
				d.log.Error("cannot use the kubeconfig; not reporting to Kubernetes", "err", err)
			}
			lastErr = err.Error()
		}
		d.live.Beat("kube/kubeconfig", d.poll+loopSlack)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.poll):
		}
	}
	d.live.Forget("kube/kubeconfig")
	r := kube.New(kube.Options{
		Client: client, NodeName: d.currentEnv().NodeName, RoleOf: func() report.Role { return d.currentEnv().Role }, Store: d.store, Details: d.details,
		Log: d.log, Metrics: d.kubeM, Events: d.events, Progress: d.live.Beat,
		HeartbeatPeriod: d.cfg.Kubernetes.HeartbeatPeriod.Duration, ReportInterval: d.cfg.Kubernetes.ReportInterval.Duration,
	})
	r.Run(ctx)
}

// persist writes the state file after changes (a condition, or the kernel
// log cursor), at most once a second, and beats its liveness.
func (d *Daemon) persist(ctx context.Context) {
	const loop = "state"
	d.live.Expect(loop, persistEvery+loopSlack)
	defer d.live.Forget(loop)
	t := time.NewTicker(persistEvery)
	defer t.Stop()
	dirty := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.store.Dirty():
			dirty = true
			// Coalesce bursts of changes.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		case <-t.C:
		}
		if dirty {
			err := d.store.Save(d.cfg.StateDir, time.Now())
			d.metrics.StateWrite(err)
			if err != nil {
				d.log.Error("saving state failed", "dir", d.cfg.StateDir, "err", err)
			} else {
				dirty = false
			}
		}
		d.live.Beat(loop, persistEvery+loopSlack)
	}
}

// watchdog pings systemd at half the watchdog interval, only while every
// loop makes progress: a stuck daemon is restarted by systemd.
func (d *Daemon) watchdog(ctx context.Context, interval time.Duration) {
	period := interval / 2
	if period <= 0 {
		period = 15 * time.Second // no systemd watchdog: still refresh the health gauge
	}
	t := time.NewTicker(period)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := d.Healthy(); err != nil {
			if err.Error() != lastErr {
				d.log.Error("not healthy; withholding the watchdog ping", "err", err)
			}
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		if interval > 0 {
			d.notify.Watchdog()
		}
	}
}

// statusLoop keeps systemd's STATUS= line current.
func (d *Daemon) statusLoop(ctx context.Context) {
	last := ""
	for {
		changed := d.store.Changed()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		d.mu.Lock()
		ready := d.ready
		d.mu.Unlock()
		if s := d.Summary(); ready && s != last {
			d.notify.Status(s)
			last = s
		}
	}
}

// Summary is the one-line status, e.g.
// "24 conditions: 23 ok, 1 problem (DiskUsageHigh)".
func (d *Daemon) Summary() string { return Summarize(d.store.All()) }

// Summarize formats conditions as the one-line status.
func Summarize(conds []report.Condition) string {
	var ok int
	var problems, unknown []string
	for _, c := range conds {
		switch c.Status {
		case report.StatusFalse:
			ok++
		case report.StatusTrue:
			problems = append(problems, c.Type)
		default:
			unknown = append(unknown, c.Type)
		}
	}
	slices.Sort(problems)
	slices.Sort(unknown)
	var b strings.Builder
	fmt.Fprintf(&b, "%d conditions: %d ok, %d %s", len(conds), ok, len(problems), plural(len(problems), "problem", "problems"))
	if len(problems) > 0 {
		fmt.Fprintf(&b, " (%s)", shortList(problems, 5))
	}
	if len(unknown) > 0 {
		fmt.Fprintf(&b, ", %d unknown (%s)", len(unknown), shortList(unknown, 3))
	}
	return b.String()
}

// shortList joins up to n names and counts the rest, keeping the status line short.
func shortList(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, +%d more", strings.Join(names[:n], ", "), len(names)-n)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Handler serves /metrics and /healthz.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelError)}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := d.Healthy(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintf(w, "ok: %d loops making progress\n", len(d.live.Loops()))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "autopilot-health: /metrics (Prometheus), /healthz (daemon liveness)")
	})
	return mux
}

// logObserver logs every condition change, and events: the first of each
// reason at once, then at most one line per reason every eventLogEvery with
// the number of events in between, so a flood of kernel lines is a few
// journal lines, not thousands.
type logObserver struct {
	log *slog.Logger
	ev  *eventLogLimiter
}

const eventLogEvery = 10 * time.Second

type eventLogLimiter struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

func newLogObserver(log *slog.Logger) logObserver {
	return logObserver{log: log, ev: &eventLogLimiter{last: map[string]time.Time{}, suppressed: map[string]int{}}}
}

func (l logObserver) ConditionChanged(prev *report.Condition, cur report.Condition) {
	from := "none"
	if prev != nil {
		from = string(prev.Status)
	}
	lv := slog.LevelInfo
	if cur.Status == report.StatusTrue {
		lv = slog.LevelWarn
	}
	l.log.Log(context.Background(), lv, "condition changed", "condition", cur.Type, "from", from, "status", cur.Status, "reason", cur.Reason, "message", cur.Message)
}

func (l logObserver) ConditionRestored(report.Condition) {}

func (l logObserver) EventEmitted(e report.Event) {
	l.ev.mu.Lock()
	now := time.Now()
	if last, ok := l.ev.last[e.Reason]; ok && now.Sub(last) < eventLogEvery {
		l.ev.suppressed[e.Reason]++
		l.ev.mu.Unlock()
		return
	}
	n := l.ev.suppressed[e.Reason]
	l.ev.last[e.Reason] = now
	l.ev.suppressed[e.Reason] = 0
	l.ev.mu.Unlock()
	if n > 0 {
		l.log.Warn("event", "reason", e.Reason, "message", e.Message, "not_logged_since_last", n)
		return
	}
	l.log.Warn("event", "reason", e.Reason, "message", e.Message)
}
