package daemon

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// lastStatusOf returns the STATUS= of a notification ("" when it has none).
func lastStatusOf(m string) (string, bool) {
	for line := range strings.SplitSeq(m, "\n") {
		if s, ok := strings.CutPrefix(line, "STATUS="); ok {
			return s, true
		}
	}
	return "", false
}

// The status line a reload sends with its READY=1 is never older than one
// the status loop sent meanwhile: a condition that changed while the
// reload ran is on systemctl status once both are sent, not the summary
// from before it, kept until the next change (hours on a quiet node).
func TestReloadNeverLeavesAnOlderStatusLine(t *testing.T) {
	statusLineSettles(t, func(d *Daemon) {
		if _, err := d.ReloadNotified(); err != nil {
			t.Fatal(err)
		}
	})
}

// The status loop sends the line of every change: one that comes while
// it sends the line of the change before is not left out (the line
// systemctl status shows would be the one before it until the next
// change, hours on a quiet node).
func TestStatusLineFollowsChangesThatComeWhileItIsSent(t *testing.T) {
	statusLineSettles(t, func(*Daemon) { time.Sleep(time.Millisecond) })
}

// statusLineSettles changes a condition again and again while during
// runs, 500 times, and after each, once the changes stopped, expects the
// last STATUS= systemd got to be the daemon's line of now.
func statusLineSettles(t *testing.T, during func(*Daemon)) {
	sock := notifySocket(t)
	f := newFileDaemon(t, "", Options{})
	d := f.Daemon
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })

	var mu sync.Mutex
	last := ""
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 4096)
		for {
			n, err := sock.Read(buf)
			if err != nil {
				return
			}
			if s, ok := lastStatusOf(string(buf[:n])); ok {
				mu.Lock()
				last = s
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { sock.SetReadDeadline(time.Now()); <-readerDone })

	set := func(i int) {
		c := report.Condition{Type: "CertRenewalFailing", Status: report.StatusFalse, Reason: report.ReasonCertificatesValid}
		if i%2 == 1 {
			c.Status, c.Reason = report.StatusTrue, report.ReasonCertificateExpiringSoon
		}
		d.Store().Set(c, time.Now())
	}
	for iter := range 500 {
		stop := make(chan struct{})
		toggled := make(chan struct{})
		go func() {
			defer close(toggled)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				set(i)
			}
		}()
		during(d)
		close(stop)
		<-toggled
		// Quiet now: what systemd shows last is the line of now.
		deadline := time.Now().Add(2 * time.Second)
		for {
			want := d.StatusLine()
			mu.Lock()
			got := last
			mu.Unlock()
			if got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: systemd shows %q, the daemon's line is %q", iter, got, want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}
