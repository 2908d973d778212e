package kube

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Source (what `autopilot-health status` shows of the client in use)
// answers while a call of the reporter is blocked reading the kubeconfig
// or the client certificate (a hung disk, an NFS mount that does not
// answer): it waits for no file. Before, it took the locks the call holds
// across its read, and the status handler waited with it: `status` said
// "accepts but does not answer" on the day the disk hung, and each request
// left a goroutine stuck in the daemon. A FIFO with no writer stands in for
// the file whose read does not return.
func TestSourceDoesNotWaitForACallReadingItsFiles(t *testing.T) {
	for _, file := range []string{"kubeconfig", "certificate"} {
		t.Run(file, func(t *testing.T) {
			srv, _ := nodeServer(t, func(*http.Request) {})
			dir := t.TempDir()
			pair := filepath.Join(dir, "kubelet-client-current.pem")
			writeCert(t, pair, pair, "system:node:n1")
			kc := kubeconfigFor(t, dir, srv, pair, pair)
			c, _, err := NewClient(kc, "test", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.GetNode(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			hung := kc
			if file == "certificate" {
				hung = pair
			}
			saved, err := os.ReadFile(hung)
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(hung)
			if err := syscall.Mkfifo(hung, 0o600); err != nil {
				t.Fatal(err)
			}
			called := make(chan error, 1)
			go func() {
				_, err := c.GetNode(context.Background(), "n1")
				called <- err
			}()
			// The call is in its read of the FIFO: opening it for writing
			// returns once the reader has it open.
			w, err := os.OpenFile(hung, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			type src struct{ server, user string }
			got := make(chan src, 1)
			go func() {
				s, u := Source(c)
				got <- src{s, u}
			}()
			answered := false
			select {
			case s := <-got:
				answered = true
				if s.server != srv.URL || s.user != "system:node:n1" {
					t.Errorf("Source: %q as %q, want %q as system:node:n1", s.server, s.user, srv.URL)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Source has not answered in 5s while a call reads the %s", file)
			}
			// The read returns: the same contents, the call goes on (the
			// file is a file again for the reads after it: the key's).
			tmp := hung + ".tmp"
			if err := os.WriteFile(tmp, saved, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, hung); err != nil {
				t.Fatal(err)
			}
			w.Write(saved)
			w.Close()
			select {
			case err := <-called:
				if err != nil {
					t.Errorf("the call after its read returned: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the call did not return after its read did")
			}
			if !answered {
				<-got
			}
		})
	}
}
