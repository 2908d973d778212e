package tamper

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// hungDisk is the keeper's write (SetWrite) on a disk whose writes block in
// the kernel (D state) until the test releases them; then they reach the
// real file.
type hungDisk struct {
	mu                         sync.Mutex
	calls, inFlight, maxFlight int
	release                    chan struct{}
}

func newHungDisk() *hungDisk { return &hungDisk{release: make(chan struct{})} }

func (h *hungDisk) write(path string, data []byte, perm os.FileMode) error {
	h.mu.Lock()
	h.calls++
	h.inFlight++
	h.maxFlight = max(h.maxFlight, h.inFlight)
	release := h.release
	h.mu.Unlock()
	<-release
	h.mu.Lock()
	h.inFlight--
	h.mu.Unlock()
	return report.WriteFileAtomic(path, data, perm)
}

func (h *hungDisk) unblock() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

func (h *hungDisk) counts() (calls, inFlight, maxFlight int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls, h.inFlight, h.maxFlight
}

// A write of tamper.json that blocks in the kernel (a failing or hung disk
// under the state directory) holds the keeper's write only: the change is
// made in memory at once, Update answers within SaveWait that it is not
// saved yet, readers (State, Report: both tamper checks, the clear) never
// wait for the disk, no second write starts on top of the hung one, the
// write is reported blocked after WriteBlockedAfter, and once it returns
// the changes made meanwhile are saved by one more write, none lost.
// Before, Update wrote under the keeper's lock: the check that found the
// change hung in it, and every reader after it on the lock.
func TestKeeperWriteBlockedInIOHoldsNoReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		k := NewKeeper(dir, "boot-1", false)
		if err := k.Load(t0); err != nil {
			t.Fatal(err)
		}
		disk := newHungDisk()
		defer func() { disk.unblock(); synctest.Wait() }() // a failed test ends with no write blocked
		k.SetWrite(disk.write)
		var mu sync.Mutex
		var notes []bool
		k.OnWriteBlocked(func(since time.Time, blocked bool, err error) {
			mu.Lock()
			defer mu.Unlock()
			notes = append(notes, blocked)
		})
		finding := func(p string) func(*State) bool {
			return func(s *State) bool {
				return s.AddFinding(Finding{Condition: CondNode, Path: p, Kind: Modified, At: t0, BootID: "boot-1"})
			}
		}

		began := time.Now()
		var first error
		firstDone := make(chan struct{})
		go func() {
			first = k.Update(finding("/etc/a"))
			close(firstDone)
		}()
		time.Sleep(SaveWait + time.Second)
		synctest.Wait()
		select {
		case <-firstDone:
		default:
			t.Fatalf("Update still waits for the hung write %s after it began", time.Since(began))
		}
		var ns *NotSavedError
		if !errors.As(first, &ns) || ns.Path != k.Path() || !ns.Since.Equal(began) {
			t.Errorf("Update: %v; want a NotSavedError naming %s since %v", first, k.Path(), began)
		}

		// Readers answer from memory; a second change neither waits nor
		// starts a write on top of the hung one.
		read := make(chan State, 1)
		go func() { read <- k.State() }()
		synctest.Wait()
		select {
		case st := <-read:
			if len(st.FindingsFor(CondNode)) != 1 {
				t.Errorf("State: %+v, want the finding made in memory", st.Findings)
			}
		default:
			t.Fatal("State waits for the hung write")
		}
		secondDone := make(chan error, 1)
		go func() { secondDone <- k.Update(finding("/etc/b")) }()
		synctest.Wait()
		select {
		case err := <-secondDone:
			if !errors.As(err, &ns) {
				t.Errorf("second Update: %v; want a NotSavedError", err)
			}
		default:
			t.Fatal("a second Update waits for the hung write")
		}
		if _, ok := k.WriteBlocked(); ok {
			t.Errorf("blocked before %s", WriteBlockedAfter)
		}
		time.Sleep(WriteBlockedAfter)
		synctest.Wait()
		if since, ok := k.WriteBlocked(); !ok || !since.Equal(began) {
			t.Errorf("WriteBlocked: %v %v; want since %v", since, ok, began)
		}
		if calls, inFlight, _ := disk.counts(); calls != 1 || inFlight != 1 {
			t.Errorf("%d writes begun (%d in flight) while one hangs; want exactly one", calls, inFlight)
		}

		// The write returns: both findings are saved, by one more write.
		disk.unblock()
		synctest.Wait()
		if calls, inFlight, maxFlight := disk.counts(); calls != 2 || inFlight != 0 || maxFlight != 1 {
			t.Errorf("after the hung write returned: %d writes, %d in flight, at most %d at once; want 2, 0, 1", calls, inFlight, maxFlight)
		}
		s, err := LoadState(dir)
		if err != nil || s == nil || len(s.FindingsFor(CondNode)) != 2 {
			t.Errorf("saved: %+v, %v; want both findings", s, err)
		}
		if _, ok := k.WriteBlocked(); ok {
			t.Error("still blocked after the write returned")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(notes) != 2 || !notes[0] || notes[1] {
			t.Errorf("OnWriteBlocked told %v; want blocked, then returned", notes)
		}
		if err := k.Update(finding("/etc/c")); err != nil {
			t.Errorf("Update on a disk that works again: %v", err)
		}
	})
}

// A change whose write failed (a full or read-only state_dir) is not
// written yet: the stop's Flush writes it again rather than report the old
// failure, so a clear made while /var was full is saved at the stop once
// space was freed, not lost to the restart (which brings the findings
// back). Before, Flush returned the failed write's error without a try.
func TestKeeperFlushRetriesAFailedWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		k := NewKeeper(dir, "boot-1", false)
		if err := k.Load(t0); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		full := true
		k.SetWrite(func(path string, data []byte, perm os.FileMode) error {
			mu.Lock()
			defer mu.Unlock()
			if full {
				return &os.PathError{Op: "write", Path: path + ".tmp1", Err: errors.New("no space left on device")}
			}
			return report.WriteFileAtomic(path, data, perm)
		})
		if err := k.ClearAll(Clear{At: t0, Reason: "INC-4", By: "uid 0"}); err == nil {
			t.Fatal("the clear's write on a full disk: no error")
		}
		mu.Lock()
		full = false // the operator freed space
		mu.Unlock()
		if err := k.Flush(SaveWait); err != nil {
			t.Errorf("Flush once the disk has space: %v; want the clear written", err)
		}
		if s, err := LoadState(dir); err != nil || s == nil || s.Cleared == nil || s.Cleared.Reason != "INC-4" {
			t.Errorf("tamper.json after the Flush: %+v, %v; want the clear saved", s, err)
		}
	})
}

// A finding's path that is not UTF-8 and over MaxReportedText keeps its
// start in the report (report.Cut): the cut stepped back over a whole run
// of 0x80-0xBF bytes, and every such file read as its directory and "…".
func TestClipKeepsTheStartOfAPathNotUTF8(t *testing.T) {
	p := "/etc/protected/" + strings.Repeat("\xb0", 400)
	c := clip(p)
	if len(c) > MaxReportedText || len(c) < MaxReportedText-len("…")-3 || !strings.HasPrefix(c, "/etc/protected/\xb0\xb0\xb0") {
		t.Errorf("clip = %q (%d bytes), want about %d bytes of the path", c, len(c), MaxReportedText)
	}
}
