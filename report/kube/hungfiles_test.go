package kube

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// blockedLooks counts the goroutines blocked in a look at the kubeconfig
// (kubeconfigClient.client's read).
func blockedLooks() int {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "(*kubeconfigClient).client(") && strings.Contains(g, "os.ReadFile") {
			n++
		}
	}
	return n
}

// answeredKubeconfig writes a kubeconfig of system:node:n1 for a server
// that answers every call, its client certificate by path, and returns
// its path and its text (to write back once a test's hung read ends).
func answeredKubeconfig(t *testing.T) (string, []byte) {
	t.Helper()
	srv, _ := nodeServer(t, func(*http.Request) {})
	dir := t.TempDir()
	pair := filepath.Join(dir, "kubelet-client-current.pem")
	writeCert(t, pair, pair, "system:node:n1")
	kc := kubeconfigFor(t, dir, srv, pair, pair)
	data, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	return kc, data
}

// A read of the kubeconfig that does not return (a disk that hangs; here
// a FIFO put in its place, whose open waits for a writer) holds no call
// longer than lookWait, nor a call whose context ends (the stop's) at
// all: the call fails (ErrFilesHung) and the writer's loop goes on. While
// it hangs, the calls after it fail at once and start no other read (one
// goroutine, however many calls); CredentialsChanged and CloseIdle return;
// when the read returns, the next call looks anew and succeeds. Before,
// each call read the files on the caller's goroutine: the writers' loops
// and the daemon's stop waited for the disk (TestKubeStopDoesNotWaitForAHungKubeconfigDisk,
// on a real FUSE file system that does not answer).
func TestCallsDoNotWaitForHungCredentialFiles(t *testing.T) {
	defer func(w time.Duration) { lookWait = w }(lookWait)
	lookWait = 2 * time.Second // "at once" below is under a second, far from it
	kc, data := answeredKubeconfig(t)
	var logs testenv.SyncBuffer
	c, _, err := NewClient(kc, "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context) error {
		_, err := c.GetNode(ctx, "n1")
		return err
	}
	answered := make(chan struct{}, 8) // the reporter's wake: the writers retry
	c.(*kubeconfigClient).onFilesAnswered(func() { answered <- struct{}{} })
	if err := get(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(answered) != 0 {
		t.Errorf("a look that returned in time said the files answered again")
	}

	// The disk hangs: the kubeconfig's read does not return.
	os.Remove(kc)
	if err := syscall.Mkfifo(kc, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = get(context.Background())
	if took := time.Since(start); !errors.Is(err, ErrFilesHung) || took > lookWait+time.Second {
		t.Fatalf("a call on a hung kubeconfig: %v after %s, want ErrFilesHung after about %s", err, took, lookWait)
	}
	if !strings.Contains(err.Error(), kc) {
		t.Errorf("the error names no kubeconfig: %v", err)
	}
	// The stop's context: at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := get(ctx); err == nil || time.Since(start) > time.Second {
		t.Errorf("a call whose context ended: %v after %s, want an error at once", err, time.Since(start))
	}
	for i := range 5 {
		start = time.Now()
		if err := get(context.Background()); !errors.Is(err, ErrFilesHung) || time.Since(start) > time.Second {
			t.Errorf("call %d while the read hangs: %v after %s, want ErrFilesHung at once", i, err, time.Since(start))
		}
	}
	if n := blockedLooks(); n != 1 {
		t.Errorf("%d goroutines blocked reading the kubeconfig, want 1", n)
	}
	start = time.Now()
	if CredentialsChanged(c) || time.Since(start) > credsPeekWait+time.Second {
		t.Errorf("CredentialsChanged while the read hangs: true, or after %s", time.Since(start))
	}
	start = time.Now()
	c.(*kubeconfigClient).CloseIdle()
	if time.Since(start) > time.Second {
		t.Errorf("CloseIdle waited %s for the hung read", time.Since(start))
	}
	start = time.Now()
	if _, ok := UserNow(c); !ok || time.Since(start) > lookWait+time.Second {
		t.Errorf("UserNow while the read hangs: %v after %s", ok, time.Since(start))
	}

	// The disk answers: the read returns the same kubeconfig.
	f, err := os.OpenFile(kc, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	f.Close()
	// The look under way ends (not only its read: a call joining it
	// before its end is answered as the hung look's).
	for deadline := time.Now().Add(5 * time.Second); c.(*kubeconfigClient).look.busy(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look did not end once the FIFO was written")
		}
	}
	// The writers are told at once, not at the end of their backoff.
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("the hung look returned and nothing said the files answer again")
	}
	os.Remove(kc)
	os.WriteFile(kc, data, 0o600)
	if err := get(context.Background()); err != nil {
		t.Errorf("after the disk answered: %v", err)
	}
	if n := len(answered); n != 0 {
		t.Errorf("the files' answer said %d more times, want once", n+1)
	}
}

// What an operator sees of calls that fail on a disk that hangs under the
// kubeconfig (ErrFilesHung; here a real call on a kubeconfig whose read
// does not return, a FIFO): systemd's status line says it in a few words,
// as the kubeconfig's files', not the API server's; status has the error
// in full (the kubeconfig's path, since when) and the journal has it once
// however many calls; the API metrics count each as a failed call
// (result "error"), neither a refusal nor an answer. Before, the status
// line read "Node NOT updated since ...Z: API server unreachable (a stat
// or read of the files did not return (a hung disk?)...)": the innermost
// error's words, cut at 60 bytes, said as the API server's.
func TestHungCredentialFilesSaidPlainly(t *testing.T) {
	defer func(w, s time.Duration) { lookWait, NodeStaleAfter = w, s }(lookWait, NodeStaleAfter)
	lookWait, NodeStaleAfter = 200*time.Millisecond, 0
	kc, data := answeredKubeconfig(t)
	c, _, err := NewClient(kc, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	// The disk hangs; at the end it answers, so that the look blocked on
	// it returns.
	os.Remove(kc)
	if err := syscall.Mkfifo(kc, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Non-blocking: the open fails (ENXIO) where no look waits.
		if f, err := os.OpenFile(kc, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Write(data)
			f.Close()
		}
	}()

	m := NewMetrics(nil)
	var logs testenv.SyncBuffer
	el := &errorLog{log: slog.New(slog.NewTextHandler(&logs, nil)), what: "writing conditions of node n1"}
	for i := range 3 {
		start := time.Now()
		_, err = c.PatchNodeStatus(context.Background(), "n1", []byte(`{}`))
		if !errors.Is(err, ErrFilesHung) {
			t.Fatalf("call %d on a hung kubeconfig: %v, want ErrFilesHung", i, err)
		}
		m.observe(KindStatus, start, err)
		m.nodeWriteFailed(err, time.Now())
		el.fail(err, time.Second)
	}
	if answered(err) || credentialsRefused(err) {
		t.Errorf("%v taken as an answer (%v) or a refusal of the credentials (%v)", err, answered(err), credentialsRefused(err))
	}

	const reason = "the kubeconfig's files do not answer (a hung disk?)"
	var n NodeNotUpdated
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var ok bool
		if n, ok = m.NodeNotUpdated(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Node not said not updated within 5 s with NodeStaleAfter 0")
		}
	}
	if n.Reason != reason || !strings.HasSuffix(n.Note(), "Z: "+reason) {
		t.Errorf("status line %q (reason %q), want the reason %q", n.Note(), n.Reason, reason)
	}
	if !strings.Contains(n.Error, "kubeconfig "+kc+", or a file it names: ") || !strings.Contains(n.Error, "(a hung disk?)") || !strings.Contains(n.Error, "(since ") {
		t.Errorf("status's error in full: %q, want the kubeconfig's path, the hung disk and since when", n.Error)
	}
	if r := m.Reporting(); r.NodeNotUpdated == nil || *r.NodeNotUpdated != n || !r.Calls[KindStatus].Failing {
		t.Errorf("status's Kubernetes part: %+v, want %+v and the status calls failing", r, n)
	}
	if l := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(l) != 1 || !strings.Contains(l[0], "writing conditions of node n1 failed; will retry") || !strings.Contains(l[0], kc+", or a file it names: a stat or read of the files did not return (a hung disk?)") {
		t.Errorf("journal after 3 calls on the hung kubeconfig, want 1 line naming it:\n%s", logs.String())
	}
	if got := report.Value(m.writes.WithLabelValues(KindStatus, "error")); got != 3 {
		t.Errorf("api_writes_total{kind=status,result=error} = %v, want 3", got)
	}
	// Not API latency: the calls never reached the API server.
	var hist dto.Metric
	if err := m.latency.WithLabelValues(KindStatus).(prometheus.Histogram).Write(&hist); err != nil {
		t.Fatal(err)
	}
	if n := hist.GetHistogram().GetSampleCount(); n != 0 {
		t.Errorf("api_write_duration_seconds{kind=status} observed %d calls that never reached the API server, want 0", n)
	}
}
