package daemon

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
)

// The watch's queue overflowing (IN_Q_OVERFLOW: the kernel dropped
// events, a removal of a socket's file among them maybe) makes the daemon
// look at both sockets all the same: a socket whose file is gone is bound
// again. The event is fed through a pipe in inotify's layout (wd -1, no
// name), as the kernel puts it in the queue.
func TestSocketWatchOverflowLooksAtTheSockets(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "status.sock")
	ln, err := listenStatus(path)
	if err != nil {
		t.Fatal(err)
	}
	sl := ln.(*socketListener)
	defer sl.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg := config.Default()
	cfg.Status.Socket = path
	d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(logs, nil)), statusLn: sl}
	handled := make(chan struct{}, 1)
	d.socketEvent = func() { handled <- struct{}{} }
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rc, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.readSocketWatch(ctx, r, rc, []string{path, dir}, func() {})
	}()
	defer func() { cancel(); r.Close(); <-done }()
	ev := make([]byte, unix.SizeofInotifyEvent)
	binary.NativeEndian.PutUint32(ev[0:], ^uint32(0)) // wd -1
	binary.NativeEndian.PutUint32(ev[4:], unix.IN_Q_OVERFLOW)
	if _, err := w.Write(ev); err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatalf("the overflow was not handled within 10s; the log:\n%s", logs.String())
	}
	if !sl.bound() {
		t.Errorf("the status socket is not bound again after the overflow; the log:\n%s", logs.String())
	}
}
