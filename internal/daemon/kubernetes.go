package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tamper"
)

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
		d.setKubeState("standalone", "kubernetes.kubeconfig is empty")
		d.kubeM.SetReporting(false)
		return
	}
	lastErr := ""
	var dial func(context.Context) error
	identity := ""
	for client == nil {
		c, host, ok, err := d.newKubeClient(ctx, path)
		if !ok {
			return // stopped while the kubeconfig's files did not answer
		}
		if err == nil {
			// The user of the kubeconfig the client was made from, not of a
			// second read of the file (which may be being rewritten).
			_, identity = kube.Source(c)
			d.nameFromCredentials(identity)
			d.log.Info("reporting to Kubernetes", "server", host, "kubeconfig", path, "node", d.currentEnv().NodeName)
			d.setKubeState("reporting", "")
			d.mu.Lock()
			d.kubeSource = func() string { return d.sourceDetail(c, path) }
			d.mu.Unlock()
			client = c
			if _, err = kube.Dialer(host); err != nil {
				d.log.Warn("the API server's return after an outage is noticed by the retry backoff alone", "server", host, "err", err)
			} else {
				dial = func(ctx context.Context) error {
					// The server of the client in use: a rewritten
					// kubeconfig may name another.
					server, _ := kube.Source(c)
					f, err := kube.Dialer(server)
					if err != nil {
						return err
					}
					return f(ctx)
				}
			}
			break
		}
		d.setKubeState("waiting", "for a usable kubeconfig: "+err.Error())
		if err.Error() != lastErr {
			if lastErr == "" && errors.Is(err, kube.ErrNoKubeconfig) {
				d.log.Warn("not reporting to Kubernetes: running standalone (logs, metrics, local state) until the kubeconfig appears", "err", err)
				d.kubeM.SetReporting(false)
			} else if errors.Is(err, kube.ErrNoCertificate) {
				// A joining node's kubelet writes kubelet.conf before
				// its certificate is issued: a phase, not a fault.
				d.log.Warn("not reporting to Kubernetes until the kubelet has its client certificate (its TLS bootstrap); running standalone (logs, metrics, local state) until then", "err", err)
			} else {
				d.log.Error("cannot use the kubeconfig; not reporting to Kubernetes", "err", err)
			}
			lastErr = err.Error()
		}
		d.live.Beat("kube/kubeconfig", d.poll)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.poll):
		}
	}
	// The waiting is over: the loop's progress leaves the metrics too (a
	// timestamp left frozen would look like a stuck loop).
	d.live.Forget("kube/kubeconfig")
	d.metrics.RemoveLoop("kube/kubeconfig")
	if d.kube != nil {
		d.setKubeState("reporting", "as node "+d.currentEnv().NodeName)
	}
	r := kube.New(kube.Options{Grid: d.grid(),
		Client: client, NodeName: d.currentEnv().NodeName, Identity: identity, RoleOf: func() report.Role { return d.currentEnv().Role },
		Evaluated:     func(t string) bool { return slices.Contains(d.parts.applicable(d.currentEnv()), t) },
		RemovedLogged: d.parts.removedAtStart,
		Store:         d.store, Details: d.details,
		Log: d.log, Metrics: d.kubeM, Events: d.events, Progress: d.live.Beat,
		HeartbeatPeriod: d.cfg.Kubernetes.HeartbeatPeriod.Duration, ReportInterval: d.cfg.Kubernetes.ReportInterval.Duration,
		FirstPass: d.firstPassDone, Dial: dial,
		ReportedClear: func(at time.Time) {
			// The clear in tamper.json is reported (and so trusted at the
			// next start) only when it is the one published before.
			k := d.currentEnv().Tamper
			if k == nil || !k.TrustClear(at) {
				return
			}
			// The report a write of the conditions carries before the
			// tamper checks ran (the first after a reboot, as far as the
			// checks have collected it) has the tamper document with the
			// clear: else it took the published clear off the Node, and
			// a restart before the checks' first pass no longer trusted
			// it (the Node is its only corroboration). Owned by a tamper
			// check that runs here, whose first run replaces it.
			env := d.currentEnv()
			for _, t := range []string{tamper.CondNode, tamper.CondSealed} {
				if slices.Contains(d.parts.applicable(env), t) {
					d.details.SetFor(t, report.Detail{Domain: "tamper", Field: "tamper", Value: k.Report()})
					break
				}
			}
		},
	})
	r.Run(ctx)
}

// newKubeClient is kube.NewClient on a goroutine of its own, which the
// daemon's stop does not wait for: on a disk that hangs under the
// kubeconfig (a read in D state), the stat or the read of the files does
// not return, and the stop waited for it until TimeoutStopSec and a
// SIGKILL that a task in D state does not answer either. ok is false when
// ctx ended first; the goroutine is left to the kernel. A kubeconfig that
// hangs so at the start is waited for (the loop's progress stops: the
// stuck loop names it), the daemon's other loops going on.
func (d *Daemon) newKubeClient(ctx context.Context, path string) (c kube.Client, host string, ok bool, err error) {
	type made struct {
		c    kube.Client
		host string
		err  error
	}
	ch := make(chan made, 1)
	go func() {
		c, host, err := kube.NewClient(path, "autopilot-health/"+d.version, d.log)
		ch <- made{c, host, err}
	}()
	wait := time.NewTimer(kubeconfigHungAfter)
	defer wait.Stop()
	for {
		select {
		case m := <-ch:
			return m.c, m.host, true, m.err
		case <-ctx.Done():
			return nil, "", false, nil
		case <-wait.C:
			// Said, as a call's wait for the files is (the kube
			// client's 5 s): status said "Kubernetes: " and nothing
			// more, and the journal nothing, until the disk answered.
			d.log.Warn("the kubeconfig's files do not answer (a hung disk?); not reporting to Kubernetes until a stat or read of them returns", "kubeconfig", path, "waited", kubeconfigHungAfter.String())
			d.setKubeState("waiting", "for the kubeconfig "+path+": its files do not answer (a hung disk?): a stat or read of them has not returned for "+kubeconfigHungAfter.String())
		}
	}
}

// kubeconfigHungAfter is how long newKubeClient waits for the kubeconfig's
// files before it says they do not answer: the kube client's wait for them
// at a call. A variable for tests.
var kubeconfigHungAfter = 5 * time.Second

// sourceDetail is the status's detail while reporting through c, a client
// of the kubeconfig at path: the API server it calls now, and the user its
// credentials name when that is another node (the API server refuses the
// writes). Both follow a rewritten kubeconfig.
func (d *Daemon) sourceDetail(c kube.Client, path string) string {
	server, user := kube.Source(c)
	name := d.currentEnv().NodeName
	s := "to " + server + " as node " + name + " (kubeconfig " + path + ")"
	if strings.HasPrefix(user, "system:node:") && user != "system:node:"+name {
		s += "; its credentials name " + user + ", which may not write this Node"
	}
	return s
}

// nameFromCredentials makes the node the one the kubeconfig's credentials
// name (system:node:<name>, identity) when node_name does not set it: the
// API server lets those credentials write that Node alone. On a first boot
// the daemon starts before the kubelet has its client certificate
// (Before=kubelet.service), so the name detected at start is the kernel
// hostname's, which need not be the name the kubelet registers
// (--hostname-override, a cloud provider's name).
func (d *Daemon) nameFromCredentials(identity string) {
	name, ok := strings.CutPrefix(identity, "system:node:")
	if d.cfg.NodeName != "" || !ok || name == "" {
		return
	}
	d.planMu.Lock()
	defer d.planMu.Unlock()
	old := d.currentEnv()
	if old.NodeName == name {
		return
	}
	d.log.Info("node name taken from the kubelet's credentials", "node", name, "detected_at_start", old.NodeName)
	env := *old
	env.NodeName = name
	d.envMu.Lock()
	d.env = &env
	d.envMu.Unlock()
}
