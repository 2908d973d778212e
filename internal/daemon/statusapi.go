package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
)

// StatusPath is the path of the status document on the status socket.
const StatusPath = "/v1/status"

// StatusReport is what the running daemon believes now, served on its
// status socket (status.socket) for `autopilot-health status`. It is read
// from the daemon's memory: no probe runs for it, and it needs neither the
// API server nor the network.
type StatusReport struct {
	Version string    `json:"version"`
	Node    string    `json:"node"`
	Role    string    `json:"role"`
	GPU     bool      `json:"gpu"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Now     time.Time `json:"now"`
	// Ready: the first full pass of the checks is done.
	Ready bool `json:"ready"`
	// Stopping: the daemon got its stop (SIGTERM) and is ending its loops
	// and saving its state; the socket answers until the final save is
	// done.
	Stopping bool `json:"stopping,omitempty"`
	// Unhealthy is "" when every loop makes progress, else the stuck loop.
	Unhealthy string `json:"unhealthy,omitempty"`
	// StateWriteBlocked: the write of the state file that has been
	// blocked in I/O since then (a failing or hung disk under state_dir);
	// absent while none is. The daemon works on meanwhile.
	StateWriteBlocked *BlockedWrite `json:"stateWriteBlocked,omitempty"`
	// StateSaveFailing: the saves of the state file have failed since
	// then (a full or read-only state_dir), with the last error; absent
	// once a save works again.
	StateSaveFailing *FailingSave `json:"stateSaveFailing,omitempty"`
	// TamperWriteBlocked: the same of the tamper state (tamper.json): the
	// tamper checks' findings and a clear are kept in memory, not saved.
	TamperWriteBlocked *BlockedWrite     `json:"tamperWriteBlocked,omitempty"`
	Summary            string            `json:"summary"`
	Conditions         []ConditionStatus `json:"conditions"`
	// Repairs by unit: every unit the daemon watches for repair.
	Repairs    map[string]checks.RepairStatus `json:"repairs"`
	Kmsg       *KmsgStatus                    `json:"kmsg,omitempty"`
	Kubernetes KubernetesStatus               `json:"kubernetes"`
	Config     ConfigStatus                   `json:"config"`
	// Metrics: the metrics listener, served or why not.
	Metrics MetricsStatus `json:"metrics"`
}

// ConfigStatus is the configuration in effect and the last reload.
type ConfigStatus struct {
	// File: the configuration file ("" when the daemon was given none).
	File string `json:"file"`
	// Absent: the file was not there when the configuration in effect was
	// loaded (the default path may be absent): the embedded defaults are in
	// effect.
	Absent bool `json:"absent,omitempty"`
	// Since: when the configuration in effect was loaded (at start, or by
	// the last reload that applied).
	Since      time.Time      `json:"since"`
	LastReload *ReloadOutcome `json:"lastReload,omitempty"`
}

// ConditionStatus is one condition with what set it.
type ConditionStatus struct {
	report.Condition
	// Source: "check" (a probe on its interval) or "kmsg" (the kernel
	// log; the message is the kernel line).
	Source string `json:"source"`
	// Evidence: the report fields the check's latest result carried
	// ("disks.disks": the drives and their SMART fields, "services.services":
	// the units' states and restart counts, ...); of a True held through
	// failed runs, those of the run that decided it (what the failed runs
	// collected is Held's).
	Evidence map[string]any `json:"evidence,omitempty"`
	// Held: the status is a True held through the check's last failed
	// runs in a row (at most 2; the 3rd makes it Unknown), and what the
	// last of them would have set; absent otherwise.
	Held *HeldStatus `json:"heldThroughFailure,omitempty"`
}

// HeldStatus is the failed run a True is held through (checks.HeldFailure:
// runs, since, reason, message) with the report fields it collected.
type HeldStatus struct {
	checks.HeldFailure
	// Evidence: the report fields the last failed run collected (a
	// certificate file's error), keyed as ConditionStatus.Evidence;
	// absent when it collected none. Not what decided the True.
	Evidence map[string]any `json:"evidence,omitempty"`
}

// KmsgStatus is the kernel log reader's health.
type KmsgStatus struct {
	Device  string `json:"device"`
	Reading bool   `json:"reading"`
	// LastRecord: the last record handled (absent: none yet).
	LastRecord *KmsgRecord `json:"lastRecord,omitempty"`
	Records    float64     `json:"records"`
	Lost       float64     `json:"lost"`
	Reopens    float64     `json:"reopens"`
}

// KmsgRecord names one kernel log record.
type KmsgRecord struct {
	Seq uint64 `json:"seq"`
	// Usec: kernel time, microseconds since boot; Time: as wall time.
	Usec uint64    `json:"usec"`
	Time time.Time `json:"time"`
}

// KubernetesStatus is the state of the reporting to the API server.
type KubernetesStatus struct {
	// State: "standalone", "waiting" (for the kubeconfig) or "reporting".
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
	kube.Reporting
}

// Status builds the status report now.
func (d *Daemon) Status(now time.Time) StatusReport {
	env := d.currentEnv()
	d.mu.Lock()
	st := StatusReport{Version: d.version, Node: env.NodeName, Role: string(env.Role), GPU: env.GPU, PID: os.Getpid(),
		Started: d.started, Now: now, Ready: d.ready, Stopping: d.stopping,
		Kubernetes: KubernetesStatus{State: d.kubeState, Detail: d.kubeDetail},
		Config:     ConfigStatus{File: d.cfgPath, Absent: d.cfgAbsent, Since: d.cfgSince, LastReload: d.lastReload}}
	source := d.kubeSource
	d.mu.Unlock()
	if source != nil {
		st.Kubernetes.Detail = source()
	}
	st.Metrics = d.metricsStatus()
	if err := d.Healthy(); err != nil {
		st.Unhealthy = err.Error()
	}
	if f, ok := d.stateW.failed(); ok {
		st.StateSaveFailing = &f
	}
	if b, ok := d.stateW.blocked(); ok {
		st.StateWriteBlocked = &b
	}
	if b, ok := d.tamperWriteBlocked(); ok {
		st.TamperWriteBlocked = &b
	}
	conds := d.store.All()
	st.Summary = Summarize(conds)
	runner := d.currentRunner()
	for _, c := range conds {
		cs := ConditionStatus{Condition: c, Source: "check"}
		if desc, ok := report.Lookup(c.Type); ok && desc.Source == report.SourceKmsg {
			cs.Source = "kmsg"
		} else if d.details != nil {
			cs.Evidence = d.details.Evidence(c.Type)
		}
		if runner != nil && c.Status == report.StatusTrue {
			if h, ok := runner.Holding(c.Type); ok {
				cs.Held = &HeldStatus{HeldFailure: h}
				if cs.Source == "check" && d.details != nil {
					// The evidence of the run that decided the True,
					// and apart, what the failed run collected: its
					// fields are not why the condition is True.
					cs.Evidence = d.details.DecidedEvidence(c.Type)
					cs.Held.Evidence = d.details.FailedRunEvidence(c.Type)
				}
			}
		}
		st.Conditions = append(st.Conditions, cs)
	}
	st.Repairs = map[string]checks.RepairStatus{}
	if env.Repair != nil {
		st.Repairs = env.Repair.All()
	}
	if d.kmsg != nil {
		m := d.kmsg.Metrics()
		ks := &KmsgStatus{Device: d.cfg.Kmsg.Device, Reading: m.ReaderUp(), Records: m.Records(), Lost: m.Lost(), Reopens: m.Reopens()}
		if seq, usec, at, ok := d.kmsg.LastRecord(); ok {
			ks.LastRecord = &KmsgRecord{Seq: seq, Usec: usec, Time: at}
		}
		st.Kmsg = ks
	}
	st.Kubernetes.Reporting = d.kubeM.Reporting()
	return st
}

func (d *Daemon) setKubeState(state, detail string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kubeState, d.kubeDetail = state, detail
}

// statusHandler serves the status report.
func (d *Daemon) statusHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+StatusPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		// Evidence holds file names anyone may choose: their DEL, C1
		// controls and bidi overrides as \u escapes, so that
		// `status --json` and curl do not print them raw.
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		enc.Encode(d.Status(time.Now()))
		w.Write(report.PrintableJSON(b.Bytes()))
	})
	return mux
}

// listenStatus binds the status socket: a Unix socket, mode 0600 (root
// only: the report holds kernel lines and unit states, not for the
// network). Its directory is not created here: the unit's
// RuntimeDirectory= makes /run/autopilot-health (rebind makes it again
// where it was removed while the daemon ran). A socket file left by a
// daemon that is gone is replaced; one a running daemon answers on is not.
func listenStatus(path string) (net.Listener, error) {
	ln, id, err := bindSocket(path)
	if errors.Is(err, syscall.EADDRINUSE) {
		ln, id, err = takeSocket(path, "another daemon answers on it")
	}
	if err != nil {
		return nil, err
	}
	return newSocketListener(path, ln, id), nil
}

// serveStatus serves the status socket until ctx is done (Run: once the
// final save is done, not at the stop's start). A socket that
// cannot be bound is logged: the daemon's work does not depend on it.
func (d *Daemon) serveStatus(ctx context.Context) {
	path := d.cfg.Status.Socket
	if path == "" {
		return
	}
	ln, err := listenStatus(path)
	if fi, lerr := os.Lstat(path); err != nil && lerr == nil && notASocket(fi) != "" {
		// Something not a socket at its path (a file, a directory, a
		// symlink), left there: the socket watch binds the socket
		// once it is gone (moved away, deleted), as it binds one whose
		// file was removed while the daemon ran, and it is served
		// from then.
		d.log.Error("status socket not served: autopilot-health status will not answer until what is at its path is moved away (the socket is bound then)", "socket", path, "err", err)
		late := newUnboundListener(path, err.Error())
		d.mu.Lock()
		d.statusLn = late
		d.mu.Unlock()
		select {
		case <-late.late:
		case <-ctx.Done():
			late.Close() // bound meanwhile: its file removed
			return
		}
		ln = late
	} else if err != nil {
		d.log.Error("status socket not served: autopilot-health status will not answer", "socket", path, "err", err)
		return
	} else {
		d.log.Info("serving status", "socket", path)
		d.mu.Lock()
		d.statusLn, _ = ln.(*socketListener)
		d.mu.Unlock()
	}
	// Its failed accepts are tried again here, not by net/http's Serve
	// (which logs each try and returns at ENOBUFS): retryListener.
	ln = newRetryListener(ln, listenerStatus, d.log, d.acceptFailures(listenerStatus))
	srv := newServer(d.statusHandler())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	// Serve closes the listener as it returns, which removes the
	// socket's file where it is still the one bound (not another
	// daemon's, bound there once this one's was removed).
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		d.log.Error("status socket failed", "socket", path, "err", err)
	}
}
