package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/internal/backoff"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
)

// Options configure a Reporter.
type Options struct {
	Client   Client
	NodeName string
	// Identity is the user the credentials authenticate as (the client
	// certificate's common name, CredentialsUser), "" when not known. A
	// node's is system:node:<its name>: when it names another node than
	// NodeName, the Node read at start is not this node's (node_name set
	// to another node's name) and nothing of it is taken over.
	Identity string
	// Grid lines the periodic writes (the report annotations) and the
	// event writer's idle beat up with the daemon's other periodic
	// wake-ups; zero: each from its own last write.
	Grid tick.Grid
	Role report.Role
	// RoleOf, if set, returns the node's role now (it can change while the
	// daemon runs); else Role is used.
	RoleOf func() report.Role
	// Evaluated, if set, says whether a condition of the catalog is
	// evaluated on this node. One that is not (its check disabled, the
	// kernel monitor off, a GPU condition on a node without a GPU) is not
	// carried over from the Node, and the first write removes it from the
	// Node: what an earlier boot or configuration left there must not stand
	// as this boot's state.
	Evaluated func(condType string) bool
	// RemovedLogged, if set, says whether the daemon's start already
	// logged the removal of this tamper finding (report.TamperFindingRemovedLog:
	// the state file restored it, its check disabled): the reporter, which
	// takes a finding not evaluated here off the Node, does not log the
	// same one a second time.
	RemovedLogged func(condType, reason, message string) bool
	// ReportedClear, if set, gets the tamper clear the Node's tamper report
	// shows (report.ReportedClear), read back at start.
	ReportedClear func(at time.Time)
	Store         *report.Store
	Details       *report.Details
	Log           *slog.Logger
	// Metrics, if nil, are created unregistered.
	Metrics *Metrics
	// HeartbeatPeriod: conditions are rewritten at least this often (jittered).
	HeartbeatPeriod time.Duration
	// ReportInterval: the report annotations are refreshed this often.
	ReportInterval time.Duration
	// Events, if set, is the queue the daemon's events arrive in (created
	// at start, so events from before the reporter exists are kept); if
	// nil, New creates one and registers it with the store.
	Events *EventQueue
	// EventCountFlush overrides how often the count of an aggregated Event
	// is patched (default 10 s).
	EventCountFlush time.Duration
	// Progress, if set, is called by each loop when it makes progress, with
	// the longest silence expected before the next call (no margin: the
	// daemon's liveness adds the same slack to every loop).
	Progress func(loop string, maxSilence time.Duration)
	// FirstPass, if set, is closed once every check has run once: the
	// first report annotations wait for it, so they carry what the checks
	// collect instead of empty domains until the next refresh.
	FirstPass <-chan struct{}
	// Dial, if set, opens a connection to the API server and closes it (a
	// TCP handshake, no request; see Dialer). While a write is failing
	// without an answer (refused, reset, timed out; not a status such as a
	// 429 or a 503, which says the server is reachable) it is tried every
	// second, and when it succeeds after failing (the API
	// server's port accepts connections again) the writers retry at once
	// with their backoff reset, instead of at the end of a wait of up to a
	// minute. Where something always accepts the connection (a load
	// balancer in front of the API servers) it never fails, and the
	// backoff alone paces the retries.
	Dial func(ctx context.Context) error
}

// Timing constants.
const (
	// coalesce is how long the status writer waits after a change for more
	// changes before it writes (the spec asks for the write within 1 s).
	coalesce   = 200 * time.Millisecond
	backoffMin = time.Second
	backoffMax = time.Minute
	// EventDedupeWindow: identical events (reason and message) within this
	// window become one Event with a count.
	EventDedupeWindow = 10 * time.Minute
	// eventCountFlush: the count of an aggregated Event is patched at most
	// this often.
	eventCountFlush = 10 * time.Second
	// maxAggregates bounds the event aggregation table.
	maxAggregates = 512
	// eventQueue bounds the events waiting for the writer.
	eventQueue = 1024
)

// Component is the reporting component of the daemon's Events.
const Component = "autopilot-health"

// Reporter writes the daemon's state to the Kubernetes API.
type Reporter struct {
	o       Options
	m       *Metrics
	events  <-chan report.Event
	adopted chan struct{}
	// stale are the daemon's condition types on the Node that it does not
	// evaluate here; the status loop removes them (see Options.Evaluated).
	stale []string
	// onNode are the condition types the last successful write put on the
	// Node: one the store no longer holds (removed when a reload disabled
	// its check) is removed from the Node by the next write.
	onNode []string
	// reportBoot is the bootID of the report on the Node as last read or
	// answered to a status write (the status loop's alone): until it is
	// this boot's, each status write carries the report documents too (see
	// writeStatus).
	reportBoot string
	// reportRefused: a status write that carried the report was refused
	// for its annotations (earlyRefused: the Node's other annotations
	// leave no room for it); the status writes carry it no more, and take
	// an earlier boot's report off the Node instead (the status loop's
	// alone).
	reportRefused bool
	// wrote is what the last successful write put on the Node, by type
	// (the status loop's alone): a change of a message alone waits for
	// the next heartbeat (messageOnly).
	wrote map[string]report.Condition
	// nodeMu guards written, nodeUID and nodeTypes, which the status and
	// annotation loops share.
	nodeMu sync.Mutex
	// written is closed after the first successful write of the conditions:
	// only then does the annotation loop write the report, so a report
	// carrying this boot's ID means the Node's conditions are this boot's
	// (Adopt); before, the status writes carry it (reportBoot).
	// It is replaced by an open one when the Node turns out to have been
	// registered anew (nodeAnswered), until the conditions are on it.
	written chan struct{}
	// nodeUID is the UID of the Node last read or written ("" before);
	// nodeTypes the condition types the last status write put on it, and
	// nodeConds the conditions it put there (wrote: a map never changed
	// once made).
	nodeUID   string
	nodeTypes []string
	nodeConds map[string]report.Condition
	// statusSent counts the status writes sent, statusDone those answered
	// (or failed): a report write's answer tells the conditions of another
	// writer only when no status write of the daemon's was on its way
	// while it was (see sentState).
	statusSent, statusDone uint64
	// statusUnsure: a status write failed without saying it did not land
	// (no answer, a 5xx: mayHaveLanded) since the last that succeeded; the
	// Node may hold it, not nodeConds, and an answer is not compared
	// (sentState) until a status write succeeds.
	statusUnsure bool
	// overwrites: per condition type, the last overwrite by another writer
	// logged (overwriteKey, or goneKey, addedKey, duplicateKey): one warning
	// per change, not one per refresh while the other writer keeps writing.
	overwrites map[string]string
	// clear are condition types whose every entry the next status write
	// deletes from the Node (a strategic merge $patch: delete removes them
	// all), writing the daemon's own one after it where it holds one:
	// a type it does not evaluate here that another writer added, or one
	// another writer duplicated (overwrittenLocked). Under nodeMu.
	clear []string
	// rewrite gets a token when the conditions must be written again (the
	// Node was registered anew, or another writer changed one of them:
	// nodeAnswered).
	rewrite chan struct{}
	// refreshes takes the annotation loop's report refresh to the status loop,
	// which writes it with the heartbeat in one status patch when the
	// heartbeat would fall due before the next refresh (see foldOffer).
	refreshes chan foldOffer
	// renderErr is the last error of rendering the report (annotation loop
	// only): logged when it changes, not on every write.
	renderErr string
	// fitShort: the last refresh written left documents out for room
	// (fitReport); fitOthers is what the Node's other annotations took in
	// its answer, which the next refresh chooses by, fitTamper what its
	// tamper annotation took (tamperSize); leftOutLogged the domains left
	// out the journal last heard of, joined (fitted). The annotation loop's
	// alone.
	fitShort      bool
	fitOthers     int
	fitTamper     int
	leftOutLogged string
	// statusAnswer is the Node the last successful status write was
	// answered with (the status loop's alone): a folded refresh's answer.
	statusAnswer *kubeapi.Node
	// changeWritten is when the last write of a change or an event
	// succeeded (closeIdle).
	changeWritten atomic.Pointer[time.Time]
	// eventSeq and retired are used by the event loop only.
	eventSeq, retired uint64
	// eventsHold is when the event loop's wait after a failed write ends
	// (zero when none is under way; the event loop's alone): an Event that
	// comes before then waits for it too (fold), as those that failed do,
	// not sent at once into a 429 whose Retry-After asked for a minute;
	// so does the count patch of a new occurrence of an Event sent before.
	eventsHold time.Time
	// eventsAsked is when the Retry-After of the event loop's last failed
	// write ends (retryWait): the API server's return (apiBack) ends
	// eventsHold no earlier.
	eventsAsked time.Time
	// eventsChanged: the event loop changed its aggregation since it was
	// last kept (keepEvents); eventsNamed: an Event was created since;
	// eventsTrimmed: aggregates done with were dropped since. keptAt:
	// when it was last kept; taken: the events taken off the queue since
	// (EventQueue.publish). The event loop's alone.
	eventsChanged, eventsNamed, eventsTrimmed bool
	keptAt                                    time.Time
	taken                                     int
	// eventsAnother: the credentials named another node when the event
	// loop last looked (eventsAnotherNode). The event loop's alone.
	eventsAnother bool
	// refusedKey is the errKey of the last refusal logged (dropRefused).
	refusedKey string
	// failing counts the writers whose last call failed without an answer
	// of the API server; probeLoop dials only while it is not 0.
	failing atomic.Int32
	// failingNow gets a token when failing leaves 0: probeLoop sleeps on
	// it while no writer fails (no timer wakes an idle daemon).
	failingNow chan struct{}
	// credsFailing counts the writers whose last call failed for the
	// credentials (credentialsRefused); credsLoop looks at the
	// credentials' files only while it is not 0, and sleeps on
	// credsFailingNow, which gets a token when it leaves 0, meanwhile.
	credsFailing    atomic.Int32
	credsFailingNow chan struct{}
	// backMu guards back, a channel closed (and replaced) when Dial
	// succeeds after failing, or when the credentials' files change
	// while calls fail for them (wake).
	backMu sync.Mutex
	back   chan struct{}
}

// New builds a Reporter. Its events come from Options.Events, a queue the
// caller registered with the store when it made the store (the daemon does,
// so a reporter built when the kubeconfig appears, long after the checks
// started, still sends the events from before). Without one, New creates a
// queue and registers it: events emitted before New are not sent.
func New(o Options) *Reporter {
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.EventCountFlush == 0 {
		o.EventCountFlush = eventCountFlush
	}
	if o.Events == nil {
		o.Events = NewEventQueue(o.Metrics)
		o.Store.Observe(o.Events)
	}
	// The queue's events, and the aggregation this reporter publishes, go
	// to the state file from now on (a no-op where the caller did so).
	o.Events.KeepIn(o.Store)
	r := &Reporter{o: o, m: o.Metrics, events: o.Events.ch, adopted: make(chan struct{}), written: make(chan struct{}), rewrite: make(chan struct{}, 1), refreshes: make(chan foldOffer), back: make(chan struct{}), failingNow: make(chan struct{}, 1), credsFailingNow: make(chan struct{}, 1),
		eventSeq: eventSeqStart()}
	r.m.SetReporting(true)
	return r
}

// Run runs the status, event and annotation writers until ctx is done.
// Nothing here blocks the checks: the store is read, never locked for I/O.
func (r *Reporter) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { r.statusLoop(ctx) })
	wg.Go(func() { r.eventLoop(ctx) })
	wg.Go(func() { r.annotationLoop(ctx) })
	if r.o.Dial != nil {
		wg.Go(func() { r.probeLoop(ctx) })
	}
	if _, ok := r.o.Client.(credentialsWatcher); ok {
		wg.Go(func() { r.credsLoop(ctx) })
	}
	// A disk that hung under the kubeconfig answers again: the writers
	// retry now, not at the end of their backoff's wait (up to a minute).
	if n, ok := r.o.Client.(filesAnsweredNotifier); ok {
		n.onFilesAnswered(r.wake)
	}
	wg.Wait()
}

// credsLoop's pace of looks at the credentials' files while calls fail for
// them: one every credsPoll for the first credsFast of the failure, then
// the wait doubles up to credsPollMax, from then on at the points of the
// daemon's 10 s grid (Options.Grid), where its 10 s probes wake it anyway.
// The first minutes are those of a fix soon after the failure began (the
// kubelet's new bootstrap or rotation, an operator at work): seen within
// about a second. A failure that lasts (a node_name not the node's own,
// answered 403 for days) costs a look every 10 s, no wake-up of its own;
// credentials fixed hours later reach the Node within credsPollMax and the
// call. A change of the files, or calls that succeed, start the pace anew.
const (
	credsPoll    = time.Second
	credsFast    = 5 * time.Minute
	credsPollMax = 10 * time.Second
)

// credsLoop wakes the writers waiting to retry when the kubeconfig or the
// client certificate files it names change while their calls fail for the
// credentials (401, 403, a TLS error of a certificate): an operator who
// fixed a node's credentials (the kubelet's rotation or a new bootstrap,
// a pair copied in, kubelet.conf rewritten) has the Node updated within
// about a second in the first credsFast of the failure (credsPoll, then
// the call) and within credsPollMax after it, not at the end of a backoff
// wait of up to a minute. It stats the files (CredentialsChanged) at that
// pace while a writer's last call failed so, and sleeps on
// credsFailingNow otherwise: no timer while the writes succeed, nor while
// they fail otherwise.
func (r *Reporter) credsLoop(ctx context.Context) {
	// since: when the failure began or the files last changed; step: the
	// wait before the look to come, off the grid.
	var since time.Time
	step := credsPoll
	anew := func() time.Duration {
		since, step = time.Now(), credsPoll
		return step
	}
	next := func() time.Duration {
		if time.Since(since) < credsFast {
			return credsPoll
		}
		step = min(2*step, credsPollMax)
		if step < credsPollMax || r.o.Grid.Anchor().IsZero() {
			return step
		}
		return r.o.Grid.Until(time.Now(), credsPollMax)
	}
	anew()
	t := time.NewTimer(credsPoll)
	defer t.Stop()
	for {
		if r.credsFailing.Load() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.credsFailingNow:
			}
			t.Reset(anew())
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-r.credsFailingNow:
			// The calls succeeded meanwhile and fail again: a new
			// failure, looked at once a second again.
			t.Reset(anew())
			continue
		case <-t.C:
		}
		if r.credsFailing.Load() != 0 && CredentialsChanged(r.o.Client) {
			r.wake()
			t.Reset(anew())
			continue
		}
		t.Reset(next())
	}
}

// wake has the writers waiting to retry retry now, their backoff reset
// (apiBack), but not before the end of what the API server asked for.
func (r *Reporter) wake() {
	r.backMu.Lock()
	close(r.back)
	r.back = make(chan struct{})
	r.backMu.Unlock()
}

// probeInterval is how often probeLoop dials while a write is failing and
// the API server's address refuses connections; probeAcceptedMax how often
// at least while it accepts them (see probeLoop).
const (
	probeInterval    = time.Second
	probeAcceptedMax = 30 * time.Second
)

// probeLoop dials the API server every probeInterval while a writer is
// failing, and tells the writers when it answers again after refusing (or
// not answering): see Options.Dial. While the dials succeed and the writes
// still get no answer (a load balancer that always accepts, an API server
// that accepts connections and answers none), a dial tells nothing until one
// is refused: the wait between them doubles, up to probeAcceptedMax, rather
// than a connection a second from every node on the API server's bad day. A
// refused dial sets it back to probeInterval, so the return is noticed
// within a second again.
func (r *Reporter) probeLoop(ctx context.Context) {
	t := time.NewTimer(probeInterval)
	defer t.Stop()
	down := false
	wait := probeInterval
	for {
		if r.failing.Load() == 0 {
			// Nothing fails: sleep until a writer does.
			down, wait = false, probeInterval
			select {
			case <-ctx.Done():
				return
			case <-r.failingNow:
			}
			t.Reset(wait)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.failing.Load() == 0 {
			t.Reset(wait)
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, probeInterval)
		err := r.o.Dial(dctx)
		cancel()
		switch {
		case err != nil:
			down, wait = true, probeInterval
		case down:
			down = false
			r.wake()
		default:
			wait = min(2*wait, probeAcceptedMax)
		}
		t.Reset(wait)
	}
}

// apiBack returns a channel closed when the API server accepts connections
// again after it did not (never closed without Options.Dial), or when the
// credentials' files changed while calls failed for them (credsLoop).
func (r *Reporter) apiBack() <-chan struct{} {
	r.backMu.Lock()
	defer r.backMu.Unlock()
	return r.back
}

// Adopted is closed once the Node's conditions have been read and carried
// into the store.
func (r *Reporter) Adopted() <-chan struct{} { return r.adopted }

func (r *Reporter) progress(loop string, maxSilence time.Duration) {
	if r.o.Progress != nil {
		r.o.Progress(loop, maxSilence)
	}
}

// retryWait is the wait before the next try of a call that failed with
// err: the backoff's next, or what the API server's answer asked for
// where that is longer (its Retry-After: a 429 of its priority and
// fairness, a 5xx), up to backoffMax, so that an hour's Retry-After does
// not keep the Node without the final state for an hour. The client sends
// each request once and leaves the wait to this (restClient).
//
// asked is when the part of the wait the API server asked for ends (zero
// where it asked none): the API server's return, noticed by the probe
// after another call went unanswered (apiBack), ends the backoff at once,
// never that part (afterBack): the server that answered this call is the
// one that asked it to wait.
func retryWait(bo *backoff.Backoff, err error) (wait time.Duration, asked time.Time) {
	wait = bo.Next()
	if a, ok := askedDelay(err); ok {
		wait = max(wait, a)
		asked = time.Now().Add(a)
	}
	return wait, asked
}

// askedDelay is the wait the API server's answer err asked for (its
// Retry-After), up to backoffMax; ok false where it asked none.
func askedDelay(err error) (time.Duration, bool) {
	s, ok := apierrors.SuggestsClientDelay(err)
	if !ok {
		return 0, false
	}
	return min(time.Duration(s)*time.Second, backoffMax), true
}

// afterBack is how much of a retry's wait is left once the API server is
// back (apiBack): none, or the rest of what it asked for (asked, from
// retryWait).
func afterBack(asked time.Time) time.Duration { return max(0, time.Until(asked)) }

// sleepRetry waits d, a retry's wait from retryWait (asked its asked),
// ended early by the API server's return (apiBack) as afterBack says, the
// backoff then reset. It reports false when ctx ended first.
func (r *Reporter) sleepRetry(ctx context.Context, d time.Duration, asked time.Time, bo *backoff.Backoff) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-r.apiBack():
			bo.Reset()
			t.Reset(afterBack(asked))
		}
	}
}

// errorLog logs the first failure of a kind of call, and again only when
// the error changes or the call recovers: an API server outage is a few
// lines in the journal, not one per retry.
type errorLog struct {
	log      *slog.Logger
	what     string
	last     string // errKey of the last error logged
	failures int
	// failing, if set, counts the loops whose last call got no answer
	// (Reporter.failing; counted: this one is counted); failingNow gets a
	// token when it leaves 0.
	failing    *atomic.Int32
	failingNow chan struct{}
	counted    bool
	// credsFailing, if set, counts the loops whose last call failed for
	// the credentials (Reporter.credsFailing; credsCounted: this one is
	// counted); credsFailingNow gets a token when it leaves 0.
	credsFailing    *atomic.Int32
	credsFailingNow chan struct{}
	credsCounted    bool
	// credsBack, if set, wakes the other loops waiting to retry
	// (Reporter.wake) when this one's call succeeds after failing for the
	// credentials.
	credsBack func()
}

func (r *Reporter) newErrorLog(what string) *errorLog {
	return &errorLog{log: r.o.Log, what: what, failing: &r.failing, failingNow: r.failingNow,
		credsFailing: &r.credsFailing, credsFailingNow: r.credsFailingNow, credsBack: r.wake}
}

// count sets a loop's membership (in, was *counted) in the count n of
// failing loops, giving now a token when n leaves 0.
func count(in bool, counted *bool, n *atomic.Int32, now chan struct{}) {
	if n == nil || in == *counted {
		return
	}
	*counted = in
	if !in {
		n.Add(-1)
	} else if n.Add(1) == 1 && now != nil {
		select {
		case now <- struct{}{}:
		default:
		}
	}
}

// credentialsRefused reports whether err is a failure that other
// credentials' files could end: the API server's 401 (a certificate
// expired, or not signed by its client CA) or 403 (the Node authorizer's
// answer to a certificate that names another node, or no node), the TLS
// handshake failed on a certificate (the server's alert about the client
// certificate, a server certificate the kubeconfig's CA does not verify).
func credentialsRefused(err error) bool {
	if apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) || serverCertUntrusted(err) {
		return true
	}
	// The server's alert: bad certificate, certificate required, expired
	// certificate, unknown certificate authority.
	alert, ok := tlsAlert(err)
	return ok && strings.Contains(alert, "certificate")
}

// serverCertUntrusted reports whether err is the API server's certificate
// not verified by the kubeconfig's CA (an unknown authority, invalid or
// expired, another host's name), as crypto/tls's verification says it.
func serverCertUntrusted(err error) bool {
	var (
		ua x509.UnknownAuthorityError
		ci x509.CertificateInvalidError
		he x509.HostnameError
		ve *tls.CertificateVerificationError
	)
	return errors.As(err, &ua) || errors.As(err, &ci) || errors.As(err, &he) || errors.As(err, &ve)
}

// tlsAlert is the alert with which the API server ended the TLS handshake
// ("tls: certificate required"), ok false where err holds none. crypto/tls
// returns an alert received over TCP as a *net.OpError "remote error"
// around its unexported alert type; tls.AlertError only on QUIC.
func tlsAlert(err error) (alert string, ok bool) {
	var ae tls.AlertError
	if errors.As(err, &ae) {
		return ae.Error(), true
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" && oe.Err != nil {
		return oe.Err.Error(), true
	}
	return "", false
}

func (l *errorLog) fail(err error, retryIn time.Duration) {
	// Only a call the API server did not answer (refused, reset, timed
	// out) has the probe dial: an answer (a 429 of its priority and
	// fairness, a 503, a 403) says the server is reachable, and a dial a
	// second from every node would only add load on its bad day.
	count(!answered(err), &l.counted, l.failing, l.failingNow)
	count(credentialsRefused(err), &l.credsCounted, l.credsFailing, l.credsFailingNow)
	l.failures++
	k := errKey(err)
	if k == l.last {
		return
	}
	l.last = k
	args := []any{"err", err.Error(), "retry_in", retryIn.Round(time.Millisecond)}
	if apierrors.IsForbidden(err) {
		l.log.Error(l.what+" refused by the API server: the credentials do not allow it (is node_name this node's own name?)", args...)
		return
	}
	l.log.Warn(l.what+" failed; will retry", args...)
}

// errKey is what errorLog compares to tell a changed error from the same
// one again: for an answer of the API server its code and reason; for any
// other error its innermost cause (with the operation of a network error),
// without the addresses around it. A connection reset names the local port
// (read tcp 10.0.0.5:54778->10.0.0.1:6443), another at each retry: the
// text alone would make every retry a "changed error".
//
// A certificate the verifier finds out of its validity (the API server's
// expired, or not valid yet by a clock that is behind) is named by the
// reason and the certificate's validity: the verifier's words name the
// present time ("current time ... is after ..."), another at each retry.
//
// A call that got no answer in time is one error, whichever timer ended
// it: client-go's context and net/http's Client.Timeout both end a call
// after the client's 15 s, and which fires first is a race ("context
// deadline exceeded" one try, "net/http: request canceled (Client.Timeout
// exceeded while awaiting headers)" the next), as is the dial's own timeout
// against them where nothing takes the connection.
func errKey(err error) string {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		st := se.Status()
		return fmt.Sprintf("status %d %s", st.Code, st.Reason)
	}
	if ne := net.Error(nil); errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return "timeout: no answer in time"
	}
	var ce x509.CertificateInvalidError
	if errors.As(err, &ce) {
		k := fmt.Sprintf("x509: certificate invalid (reason %d)", ce.Reason)
		if c := ce.Cert; c != nil {
			k += fmt.Sprintf(" %s valid %s to %s", c.Subject, c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
		}
		return k
	}
	op := ""
	for {
		if oe, ok := err.(*net.OpError); ok {
			op = oe.Op + ": "
		}
		inner := errors.Unwrap(err)
		if inner == nil {
			return op + err.Error()
		}
		err = inner
	}
}

func (l *errorLog) ok() {
	if l.failures > 0 {
		l.log.Info(l.what+" recovered", "failed_attempts", l.failures)
	}
	count(false, &l.counted, l.failing, nil)
	// The credentials work again: a call that read the changed files
	// before credsLoop looked took the change for read, so the loops still
	// waiting on a refusal are woken here, not left to their backoff.
	if l.credsCounted && l.credsBack != nil && l.credsFailing.Load() > 1 {
		l.credsBack()
	}
	count(false, &l.credsCounted, l.credsFailing, nil)
	l.failures, l.last = 0, ""
}

// answered reports whether err is an answer of the API server (a status,
// whatever its code), or an HTTP answer from its address that is not the
// API server's (httpAnswer: a load balancer's page, a redirect), not a
// call that got none.
func answered(err error) bool {
	var se apierrors.APIStatus
	var ha httpAnswer
	return errors.As(err, &se) && se.Status().Code != 0 || errors.As(err, &ha)
}

// statusLoop reads the Node's conditions once, carries them into the
// store, then writes the daemon's conditions on every change (coalesced)
// and at least every heartbeat period.
func (r *Reporter) statusLoop(ctx context.Context) {
	const loop = "kube/status"
	bo := backoff.Backoff{Min: backoffMin, Max: backoffMax}
	el := r.newErrorLog("reading node " + r.o.NodeName)
	r.m.setStatusPending(true) // nothing written yet
	for {
		r.progress(loop, backoffMax)
		err := r.adopt(ctx)
		if err == nil {
			el.ok()
			break
		}
		// The writes wait for the read: the Node is not updated
		// meanwhile either.
		r.m.nodeWrote(ctx, err)
		wait, asked := retryWait(&bo, err)
		el.fail(err, wait)
		if !r.sleepRetry(ctx, wait, asked, &bo) {
			return
		}
	}
	close(r.adopted)
	bo.Reset()

	el = r.newErrorLog("writing conditions of node " + r.o.NodeName)
	dirty := true
	// beat: the write due is a heartbeat's alone (no change to write);
	// deferred: messages changed since the last write wait for the next
	// heartbeat (messageOnly), or the last write on a stop.
	beat, deferred := false, false
	// hbAt is when the next heartbeat falls due (hb fires then).
	hbAt := time.Now().Add(r.heartbeatIn())
	hb := time.NewTimer(time.Until(hbAt))
	defer hb.Stop()
	resetBeat := func() {
		hbAt = time.Now().Add(r.heartbeatIn())
		hb.Reset(time.Until(hbAt))
	}
	var retry <-chan time.Time
	// asked: when the Retry-After of the failed write that retry waits
	// for ends (retryWait): neither the API server's return nor a rewrite
	// ends the wait before.
	var asked time.Time
	// retryAfterAsked is the retry once what cut its wait short: at once,
	// or at the end of what the API server asked for.
	retryAfterAsked := func() <-chan time.Time {
		if d := afterBack(asked); d > 0 {
			return time.After(d)
		}
		return nil
	}
	// changed is closed by the store's next change after it was read; it is
	// read again only once the loop took that change (case <-changed), so
	// that a change is never lost to a wake-up that wrote without it: a
	// report refresh carrying the heartbeat, whose write may be on its way
	// when the change comes, a wake-up the select chose over it.
	changed := r.o.Store.Changed()
	for {
		r.progress(loop, max(r.o.HeartbeatPeriod+r.o.HeartbeatPeriod/10+heartbeatGrid, backoffMax))
		r.m.setStatusPending(dirty || deferred)
		if dirty && retry == nil {
			err := r.writeStatus(ctx, nil)
			if err != nil && ctx.Err() != nil {
				// Shutdown cut the write short: the last change still
				// gets its one short attempt.
				r.finalWrite(true)
				return
			}
			r.m.nodeWrote(ctx, err)
			if err != nil {
				var wait time.Duration
				wait, asked = retryWait(&bo, err)
				el.fail(err, wait)
				retry = time.After(wait)
			} else {
				el.ok()
				bo.Reset()
				dirty, deferred = false, false
				r.m.setStatusPending(false)
				// A change that came after the loop read the store
				// (changed) was in this write: it counts as a change's.
				select {
				case <-changed:
					beat = false
				default:
				}
				if beat {
					// The next write is the next heartbeat, minutes away,
					// unless a change comes first.
					r.closeIdle()
				} else {
					r.changeWrote()
				}
				beat = false
				resetBeat()
			}
		}
		select {
		case <-ctx.Done():
			// Also a change the loop has not taken yet (changed closed
			// beside the stop): one that came while a report refresh
			// carrying the heartbeat was on its way, cut short by the stop.
			now, messages := r.sinceWrite()
			r.finalWrite(dirty || deferred || now || messages)
			return
		case <-changed:
			select {
			case <-ctx.Done():
				r.finalWrite(true)
				return
			case <-time.After(coalesce):
			}
			// A change from here on is one the comparison below may miss.
			changed = r.o.Store.Changed()
			if now, messages := r.sinceWrite(); !dirty && !now {
				// The next heartbeat takes new messages: a message
				// that changes at every run of its check (a count, an
				// estimated error) is not a write each time.
				deferred = deferred || messages
				r.m.setStatusPending(deferred)
				break
			}
			dirty, beat = true, false
		case <-hb.C:
			beat = !dirty
			dirty = true
		case <-r.rewrite:
			// The Node was registered anew: the conditions go back on it
			// now, before the next report (nodeAnswered), also when a
			// retry is pending: the report write just reached the new
			// Node, where the writes that failed found none (404), and
			// the report waits for them. One token per report write,
			// which then waits for this write: no loop. Or another writer
			// changed one of the conditions: they go back now, one token
			// per report refresh at most, however often it does.
			dirty, beat = true, false
			if retry != nil {
				retry = retryAfterAsked()
			}
		case o := <-r.refreshes:
			// A report refresh: when the heartbeat falls due before the
			// next one, this write is the heartbeat too (one write, not
			// two), and the heartbeat's wait starts again from it. Not
			// while a write of the conditions waits (a change, a retry):
			// the refresh is written alone, and the heartbeat as before.
			if dirty || retry != nil || !hbAt.Before(o.next) {
				o.answer <- foldAnswer{}
				break
			}
			err := r.writeStatus(ctx, o.docs)
			if errors.Is(err, errNoConditions) {
				o.answer <- foldAnswer{}
				break
			}
			o.answer <- foldAnswer{folded: true, err: err, node: r.statusAnswer}
			r.m.nodeWrote(ctx, err)
			if a, ok := askedDelay(err); ok && a > 0 {
				// The write was this loop's too: its next (the heartbeat,
				// a change) waits out what the answer asked for, as after
				// a change's write answered so; the refresh's retry is the
				// annotation loop's.
				asked = time.Now().Add(a)
				retry = time.After(a)
			}
			if err == nil {
				deferred = false
				r.m.setStatusPending(false)
				resetBeat()
			}
		case <-retry:
			retry = nil
		case <-r.apiBack():
			if retry != nil {
				retry = retryAfterAsked()
				bo.Reset()
			}
		}
	}
}

// finalWriteTimeout bounds the last writes on shutdown (finalWrite,
// finalFlush), which run side by side.
const finalWriteTimeout = 2 * time.Second

// finalWrite makes one short attempt, on shutdown, to write a change that
// is not on the Node yet. The conditions are otherwise left as they are.
func (r *Reporter) finalWrite(dirty bool) {
	if !dirty {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), finalWriteTimeout)
	defer cancel()
	if err := r.writeStatus(ctx, nil); err != nil {
		r.o.Log.Warn("last write of conditions before shutdown failed; the state file keeps them for the next start", "err", err)
	}
}

// anotherNode says whether the credentials in use now are a node's
// (system:node:<name>) and name another node than NodeName: the daemon then
// speaks about no Node, neither taking its conditions over (adopt) nor
// sending Events about it (fold, restoreKept). Credentials of no node (""
// when not known, another user) change nothing. The credentials are the
// client's now (UserNow: the kubelet's certificate rotated, kubelet.conf
// rewritten), Identity for a client that cannot tell.
func (r *Reporter) anotherNode() bool {
	id := r.identity()
	return strings.HasPrefix(id, "system:node:") && id != "system:node:"+r.o.NodeName
}

// identity is the user the credentials in use now name (anotherNode).
func (r *Reporter) identity() string {
	if id, ok := UserNow(r.o.Client); ok {
		return id
	}
	return r.o.Identity
}

// eventsAnotherNode is anotherNode for the event loop, which says when it
// changed since the loop last looked: the kubelet's certificate rotated to
// another node's name or back, kubelet.conf rewritten.
func (r *Reporter) eventsAnotherNode() bool {
	another := r.anotherNode()
	if another != r.eventsAnother {
		if another {
			r.o.Log.Error("the credentials now name another node than node_name: no Events are sent about it (counted in events_dropped_total{reason=\"another_node\"})",
				"node_name", r.o.NodeName, "credentials", r.identity())
		} else {
			r.o.Log.Info("the credentials name node_name's node again: its Events are sent", "node_name", r.o.NodeName)
		}
		r.eventsAnother = another
	}
	return another
}

// adopt reads the Node and carries its conditions of our types into the store.
func (r *Reporter) adopt(ctx context.Context) error {
	if r.anotherNode() {
		// Its conditions (a tamper finding held forever among them) are
		// another node's and must not become this one's; where nodes may
		// read other nodes (API servers without the Node authorizer's
		// selectors) the read would succeed. Not read at all. Nor is an
		// Event sent about it (the event writer drops them: fold).
		r.o.Log.Error("node_name names another node than the credentials do: nothing is taken over from that Node, no Events are sent about it (counted in events_dropped_total{reason=\"another_node\"}), and the API server will refuse the writes (NodeRestriction)",
			"node_name", r.o.NodeName, "credentials", r.identity())
		return nil
	}
	start := time.Now()
	node, err := r.o.Client.GetNode(ctx, r.o.NodeName)
	r.m.observe(KindRead, start, err)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s is not registered (yet): the kubelet creates it: %w", r.o.NodeName, err)
	}
	if err != nil {
		return err
	}
	r.nodeMu.Lock()
	r.nodeUID = node.Metadata.UID
	r.nodeMu.Unlock()
	n := 0
	nodeBoot := report.ReportBootID(node.Metadata.Annotations)
	r.reportBoot = nodeBoot
	if at := report.ReportedClear(node.Metadata.Annotations); !at.IsZero() {
		// An operator's clear this daemon published to the Node: a True
		// from before it is not taken back. (The clear in the tamper state
		// file alone is never trusted.)
		for _, d := range report.Conditions {
			if d.Hold == report.HoldForever {
				r.o.Store.SetCleared(d.Type, at)
			}
		}
		if r.o.ReportedClear != nil {
			r.o.ReportedClear(at)
		}
	}
	r.stale = nil
	for _, c := range node.Status.Conditions {
		if _, ours := report.Lookup(c.Type); !ours {
			continue
		}
		if r.o.Evaluated != nil && !r.o.Evaluated(c.Type) {
			r.stale = append(r.stale, c.Type)
			if d, _ := report.Lookup(c.Type); d.Hold == report.HoldForever && report.Status(c.Status) == report.StatusTrue &&
				(r.o.RemovedLogged == nil || !r.o.RemovedLogged(c.Type, c.Reason, c.Message)) {
				// A finding only an operator's clear lowers: its check
				// disabled takes it off the Node all the same, on the record.
				r.o.Log.Warn(report.TamperFindingRemovedLog,
					"condition", c.Type, "reason", c.Reason, "message", c.Message, "since", c.LastTransitionTime.Time)
			}
			continue
		}
		if r.o.Store.Adopt(report.Condition{Type: c.Type, Status: report.Status(c.Status), Reason: report.Reason(c.Reason),
			Message: c.Message, LastTransitionTime: c.LastTransitionTime.Time}, nodeBoot) {
			n++
		}
	}
	r.o.Log.Info("read node conditions", "node", r.o.NodeName, "carried_over", n)
	return nil
}

// statusPatch is the strategic merge patch of Node.status.conditions with
// the daemon's conditions: the API merges it by condition type, so kubelet's
// and other writers' conditions are left alone. docs, when not nil, are
// report annotations written in the same patch (metadata.annotations,
// merged by key, a nil value removing its key; the nodes/status
// subresource takes them).
func statusPatch(conds []report.Condition, remove []string, docs map[string]*string, now time.Time) ([]byte, error) {
	out := make([]any, 0, len(conds)+len(remove))
	for _, c := range conds {
		out = append(out, kubeapi.NodeCondition{
			Type: c.Type, Status: string(c.Status),
			Reason: string(c.Reason), Message: c.Message,
			LastTransitionTime: metav1.NewTime(c.LastTransitionTime),
			LastHeartbeatTime:  metav1.NewTime(now),
		})
	}
	for _, t := range remove {
		// The strategic merge patch directive that deletes the list
		// entries with this merge key (type), all of them where another
		// writer appended a second one. It goes before the list's other
		// entries are merged: the daemon's own entry of the type, if in
		// conds, is then written once, after them.
		out = append(out, map[string]string{"type": t, "$patch": "delete"})
	}
	patch := map[string]any{"status": map[string]any{"conditions": out}}
	if docs != nil {
		patch["metadata"] = map[string]any{"annotations": docs}
	}
	return json.Marshal(patch)
}

// wroteOnce records that this run's conditions are on the Node (closes
// written once). Called by the status loop only.
func (r *Reporter) wroteOnce() {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	select {
	case <-r.written:
	default:
		close(r.written)
	}
}

// writtenCh returns written (see there).
func (r *Reporter) writtenCh() <-chan struct{} {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	return r.written
}

// nodeAnswered looks at the Node a write of the report annotations
// answered with. When it is another Node than the one read or written
// before (its UID changed: deleted and registered anew by the kubelet), or
// lacks a condition the last status write put on it, the conditions are
// written again at once, and the next report waits for them (written):
// else they would be back only with the next heartbeat, minutes after the
// report. It reports whether the Node was registered anew: its UID changed,
// or a condition is missing where either UID is not known. A condition
// missing from the Node of the same UID is another writer's removal
// (kubectl patch with $patch: delete): counted as an overwrite and logged
// so, once per change, not as a Node registered anew.
//
// sent is what the last status write put on the Node as of before the
// write that got n was sent (sentBefore): a status write that adds a type
// while that write is in flight is not in its answer, and is no sign of a
// Node registered anew.
//
// Else, when another writer changed the status, reason or transition time
// of one of the daemon's conditions (overwritten), the conditions are
// written again at once too (the report does not wait for them: it is not
// a Node registered anew), with the transition time the daemon holds.
func (r *Reporter) nodeAnswered(n *kubeapi.Node, sent sentState) bool {
	if n == nil {
		return false
	}
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	uid := n.Metadata.UID
	known := uid != "" && r.nodeUID != ""
	anew := known && uid != r.nodeUID
	if uid != "" {
		r.nodeUID = uid
	}
	var gone []string
	for _, t := range sent.types {
		// Missing, and still expected: a status write that removed it
		// (a reload stopped its check) while this write was in flight is
		// no sign of a Node registered anew either.
		if !slices.ContainsFunc(n.Status.Conditions, func(c kubeapi.NodeCondition) bool { return c.Type == t }) && slices.Contains(r.nodeTypes, t) {
			gone = append(gone, t)
		}
	}
	if anew || len(gone) > 0 && !known {
		r.rewriteLocked()
		return true
	}
	found := r.overwrittenLocked(n, sent)
	if len(gone) > 0 {
		// The same Node: another writer took them off. Back at once, the
		// next report after them, as on a Node registered anew.
		r.goneLocked(gone, sent)
		r.rewriteLocked()
		return false
	}
	if found {
		r.askRewrite()
	}
	return false
}

// goneLocked (under nodeMu) counts and logs the daemon's conditions gone
// from the Node (gone), which another writer removed: once per change, and
// not when a status write of the daemon's own was on its way (see
// overwrittenLocked; one that failed without an answer may have removed it).
func (r *Reporter) goneLocked(gone []string, sent sentState) {
	if !sent.settled || sent.seq != r.statusSent {
		return
	}
	for _, t := range gone {
		r.m.overwritten.Inc()
		w := sent.conds[t]
		if !r.logOverwriteOnce(t, goneKey(w)) {
			continue
		}
		r.o.Log.Warn("another writer removed a condition of the daemon's from the Node: writing it again (the daemon owns its condition types)",
			"node", r.o.NodeName, "condition", t, "status", w.Status, "reason", w.Reason, "since", w.LastTransitionTime.UTC().Truncate(time.Second))
	}
}

// logOverwriteOnce records key as the last overwrite of the condition type
// t logged, and reports whether it is another than the last (to be logged).
func (r *Reporter) logOverwriteOnce(t, key string) bool {
	if r.overwrites[t] == key {
		return false
	}
	if r.overwrites == nil {
		r.overwrites = map[string]string{}
	}
	r.overwrites[t] = key
	return true
}

// goneKey names the removal of the daemon's condition w (overwriteKey).
func goneKey(w report.Condition) string {
	return fmt.Sprintf("%s/%s/%d gone", w.Status, w.Reason, w.LastTransitionTime.Unix())
}

// clearLocked (under nodeMu) has the next status write delete every entry
// of the condition type t from the Node (clear).
func (r *Reporter) clearLocked(t string) {
	if !slices.Contains(r.clear, t) {
		r.clear = append(r.clear, t)
	}
}

// sentState is what a Node write's answer is compared with: the
// conditions the last status write put on the Node when the write was sent
// (sentBefore), and whether a status write of the daemon's own was on its
// way then (settled false) or was sent since (seq).
type sentState struct {
	types   []string
	conds   map[string]report.Condition
	settled bool
	seq     uint64
	// own: n is the answer to the daemon's own status write, which shows
	// its conditions as it wrote them whatever another writer does: no
	// sign that another writer stopped (overwrittenLocked).
	own bool
}

// sentBefore returns what the last status write put on the Node, as of
// now: call it before sending a write whose answer nodeAnswered takes.
func (r *Reporter) sentBefore() sentState {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	return sentState{types: slices.Clone(r.nodeTypes), conds: r.nodeConds, settled: r.statusSent == r.statusDone && !r.statusUnsure, seq: r.statusSent}
}

// overwrittenLocked (under nodeMu) reports whether the Node n, the answer
// to a write sent at sent, shows one of the daemon's conditions with
// another status, reason or transition time (to the second: the API's
// precision), or a condition held forever with another message (a tamper
// finding's evidence), than the daemon's last status write put there. A
// message alone another writer changed waits for the heartbeat, as the
// daemon's own changes of a message do (sinceWrite). When a status write
// of the daemon's own was on its way while this write was (sent before it
// was answered, or still unanswered when it was sent), the answer may hold
// that write's conditions or those before it: it tells nothing of another
// writer, and the next report refresh compares again. Each overwrite is
// counted and logged once per change (overwriteKey): again when a report
// refresh's answer showed the condition as written since.
//
// Two more of another writer's doings are found so, counted and logged alike,
// and undone by the next status write (clear): a condition type of the
// daemon's that it does not evaluate here (Options.Evaluated) on the Node,
// which its first write removed (another writer added it back: a
// GpuFallenOffBus=True by hand on a node without a GPU, which a
// MachineHealthCheck may act on), is deleted again; a type of the daemon's
// that the Node lists twice or more (a JSON patch appended an entry: the
// API server keeps both, and a strategic merge patch merges into the first
// alone, so the other writer's entry stood and every refresh found it
// again) has every entry deleted and the daemon's own written once.
func (r *Reporter) overwrittenLocked(n *kubeapi.Node, sent sentState) bool {
	if !sent.settled || sent.seq != r.statusSent {
		return false
	}
	found := false
	entries := map[string]int{}
	for _, c := range n.Status.Conditions {
		entries[c.Type]++
	}
	if !sent.own {
		// An addition of another writer's no longer on the Node: the
		// removal stands, and the next addition is a change of its own.
		for t := range r.overwrites {
			if _, wrote := sent.conds[t]; !wrote && entries[t] == 0 {
				delete(r.overwrites, t)
			}
		}
	}
	for t, k := range entries {
		_, wrote := sent.conds[t]
		_, ours := report.Lookup(t)
		switch {
		case !ours:
			continue
		case k > 1 && wrote:
			found = true
			r.clearOverwriteLocked(t, n, "another writer added a second entry of a condition of the daemon's to the Node: writing it once (the daemon owns its condition types)",
				"entries", k)
		case !wrote && r.o.Evaluated != nil && !r.o.Evaluated(t):
			found = true
			r.clearOverwriteLocked(t, n, "another writer added a condition of the daemon's that it does not evaluate on this node: removing it again (the daemon owns its condition types)")
		}
	}
	for _, c := range n.Status.Conditions {
		w, ok := sent.conds[c.Type]
		if !ok || entries[c.Type] > 1 {
			continue
		}
		if sameOnNode(w, c) {
			if !sent.own {
				// The put-back stands: the next overwrite, the same
				// as the last or not, is a change of its own, logged.
				delete(r.overwrites, c.Type)
			}
			continue
		}
		found = true
		r.m.overwritten.Inc()
		if !r.logOverwriteOnce(c.Type, overwriteKey(w, c)) {
			continue
		}
		r.o.Log.Warn("another writer changed a condition of the daemon's on the Node: writing it again (the daemon owns its condition types)",
			"node", r.o.NodeName, "condition", c.Type, "node_status", c.Status, "node_reason", c.Reason,
			"node_since", c.LastTransitionTime.UTC(), "status", w.Status, "reason", w.Reason, "since", w.LastTransitionTime.UTC().Truncate(time.Second))
	}
	return found
}

// sameOnNode reports whether the Node's condition c is what the daemon
// wrote as w, as far as the daemon writes it at once (see
// overwrittenLocked).
// clearOverwriteLocked (under nodeMu) counts another writer's entry of type
// t that the next status write takes off the Node (clear), and warns with
// msg, and args before the Node's entries, once per change of them.
func (r *Reporter) clearOverwriteLocked(t string, n *kubeapi.Node, msg string, args ...any) {
	r.m.overwritten.Inc()
	r.clearLocked(t)
	if r.logOverwriteOnce(t, duplicateKey(t, n)) {
		r.o.Log.Warn(msg, append(append([]any{"node", r.o.NodeName, "condition", t}, args...), "node_conditions", entriesOf(t, n))...)
	}
}

func sameOnNode(w report.Condition, c kubeapi.NodeCondition) bool {
	if string(w.Status) != c.Status || string(w.Reason) != c.Reason ||
		!w.LastTransitionTime.Truncate(time.Second).Equal(c.LastTransitionTime.Time) {
		return false
	}
	if d, _ := report.Lookup(w.Type); d.Hold == report.HoldForever {
		return w.Message == c.Message
	}
	return true
}

// overwriteKey names an overwrite: what the daemon wrote and what the Node
// showed instead. Another writer that writes the same over the same
// condition at every refresh is logged once.
func overwriteKey(w report.Condition, c kubeapi.NodeCondition) string {
	return fmt.Sprintf("%s/%s/%d %s/%s/%d/%s", w.Status, w.Reason, w.LastTransitionTime.Unix(), c.Status, c.Reason, c.LastTransitionTime.Unix(), c.Message)
}

// duplicateKey names the entries of the condition type t on the Node n
// (overwriteKey): an addition of another writer's, or a duplicate.
func duplicateKey(t string, n *kubeapi.Node) string {
	return "on node: " + strings.Join(entriesOf(t, n), "; ")
}

// entriesOf lists the entries of the condition type t on the Node n, as
// status/reason/since/message, in the Node's order.
func entriesOf(t string, n *kubeapi.Node) []string {
	var out []string
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			out = append(out, fmt.Sprintf("%s/%s/%s/%s", c.Status, c.Reason, c.LastTransitionTime.UTC().Format(time.RFC3339), c.Message))
		}
	}
	return out
}

// rewriteLocked (under nodeMu) asks for the conditions to be written again
// and holds the report until they are (written).
func (r *Reporter) rewriteLocked() {
	select {
	case <-r.written:
		r.written = make(chan struct{})
	default:
	}
	r.askRewrite()
}

// askRewrite asks the status loop for the conditions to be written again
// (one token, however often it is asked before the loop takes it), without
// holding the report for them.
func (r *Reporter) askRewrite() {
	select {
	case r.rewrite <- struct{}{}:
	default:
	}
}

// errRegisteredAnew is a report write the API server refused because the
// Node is not the one read or written before (its UID precondition).
var errRegisteredAnew = errors.New("the node was registered anew (another UID): its conditions go first")

// uidRefused reports whether err is the API server refusing a patch whose
// metadata.uid is not the Node's: 422 Invalid, "metadata.uid: field is
// immutable" (as kube-apiserver answers a merge patch that carries another
// UID; TestKubeReportNeverLandsOnANodeRegisteredAnew), or a 409 naming the
// UID precondition.
func uidRefused(err error) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return false
	}
	st := se.Status()
	if apierrors.IsConflict(err) {
		// A storage precondition's words ("Precondition failed: UID in
		// precondition: ..."), should an API server answer so.
		return strings.Contains(st.Message, "UID in precondition")
	}
	return apierrors.IsInvalid(err) && st.Details != nil &&
		slices.ContainsFunc(st.Details.Causes, func(c metav1.StatusCause) bool { return c.Field == "metadata.uid" })
}

// nodeRefused handles a report write refused for the UID it carried: the
// Node was deleted and registered anew since it was read or written. The
// conditions are written again first (their write learns the new UID), and
// the UID is forgotten, so that the next report write, after them, carries
// the new one or none: it cannot be refused for the old one again.
func (r *Reporter) nodeRefused() {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	r.nodeUID = ""
	r.rewriteLocked()
}

// knownUID is the UID of the Node last read or written ("" before).
func (r *Reporter) knownUID() string {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	return r.nodeUID
}

// sinceWrite compares the store's conditions with what the last write put
// on the Node: now, a difference to write at once (another set of types, a
// status, reason or transition time, or the message of a condition held
// forever: a tamper finding's evidence); messages, messages alone differ
// (they wait for the next heartbeat).
func (r *Reporter) sinceWrite() (now, messages bool) {
	conds := r.o.Store.All()
	if r.wrote == nil || len(r.stale) > 0 || len(conds) != len(r.wrote) {
		return true, false
	}
	for _, c := range conds {
		w, ok := r.wrote[c.Type]
		if !ok || w.Status != c.Status || w.Reason != c.Reason || !w.LastTransitionTime.Equal(c.LastTransitionTime) {
			return true, false
		}
		if w.Message != c.Message {
			if d, _ := report.Lookup(c.Type); d.Hold == report.HoldForever {
				return true, false
			}
			messages = true
		}
	}
	return false, messages
}

// writeStatus writes the store's conditions, every one's heartbeat with
// them. refresh, if not nil, is a report refresh the same patch carries
// (the annotation loop's, folded in: see foldOffer); a refusal of it is the
// refresh's failure, and the conditions are not written without it (the
// heartbeat, still due, goes on its own).
func (r *Reporter) writeStatus(ctx context.Context, refresh map[string]*string) error {
	conds := r.o.Store.All()
	remove := slices.Clone(r.stale)
	for _, t := range r.onNode {
		if !slices.ContainsFunc(conds, func(c report.Condition) bool { return c.Type == t }) && !slices.Contains(remove, t) {
			remove = append(remove, t)
		}
	}
	// Entries of another writer's to take off: all of the type's, the
	// daemon's own written after them (statusPatch).
	r.nodeMu.Lock()
	cleared := slices.Clone(r.clear)
	r.nodeMu.Unlock()
	for _, t := range cleared {
		if !slices.Contains(remove, t) {
			remove = append(remove, t)
		}
	}
	if len(conds) == 0 && len(remove) == 0 {
		if refresh != nil {
			// No heartbeat to carry: the refresh goes alone.
			return errNoConditions
		}
		// The Node holds none of the daemon's conditions (adoption put any
		// it holds into the store or stale): nothing of an earlier boot.
		r.wroteOnce()
		return nil
	}
	// The Node's report is of another boot (or there is none): its
	// conditions are this boot's once this write lands, but the report
	// waits for the checks' first pass, and a restart in between (the
	// state file and the kernel line gone) would take this boot's True
	// kernel condition for the earlier boot's (Adopt) and lower it. The
	// report of this boot, as far as the checks have collected it, goes
	// in the same patch: the Node never holds this boot's conditions
	// under another boot's report.
	docs := refresh
	// early: what the early report's fitted write left out (earlyFitting),
	// recorded as a refresh's once the write lands.
	var early *earlyFit
	if boot := r.o.Details.BootID(); refresh == nil && boot != "" && r.reportBoot != boot {
		switch {
		case !r.reportRefused:
			docs = r.earlyReport()
		case r.reportBoot != "":
			// Refused for the Node's annotations, and its retry with
			// what fits failed too (another writer grew its own, the
			// API server down): what fits again, one more read, so
			// that the clear stays (withoutReport only where the Node
			// cannot be read or not even the tamper stub fits).
			docs, early = r.earlyFitting(ctx, r.earlyReport())
		}
	}
	patch, err := statusPatch(conds, remove, docs, time.Now())
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := r.patchStatus(ctx, patch)
	r.m.observe(KindStatus, start, err)
	if refresh != nil {
		// One write that is the report refresh too: status shows it as
		// that call's (its count is status's: one call).
		r.m.called(KindAnnotations, err)
	}
	if err != nil && refresh == nil && docs != nil && !r.reportRefused && annotationsRefused(err) {
		// The report does not fit beside the Node's other annotations
		// (256 KiB together): the report write will be refused alike, but
		// the conditions must not be. They go without it, and the earlier
		// boot's report leaves the Node in the same patch, so the Node
		// never holds this boot's conditions under it (a restart judges
		// them by their transition times, as on a Node without a report).
		r.reportRefused = true
		var fitting map[string]*string
		fitting, early = r.earlyFitting(ctx, docs)
		if early != nil {
			r.o.Log.Warn("the report annotations do not fit on the Node beside its other annotations: conditions written with what fits of them (tamper first, a small document saying so for each other), and the earlier boot's report removed",
				"node", r.o.NodeName, "left_out", early.left, "room_bytes", early.room, "err", err)
		} else {
			r.o.Log.Warn("the report annotations do not fit on the Node beside its other annotations, and the Node could not be read or has no room for the tamper document's stub: conditions written without them, and the earlier boot's report removed",
				"node", r.o.NodeName, "err", err)
		}
		if patch, err = statusPatch(conds, remove, fitting, time.Now()); err != nil {
			return err
		}
		start = time.Now()
		n, err = r.patchStatus(ctx, patch)
		r.m.observe(KindStatus, start, err)
	}
	if err == nil {
		r.statusAnswer = n
		if n != nil {
			r.reportBoot = report.ReportBootID(n.Metadata.Annotations)
		}
		if early != nil {
			// Counted and shown as a refresh that left them out (the
			// annotation loop's first refresh chooses again); the
			// journal said which above.
			r.m.setLeftOut(early.left, false)
			for _, dm := range early.left {
				r.m.leftOut.WithLabelValues(dm).Inc()
			}
		}
		r.stale = nil
		r.onNode = r.onNode[:0]
		r.wrote = make(map[string]report.Condition, len(conds))
		for _, c := range conds {
			r.onNode = append(r.onNode, c.Type)
			r.wrote[c.Type] = c
		}
		r.nodeMu.Lock()
		if n != nil && n.Metadata.UID != "" {
			r.nodeUID = n.Metadata.UID
		}
		r.nodeTypes = slices.Clone(r.onNode)
		r.nodeConds = r.wrote
		r.statusUnsure = false
		r.clear = slices.DeleteFunc(r.clear, func(t string) bool { return slices.Contains(cleared, t) })
		if n != nil {
			// The write's own answer: the Node after this patch, whatever
			// another writer did before it. One of its conditions not as
			// written is something in the write's path changing it (a
			// mutating admission webhook): counted and logged as another
			// writer's, not written again, which would only change it back
			// in a loop. The next report refresh's answer has it written
			// again, once a refresh.
			r.overwrittenLocked(n, sentState{conds: r.wrote, settled: true, seq: r.statusSent, own: true})
		}
		r.nodeMu.Unlock()
		r.wroteOnce()
	}
	return err
}

// patchStatus sends a status write, counted in statusSent and statusDone
// (see sentState).
func (r *Reporter) patchStatus(ctx context.Context, patch []byte) (*kubeapi.Node, error) {
	r.nodeMu.Lock()
	r.statusSent++
	r.nodeMu.Unlock()
	n, err := r.o.Client.PatchNodeStatus(ctx, r.o.NodeName, patch)
	r.nodeMu.Lock()
	r.statusDone++
	if err != nil && mayHaveLanded(err) {
		r.statusUnsure = true
	}
	r.nodeMu.Unlock()
	return n, err
}

// mayHaveLanded reports whether a write that failed with err may still
// have changed the Node: anything but an answer of the API server that
// refused it (a 4xx: invalid, conflict, too many requests). A write that
// got no answer (timed out, reset) or a 5xx (a 504's "may still be
// processing the request") may have landed.
func mayHaveLanded(err error) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return true
	}
	code := se.Status().Code
	return code < 400 || code >= 500
}

// earlyReport is the report as far as the checks have collected it, for
// a status write (a failing domain carries an error document).
func (r *Reporter) earlyReport() map[string]*string {
	docs, _ := r.o.Details.Documents(time.Now(), r.role())
	out := make(map[string]*string, len(docs))
	for k, v := range docs {
		out[k] = &v
	}
	return out
}

// earlyFitting is what fits of docs, this boot's early report the API
// server refused for the Node's annotations, beside the Node's other
// annotations (one read; fitReport): each document this boot's, whole or a
// stub, so that the earlier boot's report leaves the Node as with
// withoutReport, but the tamper document keeps the operator's clear
// (tamper.cleared, the Node's only record of it, read back at start), which
// withoutReport took off the Node until the first refresh. Where the Node
// cannot be read, or not even the tamper stub fits (its annotation would be
// left as it is: the earlier boot's), it is withoutReport.
//
// fit is what was left out and the room there was; nil with withoutReport.
func (r *Reporter) earlyFitting(ctx context.Context, docs map[string]*string) (_ map[string]*string, fit *earlyFit) {
	start := time.Now()
	node, err := r.o.Client.GetNode(ctx, r.o.NodeName)
	r.m.observe(KindRead, start, err)
	if err != nil {
		return withoutReport(), nil
	}
	whole := make(map[string]string, len(docs))
	for k, v := range docs {
		if v != nil {
			whole[k] = *v
		}
	}
	now, role := time.Now(), r.role()
	others := othersSize(node.Metadata.Annotations)
	out, left, asIs := fitReport(whole, others, tamperSize(node.Metadata.Annotations), r.leftOutStub(now, role, whole))
	if asIs {
		return withoutReport(), nil
	}
	for _, dm := range report.Domains {
		if k := report.AnnotationPrefix + dm.Name; !hasKey(out, k) {
			out[k] = nil // not in docs: the earlier boot's leaves
		}
	}
	return out, &earlyFit{left: left, room: annotationsLimit - others}
}

// earlyFit is what the early report's fitted write left out (left, by
// domain) and the room the Node's other annotations left it.
type earlyFit struct {
	left []string
	room int
}

func hasKey(m map[string]*string, k string) bool { _, ok := m[k]; return ok }

// withoutReport removes the report annotations (a merge patch's nulls).
func withoutReport() map[string]*string {
	out := make(map[string]*string, len(report.Domains))
	for _, dm := range report.Domains {
		out[report.AnnotationPrefix+dm.Name] = nil
	}
	return out
}

// annotationsRefused reports whether err is the API server refusing a
// write for the annotations it would leave on the Node: 422 Invalid on
// metadata.annotations (kube-apiserver: "Too long: may not be more than
// 262144 bytes", all annotations together), or a request too large.
func annotationsRefused(err error) bool {
	if apierrors.IsRequestEntityTooLargeError(err) {
		return true
	}
	var se apierrors.APIStatus
	if !errors.As(err, &se) || !apierrors.IsInvalid(err) {
		return false
	}
	st := se.Status()
	return st.Details != nil && slices.ContainsFunc(st.Details.Causes, func(c metav1.StatusCause) bool {
		return strings.HasPrefix(c.Field, "metadata.annotations")
	})
}

// idleCloser is a Client that can close its idle connections (the
// daemon's; restClient).
type idleCloser interface{ CloseIdle() }

// closeIdle closes the client's idle connections after a periodic write
// (the report annotations, a heartbeat), whose loop writes next minutes
// later. The transport would close the connection after clientIdleClose
// (80 s) idle all the same, waking the daemon off the grid for a connection
// no write uses (over HTTP/2, client-go's health check would also ping it
// every 30 s; the daemon speaks HTTP/1.1, apiProtocols). Closed within the
// write's own wake-up, it costs none; the next
// write opens a new one, resuming the TLS session (resumeSessions).
//
// Not while changes are being written: a connection that carried the write
// of a change or an event within the last clientIdleClose would stay open
// until then, and closing it would make the next change dial and
// handshake anew (a condition that flaps every minute would otherwise pay
// a handshake for each of its writes after a periodic one).
func (r *Reporter) closeIdle() {
	if last := r.changeWritten.Load(); last != nil && time.Since(*last) < clientIdleClose {
		return
	}
	if c, ok := r.o.Client.(idleCloser); ok {
		c.CloseIdle()
	}
}

// apiIdleClose is how long the API server keeps a connection that carries
// no request (k8s.io/apiserver's IdleTimeout).
const apiIdleClose = 90 * time.Second

// changeWrote records that the write of a change or an event succeeded
// (closeIdle).
func (r *Reporter) changeWrote() {
	now := time.Now() // with its monotonic reading: a step of the clock does not count
	r.changeWritten.Store(&now)
}

// heartbeatGrid is the step of the grid a heartbeat falls on: that of the
// 10 s probes, so that a heartbeat wakes the daemon together with them.
const heartbeatGrid = 10 * time.Second

// heartbeatIn is how long until the next heartbeat: the heartbeat period
// lengthened by up to 10 % (jitter), then to the next point of the
// daemon's 10 s grid (whose anchor, the daemon's start, differs from node
// to node, as the jitter does).
func (r *Reporter) heartbeatIn() time.Duration {
	d := jitter(r.o.HeartbeatPeriod)
	if r.o.Grid.Anchor().IsZero() {
		return d
	}
	return d + r.o.Grid.Until(time.Now().Add(d), heartbeatGrid)
}

// annotationLoop writes the five report annotations every report interval,
// in one metadata patch.
func (r *Reporter) annotationLoop(ctx context.Context) {
	const loop = "kube/annotations"
	bo := backoff.Backoff{Min: backoffMin, Max: backoffMax}
	el := r.newErrorLog("writing the report annotations of node " + r.o.NodeName)
	select {
	case <-ctx.Done():
		return
	case <-r.writtenCh(): // after the conditions of this boot (see written)
	}
	if r.o.FirstPass != nil {
		select {
		case <-ctx.Done():
			return
		case <-r.o.FirstPass:
		}
	}
	wait := time.Duration(0)
	// asked: when the Retry-After of the last failed write ends (retryWait).
	var asked time.Time
	// anew: the last write was refused for the Node's UID (errRegisteredAnew).
	failed, anew := false, false
	for {
		r.progress(loop, max(r.o.ReportInterval, backoffMax))
		if failed {
			if !r.sleepRetry(ctx, wait, asked, &bo) {
				return
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		if w := r.writtenCh(); !isClosed(w) {
			// The Node was registered anew: the report waits for the
			// conditions (see written), beating while their writer
			// retries: at the start of the wait too, which may come a
			// report interval after the beat above (the next report
			// due), or the loop would be silent for two.
			r.progress(loop, max(r.o.ReportInterval, backoffMax))
			select {
			case <-ctx.Done():
				return
			case <-w:
			case <-time.After(r.o.ReportInterval):
				wait = 0
				continue
			}
		}
		if err := r.writeAnnotations(ctx, !failed); err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errRegisteredAnew) && !anew {
				// Not a failure to back off from: the report waits for
				// the conditions (above), then goes at once.
				r.o.Log.Info("node registered anew: writing its conditions again", "node", r.o.NodeName)
				wait, anew = 0, true
				continue
			}
			// Refused for the UID again, the one the conditions' write
			// has just learnt: no Node registered anew but an answer
			// that does not change. It backs off like any other, or the
			// two writes would go back and forth without a pause.
			wait, asked = retryWait(&bo, err)
			el.fail(err, wait)
			failed = true
			continue
		}
		el.ok()
		bo.Reset()
		r.closeIdle()
		wait, failed, anew = r.o.Grid.Until(time.Now(), r.o.ReportInterval), false, false
	}
}

// role is the node's role now (Options.RoleOf, else Options.Role).
func (r *Reporter) role() report.Role {
	if r.o.RoleOf != nil {
		return r.o.RoleOf()
	}
	return r.o.Role
}

// foldOffer is a report refresh the annotation loop offers the status
// loop: when the heartbeat falls due before next (the refresh after this
// one), the status loop writes the conditions with their heartbeat and
// docs in one nodes/status patch, a heartbeat whose wait starts again from
// it, instead of the refresh now and the heartbeat on its own a minute or
// two later (30 writes an hour, not 42, at the 2 min report_interval and
// the 5 min heartbeat_period). It answers on answer (buffered).
type foldOffer struct {
	docs   map[string]*string
	next   time.Time
	answer chan foldAnswer
}

// errNoConditions: a report refresh offered to the status loop finds no
// conditions to write (none evaluated, none to remove): it goes alone.
var errNoConditions = errors.New("no conditions to write with the report")

// foldAnswer: folded, the refresh was written with the heartbeat (err its
// outcome); else the annotation loop writes it alone.
type foldAnswer struct {
	folded bool
	err    error
	// node: the write's answer (err nil).
	node *kubeapi.Node
}

// offerFold offers the refresh of docs to the status loop (foldOffer),
// where the heartbeat period is not shorter than the report interval (else
// the heartbeat falls due between every two refreshes and goes alone). It
// reports whether the status loop wrote it, the write's answer and its
// error.
func (r *Reporter) offerFold(ctx context.Context, docs map[string]*string) (bool, *kubeapi.Node, error) {
	if r.o.ReportInterval > r.o.HeartbeatPeriod {
		return false, nil, nil
	}
	now := time.Now()
	o := foldOffer{docs: docs, next: r.o.Grid.Next(now, r.o.ReportInterval), answer: make(chan foldAnswer, 1)}
	select {
	case <-ctx.Done():
		return false, nil, ctx.Err()
	case r.refreshes <- o:
	}
	select {
	case <-ctx.Done():
		return false, nil, ctx.Err()
	case a := <-o.answer:
		return a.folded, a.node, a.err
	}
}

// writeAnnotations writes the report refresh; fold: it may be the status
// loop's heartbeat too (offerFold), not when it is a retry of a refresh
// that failed (the heartbeat is not held back by a failing refresh).
//
// A refresh the API server refuses for the Node's annotations (the report
// does not fit beside the others: 256 KiB together) reads the Node and
// writes what fits of it at once (writeFitting); while documents are left
// out, each refresh chooses what fits by the room the last answer showed
// (fitted), with no read, and goes whole again once all fit. A refresh on a
// Node with room costs what it did: no read, no sizing.
func (r *Reporter) writeAnnotations(ctx context.Context, fold bool) error {
	now, role := time.Now(), r.role()
	docs, err := r.o.Details.Documents(now, role)
	// A failing domain carries an error document; the others are written
	// all the same.
	if msg := errString(err); msg != r.renderErr {
		r.renderErr = msg
		if err != nil {
			r.o.Log.Error("report domain not rendered; its annotation says why", "err", err)
		}
	}
	// fit: what fits of the report, where the last refresh left documents
	// out (nil: the whole report, as docs are).
	var fit map[string]*string
	var left []string
	room, asIs := 0, false
	if r.fitShort {
		room = annotationsLimit - r.fitOthers
		fit, left, asIs = fitReport(docs, r.fitOthers, r.fitTamper, r.leftOutStub(now, role, docs))
	}
	if fold {
		offer := fit
		if offer == nil {
			offer = allOf(docs)
		}
		folded, n, err := r.offerFold(ctx, offer)
		switch {
		case ctx.Err() != nil:
			return err
		case folded && err == nil:
			r.fitted(n, left, room, asIs)
			return nil
		case folded && annotationsRefused(err):
			return r.writeFitting(ctx, docs, now, role)
		case folded:
			return err
		}
	}
	var n *kubeapi.Node
	if fit != nil {
		n, err = r.patchAnnotations(ctx, fit)
	} else {
		n, err = r.patchAnnotations(ctx, docs)
	}
	switch {
	case err == nil:
		r.fitted(n, left, room, asIs)
	case annotationsRefused(err):
		return r.writeFitting(ctx, docs, now, role)
	}
	return err
}

// writeFitting writes what fits of docs, a refresh the API server refused
// for the Node's annotations: it reads the Node for the room its other
// annotations leave (one read, after a refusal only), and writes the
// documents that fit, a stub for each of the others (fitReport). Refused
// again (another writer grew its own meanwhile), it fails as any write
// does, and its retry, after the backoff, reads again.
func (r *Reporter) writeFitting(ctx context.Context, docs map[string]string, now time.Time, role report.Role) error {
	start := time.Now()
	node, err := r.o.Client.GetNode(ctx, r.o.NodeName)
	r.m.observe(KindRead, start, err)
	if err != nil {
		return err
	}
	r.fitShort, r.fitOthers, r.fitTamper = true, othersSize(node.Metadata.Annotations), tamperSize(node.Metadata.Annotations)
	send, left, asIs := fitReport(docs, r.fitOthers, r.fitTamper, r.leftOutStub(now, role, docs))
	n, err := r.patchAnnotations(ctx, send)
	if err == nil {
		r.fitted(n, left, annotationsLimit-othersSize(node.Metadata.Annotations), asIs)
	}
	return err
}

// leftOutStub renders the stub of a document left out (fitReport).
// docs: the report's documents, by annotation key (the tamper stub keeps
// the clear its document carries: report.LeftOutDocument).
func (r *Reporter) leftOutStub(now time.Time, role report.Role, docs map[string]string) func(string, int) string {
	boot := r.o.Details.BootID()
	return func(domain string, size int) string {
		return report.LeftOutDocument(now, role, boot, domain, docs[report.AnnotationPrefix+domain], leftOutWhy(size))
	}
}

// patchAnnotations writes the report documents (a map[string]string, or a
// map[string]*string whose nil removes one) in one metadata patch, carrying the UID of the Node last read or written as a
// precondition: a Node deleted and registered anew since (by the kubelet)
// refuses the patch, so the report never stands on it before this boot's
// conditions (see written).
func (r *Reporter) patchAnnotations(ctx context.Context, docs any) (*kubeapi.Node, error) {
	meta := map[string]any{"annotations": docs}
	if uid := r.knownUID(); uid != "" {
		meta["uid"] = uid
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, err
	}
	sent := r.sentBefore()
	start := time.Now()
	n, err := r.o.Client.PatchNode(ctx, r.o.NodeName, patch)
	r.m.observe(KindAnnotations, start, err)
	switch {
	case err != nil && uidRefused(err):
		r.nodeRefused() // logged by annotationLoop
		return nil, fmt.Errorf("%w: %v", errRegisteredAnew, err)
	case err == nil && r.nodeAnswered(n, sent):
		r.o.Log.Info("node registered anew: writing its conditions again", "node", r.o.NodeName)
	}
	return n, err
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
