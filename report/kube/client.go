// Package kube is the daemon's only Kubernetes edge: it writes the daemon's
// conditions to Node.status, its events to core/v1 Events, and the health
// report to the Node's annotations, with the node's own credentials.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"encoding/json"

	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/transport"
)

// ErrNoKubeconfig means the kubeconfig file does not exist: the daemon runs
// standalone.
var ErrNoKubeconfig = errors.New("no kubeconfig")

// ErrNoCertificate means the kubeconfig names its client certificate or key
// by a path where there is no file yet: on a node that joins the cluster,
// the kubelet writes kubelet.conf naming kubelet-client-current.pem before
// the API server has issued that certificate (its TLS bootstrap).
var ErrNoCertificate = errors.New("the client certificate the kubeconfig names does not exist (yet)")

// Client is all the daemon asks of the API server: read and patch its own
// Node, create and patch Events. The daemon's client implements it with a
// REST client that speaks JSON to core/v1 with types of its own (types.go),
// not client-go's clientset: the clientset links and registers every API
// group (about 10 MiB of the daemon's resident memory, see README, Cost).
// Tests wrap a fake clientset (kubefake).
type Client interface {
	GetNode(ctx context.Context, name string) (*kubeapi.Node, error)
	// PatchNodeStatus applies a strategic merge patch to the Node's status
	// and returns the Node the API server answered with.
	PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error)
	// PatchNode applies a JSON merge patch to the Node (its metadata) and
	// returns the Node the API server answered with.
	PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error)
	CreateEvent(ctx context.Context, ev *kubeapi.Event) error
	// PatchEvent applies a strategic merge patch to an Event and returns
	// the Event the API server answered with. A patch of nothing ({})
	// reads the Event: a node's credentials may create and patch Events,
	// not get them (the Node authorizer).
	PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*kubeapi.Event, error)
}

// NewClient builds a client from a node-scoped kubeconfig (the kubelet's
// /etc/kubernetes/kubelet.conf) and returns it with the API server's URL.
// Each call first checks whether the kubeconfig changed, and whether the
// client certificate and key it names by path (kubelet-client-current.pem,
// a symlink the kubelet moves on rotation) changed, and then uses the new
// ones, on new connections: no restart needed (kubeconfigClient,
// rotatingClient; log, if not nil, says when they reload or cannot).
func NewClient(path, userAgent string, log *slog.Logger) (Client, string, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: %s does not exist", ErrNoKubeconfig, path)
	}
	k := &kubeconfigClient{path: path, userAgent: userAgent, log: log}
	if log != nil {
		k.warnings = &apiWarnings{log: log}
	}
	if _, err := k.client(); err != nil {
		return nil, "", err
	}
	return k, k.cfg.Host, nil
}

// Source returns the API server that c, a client from NewClient, calls now
// and the user its client certificate names (CredentialsUser): both
// change when a call finds the kubeconfig rewritten. "", "" for another
// client.
func Source(c Client) (server, user string) {
	k, ok := c.(*kubeconfigClient)
	if !ok {
		return "", ""
	}
	// Not under k.mu nor the rotating client's lock: a call holds them
	// across its read of the kubeconfig and the certificate files, which
	// a hung disk does not return from, and `autopilot-health status`
	// asks for this.
	sh := k.shown.Load()
	if sh == nil {
		return "", ""
	}
	user = sh.user
	if r, ok := sh.cur.(*rotatingClient); ok {
		if u := r.shownUser.Load(); u != nil {
			user = *u // rotated since
		}
	}
	return sh.host, user
}

// UserNow returns the user the credentials of c, a client from NewClient,
// name now (Source's), first looking, as a call does, whether the
// kubeconfig or the client certificate files changed (a stat of each; the
// files are read only when they did). ok is false for another client. The
// event writer asks before it takes an event: an Event about this node
// must not go out with another node's credentials, nor be dropped after the
// kubelet got its own.
func UserNow(c Client) (user string, ok bool) {
	k, ok := c.(*kubeconfigClient)
	if !ok {
		return "", false
	}
	// The last pair stays on an error, as for a call; a look that does
	// not answer (a hung disk) is waited for lookWait at most.
	ctx, cancel := context.WithTimeout(context.Background(), lookWait)
	k.now(ctx)
	cancel()
	_, user = Source(k)
	return user, true
}

// CredentialsChanged reports whether the kubeconfig of c, a client from
// NewClient, or the client certificate or key files it names (through
// their symlinks: a stat follows them) changed since its last call read
// them: the next call would go out with what is in them now. Files that
// changed to what the last call found unusable (a half-written
// certificate, logged) are not a change again. It stats the files, reads
// none, and never waits for a call under way (that call reads them
// itself): false then, and for another client. The reporter asks while
// its calls fail for the credentials (Reporter.credsLoop).
func CredentialsChanged(c Client) bool {
	w, ok := c.(credentialsWatcher)
	return ok && w.credentialsChanged()
}

// credentialsWatcher is a client that can tell its credentials' files
// changed (CredentialsChanged): kubeconfigClient, and the tests' fakes.
type credentialsWatcher interface{ credentialsChanged() bool }

// credentialsChanged is CredentialsChanged. Its stats run on a goroutine of
// their own, waited for credsPeekWait at most: on a hung disk the stat
// does not return, and the reporter's credsLoop, which asks, must return
// at a stop (false then, and at once while that stat hangs: not asked
// again until it returns).
func (k *kubeconfigClient) credentialsChanged() bool {
	ctx, cancel := context.WithTimeout(context.Background(), credsPeekWait)
	defer cancel()
	changed, err := k.peek.do(ctx, credsPeekWait, k.changedNow)
	return err == nil && changed
}

// credsPeekWait bounds credentialsChanged's wait for its stats.
const credsPeekWait = time.Second

// changedNow is credentialsChanged's look at the files, on the calling
// goroutine.
func (k *kubeconfigClient) changedNow() (bool, error) {
	if k.look.busy() {
		return false, nil // a call is reading the files (or hangs on them)
	}
	if !k.mu.TryLock() {
		return false, nil // a call is reading the files
	}
	read, failed, cur, caFile := k.read, k.failed, k.cur, k.caFile
	k.mu.Unlock()
	if cur == nil {
		return false, nil
	}
	// Outside the lock: a stat on a hung disk holds no call back.
	if stamp := confStampOf(k.path, caFile); stamp != read && stamp != failed {
		return true, nil
	}
	r, ok := cur.(*rotatingClient)
	return ok && r.changed(), nil
}

// changed says whether the certificate or key file changed since the
// client in use was made (or since they last failed to load).
func (r *rotatingClient) changed() bool {
	if !r.mu.TryLock() {
		return false
	}
	read, failed := r.read, r.failed
	r.mu.Unlock()
	stamps := r.stamps()
	return stamps != read && stamps != failed
}

// shownClient is what Source tells of a kubeconfigClient's client in use:
// set with it, read without its lock. user: the common name of its
// embedded client certificate, parsed once.
type shownClient struct {
	cur  Client
	host string
	user string
}

// CredentialsUser returns the user the kubeconfig at path authenticates as
// by its client certificate (the first certificate's common name, e.g.
// system:node:<name>), "" when it cannot tell (no client certificate, a
// token, a file it cannot read).
func CredentialsUser(path string) string {
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return ""
	}
	return userOf(cfg)
}

// userOf returns the user cfg's client certificate names, "" when it
// cannot tell.
func userOf(cfg *rest.Config) string {
	data := cfg.TLSClientConfig.CertData
	if len(data) == 0 && cfg.TLSClientConfig.CertFile != "" {
		var err error
		if data, err = os.ReadFile(cfg.TLSClientConfig.CertFile); err != nil {
			return ""
		}
	}
	return userOfPEM(data)
}

// userOfPEM returns the common name of the first certificate in data (PEM),
// "" when there is none.
func userOfPEM(data []byte) string {
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return ""
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return ""
		}
		return c.Subject.CommonName
	}
}

// kubeconfigClient is the client of the kubeconfig at path, made again when
// the file changes. kubeadm init writes kubelet.conf with the client
// certificate embedded (valid a year), and its kubelet-finalize phase
// rewrites it to name kubelet-client-current.pem by path; an operator or a
// tool may rewrite it too (another API server, the CA after a CA rotation).
// A CA the kubeconfig names by path (certificate-authority: ca.crt) is read
// into the configuration and followed the same way: a CA rotation that
// rewrites that file alone is seen at the next call. client-go would read
// it again itself, but at most once in 5 minutes (its transport's
// atomicTransportHolder), and meanwhile every call failed TLS against an
// API server serving a certificate of the new CA.
// Before each call it compares the file's identity and time with those it
// read, and the CA file's (a stat each): when they changed and the files
// hold another kubeconfig or another CA, which make a usable client, that
// client is used from then on and the old one's idle connections are
// closed. Until then (a half-written file, an invalid one, one whose
// certificate files are not there, a CA file without a certificate) the
// last client stays, and the failure is logged once for each change of the
// files.
type kubeconfigClient struct {
	path, userAgent string
	log             *slog.Logger
	warnings        *apiWarnings // shared by the clients made, so a reload does not log a warning again

	// look: the look at the files a call makes (now), on a goroutine of
	// its own; peek: credentialsChanged's.
	look fileLook[Client]
	peek fileLook[bool]

	mu     sync.Mutex
	read   confStamp    // of the kubeconfig and its CA file when cur was made
	data   []byte       // what cur was made from
	caFile string       // the CA file cur's kubeconfig names, "" for none (or its CA embedded)
	ca     []byte       // what cur's CA was read from caFile
	failed confStamp    // of the files that last failed to make a client (logged)
	cur    Client       // a rotatingClient or a restClient
	cfg    *rest.Config // what cur was made with
	made   int          // clients made, for tests
	// shown: cur, cfg's server and embedded certificate, for Source; set
	// with cur.
	shown atomic.Pointer[shownClient]
}

// confStamp is the stamp of a kubeconfig and of the CA file it names (the
// zero stamp when it names none).
type confStamp struct{ conf, ca fileStamp }

// confStampOf stamps the kubeconfig at path and caFile ("" for none).
func confStampOf(path, caFile string) confStamp {
	s := confStamp{conf: stampOf(path)}
	if caFile != "" {
		s.ca = stampOf(caFile)
	}
	return s
}

// client is the client of the kubeconfig in the file now.
func (k *kubeconfigClient) client() (Client, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	stamp := confStampOf(k.path, k.caFile)
	if k.cur != nil && stamp == k.read {
		return k.cur, nil
	}
	data, err := os.ReadFile(k.path)
	var c Client
	var cfg *rest.Config
	var caFile string
	var caStamp fileStamp
	sameConf := err == nil && k.cur != nil && bytes.Equal(data, k.data)
	if err == nil {
		if cfg, err = restConfigOf(k.path, data); err == nil {
			if caFile, caStamp, err = readCA(cfg); err == nil {
				if sameConf && caFile == k.caFile && bytes.Equal(cfg.CAData, k.ca) {
					k.read, k.failed = confStamp{stamp.conf, caStamp}, confStamp{}
					return k.cur, nil // touched or written again, the same kubeconfig and CA
				}
				c, err = k.clientFor(cfg)
			}
		}
	}
	if err != nil {
		err = fmt.Errorf("kubeconfig %s: %w", k.path, err)
		if k.cur == nil {
			return nil, err
		}
		// The next call tries again.
		if stamp != k.failed && k.log != nil {
			k.log.Warn("the kubeconfig changed but cannot be used; keeping the client made from it before", "kubeconfig", k.path, "err", err)
		}
		k.failed = stamp
		return k.cur, nil
	}
	if old, ok := k.cur.(idleCloser); ok {
		old.CloseIdle()
	}
	if k.cur != nil && k.log != nil {
		if sameConf {
			k.log.Info("certificate authority reloaded; new connections use it", "kubeconfig", k.path, "ca", caFile)
		} else {
			k.log.Info("kubeconfig reloaded; new connections use it", "kubeconfig", k.path, "server", cfg.Host, "user", userOf(cfg))
		}
	}
	k.cur, k.data, k.cfg, k.caFile, k.ca = c, data, cfg, caFile, cfg.CAData
	if caFile == "" {
		k.ca = nil
	}
	k.shown.Store(&shownClient{cur: c, host: cfg.Host, user: userOfPEM(cfg.CertData)})
	k.read, k.failed = confStamp{stamp.conf, caStamp}, confStamp{}
	k.made++
	return c, nil
}

// restConfigOf reads the kubeconfig at path whose contents are data, its
// relative paths taken from path's folder, as client-go's loader does.
func restConfigOf(path string, data []byte) (*rest.Config, error) {
	config, err := clientcmd.Load(data)
	if err != nil {
		return nil, err
	}
	for _, a := range config.AuthInfos {
		a.LocationOfOrigin = path
	}
	for _, c := range config.Clusters {
		c.LocationOfOrigin = path
	}
	for _, c := range config.Contexts {
		c.LocationOfOrigin = path
	}
	if err := clientcmd.ResolveLocalPaths(config); err != nil {
		return nil, err
	}
	if ctx := config.Contexts[config.CurrentContext]; ctx != nil {
		if a := config.AuthInfos[ctx.AuthInfo]; a != nil {
			for _, f := range []string{a.ClientCertificate, a.ClientKey} {
				if _, err := os.Stat(f); f != "" && errors.Is(err, fs.ErrNotExist) {
					return nil, fmt.Errorf("%w: %w", ErrNoCertificate, err)
				}
			}
		}
	}
	return clientcmd.NewNonInteractiveClientConfig(*config, "", &clientcmd.ConfigOverrides{},
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}).ClientConfig()
}

// readCA reads the CA file cfg names (certificate-authority: a path) into
// cfg's CAData and returns the file's name and its stamp taken before the
// read ("" and the zero stamp when cfg names none, or has its CA
// embedded). A file that holds no certificate is an error: client-go would
// trust nothing then (an empty pool), and the last client is better.
func readCA(cfg *rest.Config) (string, fileStamp, error) {
	tc := &cfg.TLSClientConfig
	if tc.CAFile == "" || len(tc.CAData) > 0 {
		return "", fileStamp{}, nil
	}
	name := tc.CAFile
	stamp := stampOf(name)
	data, err := os.ReadFile(name)
	if err != nil {
		return "", fileStamp{}, fmt.Errorf("certificate authority: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		return "", fileStamp{}, fmt.Errorf("certificate authority %s holds no certificate", name)
	}
	tc.CAData, tc.CAFile = data, ""
	return name, stamp, nil
}

// clientFor makes the client of cfg: a rotatingClient when it names its
// client certificate and key by path.
func (k *kubeconfigClient) clientFor(cfg *rest.Config) (Client, error) {
	cfg.UserAgent = k.userAgent
	cfg.Timeout = 15 * time.Second
	if k.warnings != nil {
		cfg.WarningHandlerWithContext = k.warnings
	}
	// Our own write pacing (coalescing, heartbeats, event aggregation) keeps
	// the rate far below this; it only bounds a bug.
	cfg.QPS, cfg.Burst = 5, 10
	if tc := cfg.TLSClientConfig; tc.CertFile != "" && tc.KeyFile != "" && len(tc.CertData) == 0 && len(tc.KeyData) == 0 {
		r := &rotatingClient{cfg: cfg, certFile: tc.CertFile, keyFile: tc.KeyFile, log: k.log}
		if _, err := r.client(); err != nil {
			return nil, err
		}
		return r, nil
	}
	return newRESTClient(cfg)
}

// CloseIdle closes the idle connections of the client in use. Not under
// k.mu: a look at the files holds it, and on a hung disk never lets go.
func (k *kubeconfigClient) CloseIdle() {
	sh := k.shown.Load()
	if sh == nil {
		return
	}
	if ic, ok := sh.cur.(idleCloser); ok {
		ic.CloseIdle()
	}
}

// now returns the client to make a call with: the REST client of the
// files as they are now (client, and the rotating client's). The look at
// the files (a stat of each, a read of those changed) runs on a goroutine
// of its own, and the call waits for it lookWait at most, or until ctx is
// done: on a disk that hangs (a read in D state under /etc/kubernetes or
// /var/lib/kubelet) the stat does not return, and a call waiting for it
// held the writer's loop, and the daemon's stop, with it. While that look
// hangs, no other starts: the calls wait for it, lookWait from its start,
// then fail (ErrFilesHung), and the one after it returns looks anew.
func (k *kubeconfigClient) now(ctx context.Context) (Client, error) {
	c, err := k.look.do(ctx, lookWait, func() (Client, error) {
		c, err := k.client()
		if r, ok := c.(*rotatingClient); ok && err == nil {
			return r.client()
		}
		return c, err
	})
	if errors.Is(err, ErrFilesHung) {
		err = fmt.Errorf("kubeconfig %s, or a file it names: %w", k.path, err)
	}
	return c, err
}

// lookWait bounds a call's wait for the look at the credentials' files:
// as the disk check's statfs (5 s), far above a stat's microseconds. A
// variable for tests.
var lookWait = 5 * time.Second

// ErrFilesHung is the error of a call whose look at the credentials' files
// (the kubeconfig, its CA, the client certificate) did not return within
// lookWait: a disk that hangs.
var ErrFilesHung = errors.New("a stat or read of the files did not return (a hung disk?); not asked again until it does")

// fileLook runs a look at files on a goroutine of its own, one at a time:
// a caller that finds one under way waits for it rather than start
// another, so a disk that hangs costs one goroutine, however many calls.
type fileLook[T any] struct {
	mu  sync.Mutex
	cur *lookCall[T]
	// answered, when set, is called when a look that a caller gave up on
	// (ErrFilesHung) returns: the disk answers again.
	answered func()
}

type lookCall[T any] struct {
	done  chan struct{}
	since time.Time
	v     T
	err   error
	hung  atomic.Bool // a caller got ErrFilesHung of it
}

// do runs f (or joins the f under way) and waits for it until wait after
// it started, or until ctx is done.
func (l *fileLook[T]) do(ctx context.Context, wait time.Duration, f func() (T, error)) (T, error) {
	l.mu.Lock()
	c := l.cur
	if c == nil {
		c = &lookCall[T]{done: make(chan struct{}), since: time.Now()}
		l.cur = c
		go func() {
			c.v, c.err = f()
			l.mu.Lock()
			l.cur = nil
			answered := l.answered
			l.mu.Unlock()
			close(c.done)
			if c.hung.Load() && answered != nil {
				answered()
			}
		}()
	}
	l.mu.Unlock()
	var zero T
	select {
	case <-c.done:
		return c.v, c.err
	default:
	}
	left := wait - time.Since(c.since)
	if left <= 0 {
		c.hung.Store(true)
		return zero, fmt.Errorf("%w (since %s)", ErrFilesHung, c.since.UTC().Format(time.RFC3339))
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-c.done:
		return c.v, c.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-t.C:
		c.hung.Store(true)
		return zero, fmt.Errorf("%w (since %s)", ErrFilesHung, c.since.UTC().Format(time.RFC3339))
	}
}

// onAnswered sets what is called when a look a caller gave up on returns.
func (l *fileLook[T]) onAnswered(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answered = f
}

// filesAnsweredNotifier is a client whose calls can fail because the
// files it reads hang (ErrFilesHung), and that says when they answer
// again: kubeconfigClient.
type filesAnsweredNotifier interface{ onFilesAnswered(f func()) }

// onFilesAnswered has f called when a look at the kubeconfig's files that
// calls gave up on (ErrFilesHung) returns: the disk answers again, and
// the writers waiting out their backoff can retry now (Reporter.Run sets
// its wake).
func (k *kubeconfigClient) onFilesAnswered(f func()) { k.look.onAnswered(f) }

// busy says whether a look is under way.
func (l *fileLook[T]) busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur != nil
}

func (k *kubeconfigClient) GetNode(ctx context.Context, name string) (*kubeapi.Node, error) {
	c, err := k.now(ctx)
	if err != nil {
		return nil, err
	}
	return c.GetNode(ctx, name)
}

func (k *kubeconfigClient) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c, err := k.now(ctx)
	if err != nil {
		return nil, err
	}
	return c.PatchNodeStatus(ctx, name, patch)
}

func (k *kubeconfigClient) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c, err := k.now(ctx)
	if err != nil {
		return nil, err
	}
	return c.PatchNode(ctx, name, patch)
}

func (k *kubeconfigClient) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	c, err := k.now(ctx)
	if err != nil {
		return err
	}
	return c.CreateEvent(ctx, ev)
}

func (k *kubeconfigClient) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*kubeapi.Event, error) {
	c, err := k.now(ctx)
	if err != nil {
		return nil, err
	}
	return c.PatchEvent(ctx, namespace, name, patch)
}

// rotatingClient is the client of a kubeconfig that names its client
// certificate and key by path. client-go would reload the files itself, but
// with a controller whose work queue wakes the daemon every 10 s for its
// whole life (k8s.io/client-go/util/workqueue's heartbeat), off the grid of
// the daemon's other wake-ups. Instead, the files are read into the
// configuration, and before each call (a few a minute at most) rotatingClient
// compares the files' identity and time with those it read: when either
// changed, and the pair read now is a valid one, it makes a client with it,
// whose transport dials new connections that present the new certificate,
// and the old client's idle connections are closed. Until then (a
// half-written file, an unreadable one, a key that does not match) the last
// client stays, and the failure is logged once for each change of the files.
type rotatingClient struct {
	cfg               *rest.Config // the files' names, not their contents
	certFile, keyFile string
	log               *slog.Logger

	mu        sync.Mutex
	read      [2]fileStamp // of certFile and keyFile when cur was made
	cert, key []byte       // what cur was made with
	failed    [2]fileStamp // of the files that last failed to load (logged)
	cur       Client
	certs     int // clients made, for tests
	// shownUser: the user cert names, for Source; inUse: cur, for
	// CloseIdle; set with it.
	shownUser atomic.Pointer[string]
	inUse     atomic.Pointer[restClient]
}

// fileStamp tells a file apart from the one before it under the same name;
// missing: the name names no file (or stat failed), a state of its own.
// The change time, owner and mode are in it: a chmod or chown that makes
// an unreadable file readable (the daemon runs without
// CAP_DAC_OVERRIDE: a 0600 file of another owner, or a 0000 one, is not
// its to read) is a change, as a new file is.
type fileStamp struct {
	dev, ino, size uint64
	mtime, ctime   int64
	uid, gid, mode uint32
	missing        bool
}

func stampOf(path string) fileStamp {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return fileStamp{missing: true}
	}
	return fileStamp{dev: st.Dev, ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
		uid: st.Uid, gid: st.Gid, mode: st.Mode}
}

// client is the client for the certificate in the files now.
func (r *rotatingClient) client() (Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps := r.stamps()
	if r.cur != nil && stamps == r.read {
		return r.cur, nil
	}
	cert, key, err := r.load()
	if err != nil {
		if r.cur == nil {
			return nil, err
		}
		// The next call tries again.
		if stamps != r.failed && r.log != nil {
			r.log.Warn("the client certificate files changed but cannot be used; keeping the certificate read before", "cert", r.certFile, "key", r.keyFile, "err", err)
		}
		r.failed = stamps
		return r.cur, nil
	}
	if r.cur != nil && bytes.Equal(cert, r.cert) && bytes.Equal(key, r.key) {
		r.read, r.failed = stamps, [2]fileStamp{}
		return r.cur, nil // touched or written again, the same pair
	}
	cfg := rest.CopyConfig(r.cfg)
	cfg.CertFile, cfg.KeyFile, cfg.CertData, cfg.KeyData = "", "", cert, key
	c, err := newRESTClient(cfg)
	if err != nil {
		if r.cur == nil {
			return nil, err
		}
		return r.cur, nil
	}
	if old, ok := r.cur.(restClient); ok {
		old.CloseIdle()
	}
	if r.cur != nil && r.log != nil {
		r.log.Info("client certificate reloaded", "cert", r.certFile, "key", r.keyFile)
	}
	r.cur, r.cert, r.key = c, cert, key
	if rc, ok := c.(restClient); ok {
		r.inUse.Store(&rc)
	}
	user := userOfPEM(cert)
	r.shownUser.Store(&user)
	r.read, r.failed = stamps, [2]fileStamp{}
	r.certs++
	return c, nil
}

// stamps are the certificate's and the key's file stamps now.
func (r *rotatingClient) stamps() [2]fileStamp {
	stamps := [2]fileStamp{stampOf(r.certFile)}
	if stamps[1] = stamps[0]; r.keyFile != r.certFile { // kubelet-client-current.pem holds both
		stamps[1] = stampOf(r.keyFile)
	}
	return stamps
}

// load reads the certificate and key files, a valid pair or an error.
func (r *rotatingClient) load() (cert, key []byte, err error) {
	if cert, err = os.ReadFile(r.certFile); err != nil {
		return nil, nil, err
	}
	if key, err = os.ReadFile(r.keyFile); err != nil {
		return nil, nil, err
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return nil, nil, fmt.Errorf("client certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	return cert, key, nil
}

// CloseIdle closes the idle connections of the client in use. Not under
// r.mu: a look at the files holds it, and on a hung disk never lets go.
func (r *rotatingClient) CloseIdle() {
	if c := r.inUse.Load(); c != nil {
		c.CloseIdle()
	}
}

func (r *rotatingClient) GetNode(ctx context.Context, name string) (*kubeapi.Node, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	return c.GetNode(ctx, name)
}

func (r *rotatingClient) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	return c.PatchNodeStatus(ctx, name, patch)
}

func (r *rotatingClient) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	return c.PatchNode(ctx, name, patch)
}

func (r *rotatingClient) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	c, err := r.client()
	if err != nil {
		return err
	}
	return c.CreateEvent(ctx, ev)
}

func (r *rotatingClient) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*kubeapi.Event, error) {
	c, err := r.client()
	if err != nil {
		return nil, err
	}
	return c.PatchEvent(ctx, namespace, name, patch)
}

// Dialer returns an Options.Dial for the API server at server (a
// kubeconfig's server URL): a TCP connection to its host and port (443 when
// the URL names none), closed at once. Nothing is sent: the API server
// does not see a request.
func Dialer(server string) (func(ctx context.Context) error, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, fmt.Errorf("server %q names no host", server)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "443"
		if u.Scheme == "http" {
			port = "80"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	var d net.Dialer
	return func(ctx context.Context) error {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}, nil
}

// statusCodecs decode the metav1 Status of a refused request (what
// apierrors.IsNotFound and IsForbidden read); objects are plain JSON.
var statusCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, coreV1)
	return serializer.NewCodecFactory(s)
}()

var coreV1 = schema.GroupVersion{Version: "v1"}

// apiDial dials the API server: client-go's dialer, the connection's reads
// and writes raw, and a server named localhost (or a name under
// .localhost) dialled as loopback without a lookup, as the probes dial it
// (rawsys.DialLocal): Go's resolver asks DNS for a localhost that
// /etc/hosts lacks, at each new connection. TLS still verifies the
// certificate against the kubeconfig's name
// (TestAPIServerAtLocalhostWithoutALookup).
var apiDial = rawsys.DialLocal(rawsys.DialWith(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}))

// apiProxy is the proxy of a kubeconfig without proxy-url: the
// environment's (HTTPS_PROXY, NO_PROXY: client-go's default, as kubelet's),
// but none for a localhost name, which apiDial dials as loopback. Go's
// http.ProxyFromEnvironment leaves out "localhost" and loopback addresses
// alone, and sent localhost. (a final dot), LOCALHOST and api.localhost to
// the proxy, which resolves the name on its own host, not this node's
// (TestAPIServerAtLocalhostIsNotProxied).
func apiProxy(req *http.Request) (*url.URL, error) {
	if rawsys.IsLocalhostName(req.URL.Hostname()) {
		return nil, nil
	}
	return http.ProxyFromEnvironment(req)
}

type restClient struct{ c rest.Interface }

// noResume turns the session cache off (BenchmarkReconnect's "full").
var noResume bool

// TLS handshakes with the API server since start, full and resumed
// (TLSHandshakes).
var fullHandshakes, resumedHandshakes atomic.Int64

// TLSHandshakes returns how many TLS handshakes the daemon's clients made
// with the API server: in full, and resumed from a session ticket.
func TLSHandshakes() (full, resumed int64) { return fullHandshakes.Load(), resumedHandshakes.Load() }

// lastProtocol is the application protocol the API server agreed to in the
// last TLS handshake (ALPN; APIProtocol).
var lastProtocol atomic.Pointer[string]

// APIProtocol returns the protocol of the daemon's last new connection to
// the API server, as its TLS handshake agreed it ("http/1.1", "h2"; "" for
// none agreed, which is HTTP/1.1 too, or before the first connection).
// Recorded where resumeSessions is installed: not with a credential plugin.
func APIProtocol() string {
	if p := lastProtocol.Load(); p != nil {
		return *p
	}
	return ""
}

// apiProtocols is what the daemon offers the API server: HTTP/1.1 only.
// The daemon's writes are a few small requests minutes apart, on a
// connection closed after each periodic write (closeIdle), so HTTP/2's
// multiplexing saves little: writes that overlap (a heartbeat and the
// report annotations on the same 10 s step) each open a connection,
// resuming the TLS session (resumeSessions). What HTTP/2 costs is memory
// and wake-ups: its connection runs a read loop that grows its stack and
// touches more of the binary, and client-go's health check pings a kept
// connection every 30 s. README's "HTTP/1.1 to the API server" has the
// figures. apimachinery configures HTTP/2 only where h2 is offered; a
// kubeconfig cannot offer it (client-go reads no ALPN from one).
var apiProtocols = []string{"http/1.1"}

// resumeSessions lets the API server's connections resume the TLS session
// of an earlier one. The API server closes a connection idle for 90 s and
// the report annotations are written every 2 minutes, so most writes open
// a new connection; a resumed handshake skips the certificate chains, the
// client certificate's signature and their checks (the key exchange is
// still made anew: forward secrecy is kept). The session cache belongs to
// the transport, so a client made for a rotated certificate (rotatingClient)
// starts without sessions and presents the new certificate. The API server
// takes the identity of a resumed session from the certificate of the
// handshake that made it, and Go's TLS server does not resume the session
// of a client certificate past its NotAfter.
func resumeSessions(rt http.RoundTripper) http.RoundTripper {
	t := innerTransport(rt)
	if t == nil || t.TLSClientConfig == nil || t.TLSClientConfig.ClientSessionCache != nil {
		return rt
	}
	tc := t.TLSClientConfig
	if !noResume {
		tc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	}
	verify := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		p := cs.NegotiatedProtocol
		lastProtocol.Store(&p)
		if cs.DidResume {
			resumedHandshakes.Add(1)
		} else {
			fullHandshakes.Add(1)
		}
		if verify != nil {
			return verify(cs)
		}
		return nil
	}
	return rt
}

// innerTransport returns the *http.Transport under client-go's wrappers
// (the transport cache's; its CA file's reloader is not made: the CA is
// read into the configuration, readCA), or nil.
func innerTransport(rt http.RoundTripper) *http.Transport {
	for {
		w, ok := rt.(utilnet.RoundTripperWrapper)
		if !ok {
			break
		}
		rt = w.WrappedRoundTripper()
	}
	t, _ := rt.(*http.Transport)
	return t
}

// clientIdleClose is how long the daemon keeps an idle connection to the
// API server: less than the API server keeps it (apiIdleClose). Over
// HTTP/1.1 a write sent as the API server closes the connection fails (EOF),
// and neither net/http nor client-go sends a PATCH or a POST again (the
// reporter would, a second later, with a warning); closing first, the
// client never sends on a connection the server is closing. client-go's
// default is the API server's own 90 s.
const clientIdleClose = apiIdleClose - 10*time.Second

// closeIdleFirst makes client-go's transport close an idle connection
// after clientIdleClose.
func closeIdleFirst(rt http.RoundTripper) http.RoundTripper {
	if t := innerTransport(rt); t != nil && (t.IdleConnTimeout == 0 || t.IdleConnTimeout > clientIdleClose) {
		t.IdleConnTimeout = clientIdleClose
	}
	return rt
}

// maxAnswer bounds the answers read: a Node or an Event is at most what
// etcd stores (1.5 MiB by default), a few times that as JSON. A larger
// answer is not the API server's (a proxy answering with a file, a body
// without end) and is not read into memory.
const maxAnswer = 16 << 20

// wholeAnswers refuses a redirect (see RoundTrip) and reads each answer's
// body, up to maxAnswer, before the transport returns it: an answer cut
// short (the API server or a load balancer in front of it closing the
// connection mid-answer) is then the call's error, which the reporter logs
// once per change (errorLog). Read by client-go, the error was also logged
// by client-go itself (klog, routed into the daemon's log) at each try.
func wholeAnswers(rt http.RoundTripper) http.RoundTripper { return wholeAnswersRT{rt} }

type wholeAnswersRT struct{ rt http.RoundTripper }

func (w wholeAnswersRT) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// The API server does not redirect the daemon's calls: this is
		// something in front of it (another host name, a login page).
		// Followed, a PATCH or a POST would become a GET of the place
		// named (net/http keeps the method only on 307 and 308), whose
		// answer would pass for the write's.
		resp.Body.Close()
		return nil, httpAnswer{fmt.Errorf("the API server's address answered with a redirect (%s to %q): not followed", resp.Status, resp.Header.Get("Location"))}
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		return resp, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	resp.Body.Close()
	if err != nil {
		return nil, httpAnswer{fmt.Errorf("reading the API server's answer (%s): %w", resp.Status, err)}
	}
	if len(b) > maxAnswer {
		return nil, httpAnswer{fmt.Errorf("the API server's answer (%s) is larger than %d MiB: not read", resp.Status, maxAnswer>>20)}
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if resp.StatusCode >= 400 {
		retryAfterAsSeconds(resp.Header, time.Now())
		b = retryAfterInStatus(resp, b)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	}
	return resp, nil
}

// retryAfterAsSeconds rewrites a failed call's Retry-After as the whole
// seconds client-go reads (decimal seconds only, kept as an int32): an
// HTTP date (RFC 9110 allows one; a proxy or a load balancer in front of
// the API server may send it) as the seconds until then, rounded up, and
// a number past an int32 as the largest one (retryWait waits a minute at
// most). Either was lost: the date ignored, the number wrapped round (an
// int32 of 2147483648 is negative) or, written into a Status
// (retryAfterInStatus), making it undecodable, the next try after a
// second of the backoff. A date gone by or a negative number is 0; what
// is neither a number nor a date is left as it is (no wait asked).
func retryAfterAsSeconds(h http.Header, now time.Time) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return
	}
	var secs int64
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		secs = n
	} else if errors.Is(err, strconv.ErrRange) {
		secs = math.MaxInt32 // past an int64
		if v[0] == '-' {
			secs = 0
		}
	} else if t, err := http.ParseTime(v); err == nil {
		secs = int64(math.Ceil(t.Sub(now).Seconds()))
	} else {
		return
	}
	h.Set("Retry-After", strconv.FormatInt(min(max(secs, 0), math.MaxInt32), 10))
}

// retryAfterInStatus returns the body of a failed call's answer, a Status
// with the answer's Retry-After (whole seconds) as its
// details.retryAfterSeconds where the Status has none. client-go takes the
// error of an answer that is a Status from the Status alone: a Retry-After
// header beside a Status without that detail (a 429 or a 503 of a proxy in
// front of the API server, as Status objects) was lost, and the reporter
// tried again after a second of its backoff, not after what the answer
// asked (retryWait). An answer that is not a Status (kube-apiserver's 429
// of its priority and fairness is text) keeps its header in client-go's
// error, and is returned as it is.
func retryAfterInStatus(resp *http.Response, body []byte) []byte {
	secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After")))
	if err != nil || secs <= 0 {
		return body
	}
	var st map[string]any
	if json.Unmarshal(body, &st) != nil || st["kind"] != "Status" {
		return body
	}
	details, _ := st["details"].(map[string]any)
	if details == nil {
		details = map[string]any{}
	}
	if n, _ := details["retryAfterSeconds"].(float64); n > 0 {
		return body
	}
	details["retryAfterSeconds"] = secs
	st["details"] = details
	out, err := json.Marshal(st)
	if err != nil {
		return body
	}
	return out
}

// httpAnswer is the error of a call that got an HTTP answer from the API
// server's address, if not one of the API server's (a redirect, a page
// that is not the object, an answer cut short after its headers or too
// large): something answers there, so the reporter's probe, which dials
// the address to notice a port that accepts connections again, has
// nothing to learn from it (answered). errKey sees the error inside.
type httpAnswer struct{ err error }

func (e httpAnswer) Error() string { return e.err.Error() }
func (e httpAnswer) Unwrap() error { return e.err }

// WrappedRoundTripper lets client-go's helpers (CloseIdleConnectionsFor)
// and innerTransport reach the transport.
func (w wholeAnswersRT) WrappedRoundTripper() http.RoundTripper { return w.rt }

func newRESTClient(cfg *rest.Config) (Client, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = transport.Wrappers(closeIdleFirst, cfg.WrapTransport)
	if cfg.ExecProvider == nil && cfg.AuthProvider == nil {
		// First: it sees client-go's own transport (its TLS settings from
		// the kubeconfig), not a wrapper. Not with a credential plugin:
		// client-go keeps one transport when a plugin's client certificate
		// rotates, and a resumed session would go on presenting the old one.
		cfg.WrapTransport = transport.Wrappers(resumeSessions, cfg.WrapTransport)
	}
	cfg.WrapTransport = transport.Wrappers(cfg.WrapTransport, wholeAnswers)
	if len(cfg.TLSClientConfig.NextProtos) == 0 {
		cfg.TLSClientConfig.NextProtos = append([]string(nil), apiProtocols...)
	}
	cfg.GroupVersion = &coreV1
	cfg.APIPath = "/api"
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.AcceptContentTypes = runtime.ContentTypeJSON
	cfg.NegotiatedSerializer = statusCodecs.WithoutConversion()
	if cfg.Dial == nil && cfg.Transport == nil {
		// Raw reads and writes (rawsys): the reports on the kept
		// connection do not wake the runtime's monitor thread.
		// The dialer's settings are client-go's own when Dial is nil
		// (k8s.io/client-go/transport's cache.go).
		cfg.Dial = apiDial
	}
	if cfg.Proxy == nil {
		// proxy-url in the kubeconfig is the operator's word, taken as
		// it is.
		cfg.Proxy = apiProxy
	}
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return restClient{c}, nil
}

// CloseIdle closes the connections to the API server that carry no
// request (a reporter whose next write is minutes away; see idleCloser).
func (r restClient) CloseIdle() {
	if rc, ok := r.c.(*rest.RESTClient); ok && rc.Client != nil {
		// Through client-go's wrappers (http.Client's own method does not
		// unwrap them).
		utilnet.CloseIdleConnectionsFor(rc.Client.Transport)
	}
}

// Each request is sent once (MaxRetries(0)): client-go would send one the
// API server answered with a Retry-After (a 429 of its priority and
// fairness, a 5xx) up to 10 more times, Retry-After apart (a zero one at
// once), 11 requests for one failed write of the daemon's, counted as one.
// The reporter retries instead, with its backoff, waiting at least what
// the answer asked (retryWait).
func (r restClient) GetNode(ctx context.Context, name string) (*kubeapi.Node, error) {
	return decodeNode(name, r.c.Get().MaxRetries(0).Resource("nodes").Name(name).Do(ctx))
}

// decodeNode reads the Node in an answer.
func decodeNode(name string, res rest.Result) (*kubeapi.Node, error) {
	// Error, not Raw's error: it has the message of a Status the API
	// server answered with.
	if err := res.Error(); err != nil {
		return nil, err
	}
	b, err := res.Raw()
	if err != nil {
		return nil, err
	}
	n := &kubeapi.Node{}
	if err := json.Unmarshal(b, n); err != nil {
		return nil, httpAnswer{fmt.Errorf("node %s: %w", name, err)}
	}
	if n.Metadata.Name != name {
		// Not the Node (a NodeList, another object, another Node: a
		// proxy or an aggregated API answering for the API server).
		// Taken as the Node, it would be one without conditions: at
		// start nothing would be carried over (Reporter.adopt).
		var kind struct {
			Kind string `json:"kind"`
		}
		_ = json.Unmarshal(b, &kind)
		return nil, httpAnswer{fmt.Errorf("node %s: the answer is not that Node (kind %q, name %q)", name, kind.Kind, n.Metadata.Name)}
	}
	return n, nil
}

func (r restClient) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	return decodeNode(name, r.c.Patch(types.StrategicMergePatchType).MaxRetries(0).Resource("nodes").Name(name).SubResource("status").Body(patch).Do(ctx))
}

func (r restClient) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	return decodeNode(name, r.c.Patch(types.MergePatchType).MaxRetries(0).Resource("nodes").Name(name).Body(patch).Do(ctx))
}

func (r restClient) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = checkEvent(ev.Metadata.Name, r.c.Post().MaxRetries(0).Namespace(ev.Metadata.Namespace).Resource("events").Body(b).Do(ctx))
	return err
}

func (r restClient) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*kubeapi.Event, error) {
	return checkEvent(name, r.c.Patch(types.StrategicMergePatchType).MaxRetries(0).Namespace(namespace).Resource("events").Name(name).Body(patch).Do(ctx))
}

// checkEvent reads the answer to an Event's write: the API server answers
// a create and a patch with the Event it saved. Anything else with a 2xx (a
// load balancer's or a login page's HTML, an empty body, another object)
// is not the API server's answer, and the write is a failed one, as a
// status write answered so is (decodeNode): taken as written, the Event
// was lost without a word and counted as written.
func checkEvent(name string, res rest.Result) (*kubeapi.Event, error) {
	if err := res.Error(); err != nil {
		return nil, err
	}
	b, err := res.Raw()
	if err != nil {
		return nil, err
	}
	ev := &kubeapi.Event{}
	if err := json.Unmarshal(b, ev); err != nil {
		return nil, httpAnswer{fmt.Errorf("event %s: the answer is not an Event: %w", name, err)}
	}
	if ev.Metadata.Name != name || (ev.Kind != "" && ev.Kind != "Event") {
		return nil, httpAnswer{fmt.Errorf("event %s: %w (kind %q, name %q)", name, errNotTheEvent, ev.Kind, ev.Metadata.Name)}
	}
	return ev, nil
}

// errNotTheEvent is the cause of a failed Event write answered with
// another object: the innermost error, which errorLog compares (errKey),
// so that the writes of Events of other names failing alike log once.
var errNotTheEvent = errors.New("the answer is not that Event")

// apiWarnings logs the warnings the API server sends with its answers
// (Warning headers: an admission webhook's "warn" action on Nodes, a
// deprecation) once per text, at warning priority. The same warning comes
// with every write of its kind (41 an hour on a quiet node); client-go's
// default handler logged each one, through klog at info. A text seen
// again after maxAPIWarnings others is logged again.
type apiWarnings struct {
	log  *slog.Logger
	mu   sync.Mutex
	seen map[string]bool
}

const maxAPIWarnings = 64

func (w *apiWarnings) HandleWarningHeaderWithContext(_ context.Context, code int, _ string, text string) {
	if code != 299 || text == "" {
		return // not a warning of the API server's (RFC 7234 code 299)
	}
	w.mu.Lock()
	logged := w.seen[text]
	if !logged {
		if w.seen == nil || len(w.seen) >= maxAPIWarnings {
			w.seen = map[string]bool{}
		}
		w.seen[text] = true
	}
	w.mu.Unlock()
	if !logged {
		w.log.Warn("the API server warned about a write (logged once per text)", "warning", text)
	}
}
