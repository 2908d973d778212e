package daemon

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// Saves of the state file that fail at once (a full or read-only
// state_dir: ENOSPC, EROFS; never blocked in I/O) are said where an
// operator looks on a bad day, as a blocked write is: the status line
// (`state not saved: the saves of <file> have failed since <time>: <error>`),
// /healthz's 200 answer and status (stateSaveFailing), until a save works
// again. Before, one journal line and a counter said so; `systemctl status`
// and `autopilot-health status` showed nothing.
func TestFailingStateSavesAreSaid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var full atomic.Bool
		var tries atomic.Int64
		cfg, d, _, stop := runWithStateWrites(t, func(path string, data []byte, perm os.FileMode) error {
			if full.Load() {
				// Each try names a new temp file, as WriteFileAtomic's do.
				return &os.PathError{Op: "write", Path: fmt.Sprintf("%s.tmp%d", path, tries.Add(1)), Err: syscall.ENOSPC}
			}
			return report.WriteFileAtomic(path, data, perm)
		})
		path := filepath.Join(cfg.StateDir, report.StateFileName)
		if s := d.StatusLine(); strings.Contains(s, "state not saved") {
			t.Fatalf("status line before the disk is full: %q", s)
		}

		full.Store(true)
		began := time.Now()
		d.Store().Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusTrue, Reason: report.ReasonClockUnsynchronized}, time.Now())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		first := d.StatusLine()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		// Retried (1 s doubling) with a new temp file each time: the same
		// failure, the same line (the status line is sent again only when
		// it changes).
		if n := tries.Load(); n < 4 {
			t.Errorf("%d tries in 32 s of failing saves; want the retries", n)
		}
		if s := d.StatusLine(); s != first {
			t.Errorf("the status line changed with the retries of the same failure:\n%q\n%q", first, s)
		}
		want := "state not saved: the saves of " + path + " have failed since "
		if s := d.StatusLine(); !strings.HasPrefix(s, want) || !strings.Contains(s, "no space left on device") {
			t.Errorf("status line %q; want it to start %q and name the error", s, want)
		}
		st := d.Status(time.Now())
		if f := st.StateSaveFailing; f == nil || f.Path != path || f.Since.Sub(began) > 2*time.Second || !strings.Contains(f.Error, "no space left on device") {
			t.Errorf("status: stateSaveFailing %+v; want %s since about %v, no space left on device", f, path, began)
		}
		if code, body := healthz(d); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/healthz %d %q; want 200 naming the failing saves", code, body)
		}

		// Room again: the next retry saves, and the note goes.
		full.Store(false)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if s := d.StatusLine(); strings.Contains(s, "state not saved") {
			t.Errorf("status line after a save worked: %q", s)
		}
		if d.Status(time.Now()).StateSaveFailing != nil {
			t.Errorf("status still says the saves fail after one worked")
		}
		stop()
	})
}
