package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
)

// BenchmarkChurnBesideTheSocketDirectory: what a file made and removed
// in the directory above the sockets' (/run, where other daemons make
// and remove their files) costs the daemon, whose watch of that directory
// wakes for both (IN_CREATE, IN_DELETE of a name not its own). "watched"
// runs the socket watch, "unwatched" the same churn without it; the CPU
// time of the process per op (cpu-ns/op: getrusage, user+system) is the
// churn's own syscalls plus, watched, the watch's reads of its two events.
// The watch's events are all handled before the clock stops (a rename of
// the socket's name after the churn, which it handles in order).
func BenchmarkChurnBesideTheSocketDirectory(b *testing.B) {
	for _, watched := range []bool{false, true} {
		name := "unwatched"
		if watched {
			name = "watched"
		}
		b.Run(name, func(b *testing.B) {
			parent := b.TempDir()
			dir := filepath.Join(parent, "autopilot-health")
			if err := os.Mkdir(dir, 0o700); err != nil {
				b.Fatal(err)
			}
			cfg := config.Default()
			cfg.Status.Socket = filepath.Join(dir, "status.sock")
			handled := make(chan struct{}, 1)
			d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			d.socketEvent = func() {
				select {
				case handled <- struct{}{}:
				default:
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			if watched {
				watch := d.watchSockets()
				go func() { defer close(done); watch(ctx) }()
			} else {
				close(done)
			}
			defer func() { cancel(); <-done }()
			churn := filepath.Join(parent, "churn.pid")
			// flush: an event of the socket's own name, handled after
			// every event before it.
			flush := func() {
				if !watched {
					return
				}
				tmp := filepath.Join(dir, "x")
				os.WriteFile(cfg.Status.Socket, nil, 0o600)
				os.Rename(cfg.Status.Socket, tmp)
				os.Remove(tmp)
				select {
				case <-handled:
				case <-time.After(10 * time.Second):
					b.Fatal("the watch handled no event within 10s")
				}
			}
			flush()
			var r0, r1 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
			b.ResetTimer()
			for b.Loop() {
				f, err := os.Create(churn)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
				os.Remove(churn)
			}
			flush()
			b.StopTimer()
			syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
			cpu := time.Duration(r1.Utime.Nano()+r1.Stime.Nano()-r0.Utime.Nano()-r0.Stime.Nano()) * time.Nanosecond
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
