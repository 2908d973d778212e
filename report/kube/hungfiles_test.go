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

	"github.com/syself/autopilot-health/internal/testenv"
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
	srv, _ := nodeServer(t, func(*http.Request) {})
	dir := t.TempDir()
	pair := filepath.Join(dir, "kubelet-client-current.pem")
	writeCert(t, pair, pair, "system:node:n1")
	kc := kubeconfigFor(t, dir, srv, pair, pair)
	data, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	c, _, err := NewClient(kc, "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context) error {
		_, err := c.GetNode(ctx, "n1")
		return err
	}
	if err := get(context.Background()); err != nil {
		t.Fatal(err)
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
	os.Remove(kc)
	os.WriteFile(kc, data, 0o600)
	if err := get(context.Background()); err != nil {
		t.Errorf("after the disk answered: %v", err)
	}
}
