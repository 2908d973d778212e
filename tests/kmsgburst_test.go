//go:build integration

package tests

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/syself/autopilot-health/kmsg"
)

// burstSeqs returns the sequence numbers of the records in the kernel's
// ring buffer whose text contains s, in order.
func burstSeqs(t *testing.T, s string) []uint64 {
	t.Helper()
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, kmsg.BufSize)
	var out []uint64
	for {
		k, err := unix.Read(fd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return out
		case errors.Is(err, unix.EPIPE):
			continue
		case err != nil:
			t.Fatal(err)
		}
		rec := string(buf[:k])
		semi := strings.IndexByte(rec, ';')
		if semi < 0 || !strings.Contains(rec[semi:], s) {
			continue
		}
		f := strings.Split(rec[:semi], ",")
		if len(f) < 2 {
			continue
		}
		seq, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, seq)
	}
}

// savedCursor returns the kernel log cursor in the node's state file.
func (n *kernelNode) savedCursor() uint64 {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.state, "state.json"))
	if err != nil {
		n.t.Fatal(err)
	}
	var f struct {
		Memos map[string]struct {
			Seq  uint64 `json:"seq"`
			Have bool   `json:"have"`
		} `json:"memos"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		n.t.Fatal(err)
	}
	c, ok := f.Memos[kmsg.CursorKey]
	if !ok || !c.Have {
		n.t.Fatalf("the state file holds no kernel log cursor: %s", b)
	}
	return c.Seq
}

// counted returns the sum of the counts of the node's Events whose message
// holds sub.
func (n *kernelNode) counted(sub string) int {
	n.t.Helper()
	total := 0
	for _, e := range n.nodeEvents(sub) {
		total += int(e.Count)
	}
	return total
}

// A burst of matching kernel lines (a temp rule's, one Event with a count;
// a perm rule's, its condition) with the daemon stopped in its middle,
// while the lines are still being written, then started again, as
// `systemctl restart` does (SIGTERM), or killed and started again (SIGKILL,
// a crash), against the real /dev/kmsg and the real API server.
//
// SIGTERM: every line is counted exactly once in its Event: none handled
// twice, none lost (those logged while the daemon was down are read at the
// start), and the cursor the stop saved is the last record handled (the
// Event's count flushed at the stop is the number of burst records up to
// it). SIGKILL after the state file took the Event: one Event, none lost
// (the state file holds the occurrences not in the Event's kept count yet
// beside the cursor past their records, and the start counts them; 319,
// 354 and 399 of 450 were counted before), and a line handled again
// (README: those of the last 10 s or so) counted again, no more than the
// lines before the kill. In both, ReadonlyFilesystem never flaps and keeps
// its transition time.
func TestKmsgBurstAcrossRestart(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			const before, after = 150, 300
			n := newKernelNode(t)
			w := watchFlaps(t, n.api, n.name)
			n.start()
			n.caughtUp()
			burst := "EXT4-fs warning (device TOKEN): burst line"
			remount := "EXT4-fs (TOKEN): Remounting filesystem read-only"
			n.line(remount)
			for range before {
				n.line(burst)
			}
			set := waitNode(t, n.api, n.name, "ReadonlyFilesystem=True", has("ReadonlyFilesystem", corev1.ConditionTrue, "FilesystemIsReadOnly"))
			ltt := cond(set, "ReadonlyFilesystem").LastTransitionTime
			// The daemon is handling the burst: its Event exists.
			deadline := time.Now().Add(30 * time.Second)
			for n.counted("burst line") == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no Event for the burst within 30 s")
				}
				time.Sleep(50 * time.Millisecond) // polling the API server for an awaited event
			}
			if sig == syscall.SIGKILL {
				// README: an Event created in the last second is not saved
				// yet, and its repeats after a crash make another Event;
				// this is the kill of a daemon whose state file holds it.
				name := n.nodeEvents("burst line")[0].Name
				for {
					b, err := os.ReadFile(filepath.Join(n.state, "state.json"))
					if err == nil && strings.Contains(string(b), `"name": "`+name+`"`) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the state file did not take the burst's Event within 30 s")
					}
					time.Sleep(50 * time.Millisecond) // polling the state file: no notice to wait on
				}
			}
			// The rest of the burst is written while the daemon stops.
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range after {
					n.line(burst)
					if i == after/2 {
						n.line(remount)
					}
				}
			}()
			var firstRun int
			var cursorAt uint64
			if sig == syscall.SIGTERM {
				n.stop()
				cursorAt = n.savedCursor()
				// The stop sent what waited: the count on the API server is
				// every burst record the daemon handled.
				firstRun = n.counted("burst line")
			} else {
				n.kill()
			}
			<-done
			seqs := burstSeqs(t, n.tok+"): burst line")
			if len(seqs) != before+after {
				t.Fatalf("the ring buffer holds %d of the %d burst records (another test's flood overwrote them?)", len(seqs), before+after)
			}
			if sig == syscall.SIGTERM {
				upTo := 0
				for _, s := range seqs {
					if s <= cursorAt {
						upTo++
					}
				}
				t.Logf("stopped after %d of %d burst records (cursor %d)", upTo, len(seqs), cursorAt)
				if firstRun != upTo {
					t.Errorf("after SIGTERM the Event counts %d burst records; the saved cursor %d is past %d of them: the cursor saved at a clean stop is not the last record handled", firstRun, cursorAt, upTo)
				}
			}
			restarted := n.start()
			n.caughtUp()
			c := n.written(restarted)
			if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&ltt) {
				t.Errorf("after the restart: %s/%s since %s; want True since %s", c.Status, c.Reason, c.LastTransitionTime.Format(time.RFC3339), ltt.Format(time.RFC3339))
			}
			// A clean stop sends every count still waiting.
			n.stop()
			total := n.counted("burst line")
			evs := n.nodeEvents("burst line")
			t.Logf("%d burst lines written, counted %d in %d Event(s)", before+after, total, len(evs))
			if len(evs) != 1 {
				t.Errorf("the burst is %d Events; want 1 with a count", len(evs))
			}
			if f := w.flaps(); len(f) > 0 {
				t.Errorf("ReadonlyFilesystem flapped on the Node: %v", f)
			}
			switch {
			case total < before+after:
				t.Errorf("%d burst lines written, %d counted: records lost across the %v", before+after, total, sig)
			case sig == syscall.SIGTERM && total != before+after:
				t.Errorf("%d burst lines written, %d counted: records handled twice across a clean stop", before+after, total)
			case total > 2*before+after:
				t.Errorf("%d burst lines written, %d counted: more handled again than were logged before the kill", before+after, total)
			}
		})
	}
}
