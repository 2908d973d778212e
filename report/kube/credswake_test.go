package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// credFileClient is a client whose credentials are the contents of a file,
// read again before a call when the file's stamp changed, as
// kubeconfigClient and rotatingClient do; the API server accepts only the
// credentials accept names (401 for the others). It counts the calls that
// went out, and those that succeeded, by method.
type credFileClient struct {
	inner Client
	path  string

	mu     sync.Mutex
	read   fileStamp
	cred   string
	accept string
	calls  int
	ok     map[string]int
}

func (c *credFileClient) credentialsChanged() bool {
	c.mu.Lock()
	read := c.read
	c.mu.Unlock()
	return stampOf(c.path) != read
}

// call reads the file when it changed and refuses credentials not accepted.
func (c *credFileClient) call(method string, f func() error) error {
	c.mu.Lock()
	if s := stampOf(c.path); s != c.read {
		// A file no one may read (mode 0000) is not the daemon's to
		// read either (it runs without CAP_DAC_OVERRIDE; the test as
		// root could): the credentials read before stay in use.
		if fi, err := os.Stat(c.path); err == nil && fi.Mode().Perm()&0o444 != 0 {
			b, _ := os.ReadFile(c.path)
			c.cred = string(b)
		}
		c.read = s
	}
	c.calls++
	refused := c.cred != c.accept
	c.mu.Unlock()
	if refused {
		return apierrors.NewUnauthorized("Unauthorized")
	}
	err := f()
	if err == nil {
		c.mu.Lock()
		c.ok[method]++
		c.mu.Unlock()
	}
	return err
}

func (c *credFileClient) GetNode(ctx context.Context, name string) (n *kubeapi.Node, err error) {
	err = c.call("GetNode", func() (err error) { n, err = c.inner.GetNode(ctx, name); return err })
	return n, err
}

func (c *credFileClient) PatchNodeStatus(ctx context.Context, name string, patch []byte) (n *kubeapi.Node, err error) {
	err = c.call("PatchNodeStatus", func() (err error) { n, err = c.inner.PatchNodeStatus(ctx, name, patch); return err })
	return n, err
}

func (c *credFileClient) PatchNode(ctx context.Context, name string, patch []byte) (n *kubeapi.Node, err error) {
	err = c.call("PatchNode", func() (err error) { n, err = c.inner.PatchNode(ctx, name, patch); return err })
	return n, err
}

func (c *credFileClient) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	return c.call("CreateEvent", func() error { return c.inner.CreateEvent(ctx, ev) })
}

func (c *credFileClient) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (ev *kubeapi.Event, err error) {
	err = c.call("PatchEvent", func() (err error) { ev, err = c.inner.PatchEvent(ctx, namespace, name, patch); return err })
	return ev, err
}

// The node's client certificate expires while the daemon runs: every
// writer's call gets 401, and after 4 minutes of it each waits in its
// backoff (30 to 60 s at that step). The credentials' files change (the
// kubelet's rotation): within a second (credsPoll) the status, report
// annotation and event writers have each made their next call, with the
// new credentials, and the Node has the change made while they failed and
// the Event. While the calls failed, the calls were the backoff's few: the
// files unchanged wake nobody. Fails with credsLoop not started (the
// writers wait out their backoff, up to a minute).
func TestCredentialsChangeWakesTheWriters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cred := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
		if err := os.WriteFile(cred, []byte("c1"), 0o600); err != nil {
			t.Fatal(err)
		}
		cs := fake.NewClientset(kubeletNode())
		c := &credFileClient{inner: kubefake.New(cs), path: cred, accept: "c1", ok: map[string]int{}}
		store := report.NewStore("b")
		h := startOpts(t, cs, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = c })
		defer h.stop()
		<-h.r.Adopted()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil {
			t.Fatal("the condition is not on the Node before the certificate expired")
		}
		c.mu.Lock()
		if c.ok["PatchNode"] == 0 {
			t.Fatalf("no report annotations written before the certificate expired: %v", c.ok)
		}
		// The certificate expires: the API server refuses it.
		c.accept = "c2"
		c.mu.Unlock()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "full"}, time.Now())
		store.Emit(report.Event{Reason: "IOError", Message: "while expired", Time: time.Now()})
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		c.mu.Lock()
		failed := c.calls
		before := map[string]int{}
		for k, v := range c.ok {
			before[k] = v
		}
		c.mu.Unlock()
		// Three writers, each trying at 1, 2, 4, ... s (half of it at
		// least) up to a minute: at most 13 calls each in 4 minutes, plus
		// the 3 before; a poll that made calls, one a second.
		if failed > 3*13+3+before["PatchNodeStatus"]+before["PatchNode"]+before["GetNode"] {
			t.Errorf("%d calls with the credentials refused for 4 minutes: want the backoff's few", failed)
		}
		// The rotation.
		if err := os.WriteFile(cred+".tmp", []byte("c2"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cred+".tmp", cred); err != nil {
			t.Fatal(err)
		}
		time.Sleep(credsPoll + 10*time.Millisecond)
		synctest.Wait()
		c.mu.Lock()
		got := map[string]int{}
		for k, v := range c.ok {
			got[k] = v - before[k]
		}
		c.mu.Unlock()
		if got["PatchNodeStatus"] == 0 || got["PatchNode"] == 0 || got["CreateEvent"] == 0 {
			t.Errorf("within %s of the credentials' change, the successful calls %v: want the status, report and event writers each to have written", credsPoll, got)
		}
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue || c.Message != "full" {
			t.Errorf("the condition %s after the change: %+v", credsPoll, c)
		}
		evs, err := cs.CoreV1().Events(EventNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range evs.Items {
			found = found || strings.Contains(e.Message, "while expired")
		}
		if !found {
			t.Errorf("the Event emitted while the credentials were refused is not on the API server %s after the change", credsPoll)
		}
	})
}

// CredentialsChanged of a client from NewClient: false after a call read
// the files, true once the certificate named by a symlink is rotated as the
// kubelet does (a new file, the link renamed over), false again after the
// next call loaded it; a chmod of it is a change; a half-written file is a change once, not again
// after a call found it unusable; a rewritten kubeconfig is a change.
func TestCredentialsChangedFollowsTheFiles(t *testing.T) {
	srv, _ := nodeServer(t, func(*http.Request) {})
	dir := t.TempDir()
	writeCert(t, filepath.Join(dir, "kubelet-client-1.pem"), filepath.Join(dir, "kubelet-client-1.pem"), "system:node:n1")
	cur := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.Symlink("kubelet-client-1.pem", cur); err != nil {
		t.Fatal(err)
	}
	kc := kubeconfigFor(t, dir, srv, cur, cur)
	c, _, err := NewClient(kc, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func() {
		t.Helper()
		if _, err := c.GetNode(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	call()
	if CredentialsChanged(c) {
		t.Fatal("changed after a call read the files")
	}
	writeCert(t, filepath.Join(dir, "kubelet-client-2.pem"), filepath.Join(dir, "kubelet-client-2.pem"), "system:node:n1")
	if err := os.Symlink("kubelet-client-2.pem", filepath.Join(dir, "kubelet-client-updated.pem")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "kubelet-client-updated.pem"), cur); err != nil {
		t.Fatal(err)
	}
	if !CredentialsChanged(c) {
		t.Fatal("not changed after the rotation")
	}
	call()
	if CredentialsChanged(c) {
		t.Fatal("changed after the call that loaded the rotated pair")
	}
	// Its mode alone changed (made readable to the daemon, which cannot
	// read a file of another owner or with mode 0000).
	if err := os.Chmod(filepath.Join(dir, "kubelet-client-2.pem"), 0o400); err != nil {
		t.Fatal(err)
	}
	if !CredentialsChanged(c) {
		t.Fatal("a certificate whose mode changed is not a change")
	}
	call()
	if CredentialsChanged(c) {
		t.Fatal("changed after the call that read the certificate after its chmod")
	}
	if err := os.WriteFile(filepath.Join(dir, "kubelet-client-2.pem"), []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !CredentialsChanged(c) {
		t.Fatal("a half-written certificate is not a change")
	}
	call() // keeps the pair it has
	if CredentialsChanged(c) {
		t.Fatal("the half-written certificate a call found unusable is a change again")
	}
	// kubelet.conf rewritten.
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, append(b, "# rewritten\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	if !CredentialsChanged(c) {
		t.Fatal("a rewritten kubeconfig is not a change")
	}
	if CredentialsChanged(kubefake.New(fake.NewClientset())) {
		t.Fatal("another client: changed")
	}
}

// What other credentials' files could end counts as a failure for the
// credentials (credsLoop then looks at the files): the API server's 401
// and 403, the TLS errors of a certificate (the real ones of a handshake:
// the server's alert when it requires a client certificate it did not
// get, a server certificate the client's CA does not verify). Not an
// outage's errors, nor a refusal that other credentials do not end.
func TestCredentialsRefused(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	get := func(tc *tls.Config) error {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
			t.Fatal("the call succeeded")
		}
		return err
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"401", apierrors.NewUnauthorized("Unauthorized"), true},
		{"403", apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("node n2 cannot modify node n1")), true},
		{"client certificate required (alert)", get(&tls.Config{RootCAs: roots}), true},
		{"server certificate not verified", get(&tls.Config{}), true},
		{"429", apierrors.NewTooManyRequests("too many requests", 1), false},
		{"503", apierrors.NewServiceUnavailable("unavailable"), false},
		{"404", apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "n1"), false},
		{"refused", &url.Error{Op: "Get", URL: "https://10.0.0.1:6443", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, false},
		{"timeout", context.DeadlineExceeded, false},
	} {
		if got := credentialsRefused(c.err); got != c.want {
			t.Errorf("%s (%v): %v, want %v", c.name, c.err, got, c.want)
		}
	}
	// The status line's words for the same real handshakes: the server's
	// alert is a refusal, not an unreachable API server (before, a
	// tls.AlertError, which crypto/tls returns on QUIC only, was looked
	// for, and the line read "API server unreachable (tls: certificate
	// required)").
	if got, want := nodeFailureReason(get(&tls.Config{RootCAs: roots})), "TLS handshake refused (tls: certificate required)"; got != want {
		t.Errorf("nodeFailureReason of the server's alert: %q, want %q", got, want)
	}
	if got, want := nodeFailureReason(get(&tls.Config{})), "the API server's certificate is not trusted"; got != want {
		t.Errorf("nodeFailureReason of an unverified server certificate: %q, want %q", got, want)
	}
}

// A file's stamp changes with its mode alone, its owner alone, and its
// change time alone (a chmod to the mode it has, once the kernel's clock
// of file times has moved on): a credential file made readable to the
// daemon is a change, though its bytes and modification time are not.
// Fails with the mode, the owner or the change time left out of fileStamp.
func TestFileStampChmodChown(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	if err := os.WriteFile(p, []byte("c"), 0o000); err != nil {
		t.Fatal(err)
	}
	s0 := stampOf(p)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	s1 := stampOf(p)
	if s1 == s0 {
		t.Error("the stamp is the same after a chmod from 0000 to 0600")
	}
	if s1.mode != s0.mode^0o600 {
		t.Errorf("mode %o after a chmod from %o to 0600", s1.mode, s0.mode)
	}
	if err := os.Chown(p, 4242, 4242); err != nil {
		t.Fatal(err) // the test runs as root
	}
	s2 := stampOf(p)
	if s2 == s1 || s2.uid != 4242 || s2.gid != 4242 {
		t.Errorf("the stamp after a chown to 4242:4242: %+v, before %+v", s2, s1)
	}
	// The change time alone: chmod to the mode it has until the kernel's
	// coarse clock of file times (a tick of a few ms) has moved on.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
		s3 := stampOf(p)
		if s3 != s2 {
			if s3.ctime == s2.ctime {
				t.Errorf("the stamp changed with the change time the same: %+v, before %+v", s3, s2)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stamp did not change in 5 s of chmods that change the change time")
		}
		runtime.Gosched()
	}
}

// A rotation that leaves the certificate file unreadable to the daemon
// (mode 0000), fixed by a chmod alone: credsLoop sees the mode's change
// and the writers' next call, with the credentials now read, goes out
// within a second (credsPoll), not at the end of their backoff. Fails with
// the mode and change time left out of fileStamp (no call within the
// second: the writers wait out their backoff, up to a minute).
func TestCredentialsChmodWakesTheWriters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cred := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
		if err := os.WriteFile(cred, []byte("c1"), 0o600); err != nil {
			t.Fatal(err)
		}
		cs := fake.NewClientset(kubeletNode())
		c := &credFileClient{inner: kubefake.New(cs), path: cred, accept: "c2", ok: map[string]int{}}
		store := report.NewStore("b")
		h := startOpts(t, cs, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = c })
		defer h.stop()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "full"}, time.Now())
		time.Sleep(time.Minute)
		synctest.Wait()
		// The rotation, written with mode 0000.
		if err := os.WriteFile(cred+".tmp", []byte("c2"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(cred+".tmp", 0o000); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cred+".tmp", cred); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		c.mu.Lock()
		ok := c.ok["PatchNodeStatus"]
		c.mu.Unlock()
		if ok != 0 {
			t.Fatalf("%d condition writes succeeded with the certificate unreadable", ok)
		}
		if err := os.Chmod(cred, 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(credsPoll + 10*time.Millisecond)
		synctest.Wait()
		c.mu.Lock()
		ok = c.ok["PatchNodeStatus"]
		c.mu.Unlock()
		if ok == 0 {
			t.Errorf("no condition write within %s of the chmod that made the certificate readable", credsPoll)
		}
		if cond := findCond(h.node(t), "DiskUsageHigh"); cond == nil || cond.Status != corev1.ConditionTrue {
			t.Errorf("the condition %s after the chmod: %+v", credsPoll, cond)
		}
	})
}
