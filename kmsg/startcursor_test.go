package kmsg

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// With from_boot_start false, the first start reads the ring buffer to its
// end without handling it, and that end is where a restart resumes, as a
// cursor of a handled record is: a daemon stopped (cleanly, or SIGKILLed
// after the state file's next save) before it handled any record, then
// started again, reads the records logged between the two starts (a
// read-only remount during the restart), and counts lost what the ring
// overwrote of them. Before, the end was kept in memory only: the restart
// had no cursor, started at the end again, and those records were never
// read nor counted lost. A record of before the first start is still left.
// Where the first start's open failed (no sequence number says where it
// was), the restart leaves the records stamped before the first start, as
// a reopen would, and reads those logged since. The start's position is
// saved soon even when no condition changes at the start (the state file
// holds them False already, from a start of this boot that kept no cursor,
// as every one did before).
func TestRestartBeforeARecordWasHandledResumesAtTheFirstStartsEnd(t *testing.T) {
	for _, c := range []struct {
		name string
		// openFails: the first start's open fails (the device not there
		// yet).
		openFails bool
		// saved: the state file holds this boot's kernel conditions, and
		// no cursor, when the first start begins: "False", or "Unknown"
		// as the failed open leaves them.
		saved string
		// after: the ring buffer at the restart ("NOW": the kernel time
		// as the restart is prepared).
		after             []string
		records, lost     float64
		readonly, deadlck report.Status
	}{
		{
			name: "logged while stopped",
			after: []string{"3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter",
				"6,3,3,-;ordinary chatter", "3,4,4,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			records: 2, readonly: report.StatusTrue, deadlck: report.StatusFalse,
		},
		{
			name: "conditions saved before without a cursor", saved: "False",
			after: []string{"3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter",
				"6,3,3,-;ordinary chatter", "3,4,4,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			records: 2, readonly: report.StatusTrue, deadlck: report.StatusFalse,
		},
		{
			name: "some of them overwritten",
			// 1 and 2 (of before the first start) and 3 and 4 (of
			// between the starts) gone.
			after:   []string{"6,5,5,-;ordinary chatter", "3,6,6,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			records: 2, lost: 2, readonly: report.StatusTrue, deadlck: report.StatusFalse,
		},
		{
			name: "the first start's open failed", openFails: true,
			after: []string{"3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter",
				"3,3,NOW,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			records: 1, readonly: report.StatusTrue, deadlck: report.StatusFalse,
		},
		{
			name: "the first start's open failed, as before it", openFails: true, saved: "Unknown",
			after: []string{"3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter",
				"3,3,NOW,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			records: 1, readonly: report.StatusTrue, deadlck: report.StatusFalse,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				dev := &fakeDevice{recs: lines("3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter")}
				if c.saved != "" {
					st := report.NewStore("b")
					m := NewMonitor(opts(t, st))
					m.Start(t0, t0)
					if c.saved == "False" {
						m.CaughtUp(MonotonicNow(), t0)
					} else {
						m.Blind(syscall.ENOENT, t0)
					}
					if err := st.Save(dir, t0); err != nil {
						t.Fatal(err)
					}
				}
				openFails := c.openFails
				// run starts a reader of a store loaded from dir, saved as
				// the daemon's persister does (saved gets a token after
				// each save); stop ends it with no save of its own (a
				// SIGKILL after the last save).
				saved := make(chan struct{}, 1)
				run := func() (mon *Monitor, store *report.Store, stop func()) {
					return startFromStateFile(t, dir, func(context.Context, string) (Device, error) {
						if openFails {
							return nil, syscall.ENOENT
						}
						return dev, nil
					}, saved)
				}
				if c.saved == "False" {
					// The state file takes the start before the first
					// open has read the ring to its end (a ring read for
					// longer than the persister gathers changes, a
					// second): the end must be saved on its own.
					dev.onRead = func(i int) {
						if i == 0 {
							select {
							case <-saved:
							case <-time.After(time.Minute): // the start not saved
							}
						}
					}
				}
				mon, store, stop := run()
				time.Sleep(time.Second) // read to the end: the reader waits for a record
				synctest.Wait()
				if got, _ := store.Get("KernelDeadlock"); (got.Status != report.StatusFalse) != c.openFails || mon.Metrics().Records() != 0 {
					t.Errorf("first start: KernelDeadlock %s, %v records handled; want False (Unknown where the open fails) and 0 (from_boot_start false)", got.Status, mon.Metrics().Records())
				}
				stop()

				now := strconv.FormatUint(MonotonicNow(), 10)
				var after []string
				for _, l := range c.after {
					after = append(after, strings.Replace(l, "NOW", now, 1))
				}
				dev.mu.Lock()
				dev.recs, dev.pos, dev.onRead = lines(after...), 0, nil
				dev.mu.Unlock()
				openFails = false
				mon, store, stop = run()
				time.Sleep(time.Minute)
				synctest.Wait()
				stop()
				if got, _ := store.Get("ReadonlyFilesystem"); got.Status != c.readonly {
					t.Errorf("the remount logged between the two starts: ReadonlyFilesystem %s (%s), want %s", got.Status, got.Message, c.readonly)
				}
				if got, _ := store.Get("KernelDeadlock"); got.Status != c.deadlck {
					t.Errorf("a line logged before the first start: KernelDeadlock %s (%s), want %s", got.Status, got.Message, c.deadlck)
				} else if c.openFails && !strings.HasSuffix(got.Message, " (kmsg.from_boot_start = false: the records logged before were not read)") {
					// Its first False, after the restart that goes on from
					// the kept start: the records before it were not read.
					t.Errorf("KernelDeadlock False after going on from the first start says %q", got.Message)
				}
				if n, l := mon.Metrics().Records(), mon.Metrics().Lost(); n != c.records || l != c.lost {
					t.Errorf("after the restart %v records handled, %v lost; want %v and %v", n, l, c.records, c.lost)
				}
			})
		})
	}
}

// startFromStateFile starts a monitor of a store loaded from dir, a
// reader of the device open gives, and a saver that saves the store to dir
// on each Dirty, as the daemon's persister does (each change the state file
// must take soon); saved, where not nil, gets a token after each save.
// stop ends them with no save of its own (a SIGKILL after the last save).
func startFromStateFile(t *testing.T, dir string, open func(context.Context, string) (Device, error), saved chan<- struct{}) (mon *Monitor, store *report.Store, stop func()) {
	t.Helper()
	return startFromStateFileHeld(t, dir, open, saved, nil)
}

// startFromStateFileHeld is startFromStateFile whose saver drops the save
// requests while hold is set (a SIGKILL in the second before the save).
func startFromStateFileHeld(t *testing.T, dir string, open func(context.Context, string) (Device, error), saved chan<- struct{}, hold *atomic.Bool) (mon *Monitor, store *report.Store, stop func()) {
	t.Helper()
	return startFromStateFileSaving(t, dir, open, saved, func(*report.Store) bool { return hold == nil || !hold.Load() })
}

// startFromStateFileSaving is startFromStateFile whose saver drops the save
// requests for which save reports false (a SIGKILL before that save).
func startFromStateFileSaving(t *testing.T, dir string, open func(context.Context, string) (Device, error), saved chan<- struct{}, save func(*report.Store) bool) (mon *Monitor, store *report.Store, stop func()) {
	t.Helper()
	store = report.NewStore("b")
	if _, err := store.Load(dir); err != nil {
		t.Fatal(err)
	}
	store.ReportWrites() // as the daemon's: its saves tell each write's end
	mon = NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: 10 * time.Second, Open: open}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { rd.Run(ctx); done <- struct{}{} }()
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-store.Dirty():
				if !save(store) {
					continue
				}
				if err := store.Save(dir, time.Now()); err != nil {
					t.Error(err)
				}
				if saved != nil {
					select {
					case saved <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	return mon, store, func() { cancel(); <-done; <-done }
}

// A restart in the first second after a start at the end of the log
// (from_boot_start false), after the state file took the cursor but before
// it took the kernel conditions' False, says what the first run said: the
// records since that start were read, at the time it names, and those
// logged before were not; DisksFailure's count says the same. The start's
// time is kept with the cursor for the boot, so a run after that says it
// too. Before, it was kept only until the first open had read the ring
// buffer to its end: the restart went on from the cursor as from a handled
// record, and its False said "this boot's, as far as the ring buffer still
// held them", of a boot whose records before the start were never read (a
// hung kubelet among them here).
func TestRestartBeforeTheFalseWasSavedSaysTheStartAtTheEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		dev := &fakeDevice{recs: lines("3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter")}
		open := func(context.Context, string) (Device, error) { return dev, nil }
		// The first run's saver takes the cursor, and is killed before
		// the save that holds the False.
		mon, store, stop := startFromStateFileSaving(t, dir, open, nil, func(st *report.Store) bool {
			c, ok := st.Get("KernelDeadlock")
			return !ok || c.Status != report.StatusFalse
		})
		time.Sleep(time.Second) // read to the end: the reader waits for a record
		synctest.Wait()
		first, _ := store.Get("KernelDeadlock")
		firstPart, _ := store.Part(report.SourceKmsg, "DisksFailure")
		stop()
		const suffix = " (kmsg.from_boot_start = false: the records logged before were not read)"
		if !strings.Contains(firstPart.Message, ", read since ") {
			t.Errorf("first run: DisksFailure's kernel part says %q, want the start at the end named", firstPart.Message)
		}
		if first.Status != report.StatusFalse || !strings.HasSuffix(first.Message, suffix) || mon.Metrics().Records() != 0 {
			t.Fatalf("first run: KernelDeadlock %s %q, %v records handled; want False after the start at the end, none handled", first.Status, first.Message, mon.Metrics().Records())
		}
		// What the restart finds: the cursor, no False.
		saved := report.NewStore("b")
		if _, err := saved.Load(dir); err != nil {
			t.Fatal(err)
		}
		var cur cursor
		if c, ok := saved.Get("KernelDeadlock"); ok && c.Status == report.StatusFalse || !saved.Memo(CursorKey, &cur) || !cur.Have {
			t.Fatalf("the state file holds KernelDeadlock %+v, cursor %+v: want the cursor of the start and no False", c, cur)
		}

		for run := 1; run <= 2; run++ {
			dev.mu.Lock()
			dev.pos = 0
			dev.recs = append(dev.recs, lines(fmt.Sprintf("6,%d,%d,-;ordinary chatter", 2+run, 2+run))...)
			dev.mu.Unlock()
			mon, store, stop = startFromStateFile(t, dir, open, nil)
			time.Sleep(time.Minute)
			synctest.Wait()
			stop()
			if got, _ := store.Get("KernelDeadlock"); got.Status != report.StatusFalse || got.Message != first.Message {
				t.Errorf("restart %d: KernelDeadlock %s %q, want False %q (the first run's)", run, got.Status, got.Message, first.Message)
			}
			if p, _ := store.Part(report.SourceKmsg, "DisksFailure"); p.Message != firstPart.Message {
				t.Errorf("restart %d: DisksFailure's kernel part says %q, want %q (the first run's)", run, p.Message, firstPart.Message)
			}
			if n := mon.Metrics().Records(); n != 1 {
				t.Errorf("restart %d: %v records handled, want 1 (the one logged while stopped)", run, n)
			}
		}
	})
}

// A state file of the version before startAtEnd, whose cursor holds a
// start at the end whose first open did not read the ring to its end
// (startUsec) and no time of it: the restart goes on from that start, says
// so in its False as before, and keeps its time from now on.
func TestRestartFromAStartKeptWithoutItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		const start = 5000000 // kernel µs
		st := report.NewStore("b")
		st.Keep(CursorKey, func() any { return json.RawMessage(fmt.Sprintf(`{"seq":0,"have":false,"startUsec":%d}`, start)) })
		if err := st.Save(dir, t0); err != nil {
			t.Fatal(err)
		}
		dev := &fakeDevice{recs: lines("3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,6000001,-;ordinary chatter")}
		_, store, stop := startFromStateFile(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if got, _ := store.Get("KernelDeadlock"); got.Status != report.StatusFalse || !strings.HasSuffix(got.Message, " (kmsg.from_boot_start = false: the records logged before were not read)") {
			t.Errorf("KernelDeadlock %s %q, want False after the start at the end", got.Status, got.Message)
		}
		var cur cursor
		if !store.Memo(CursorKey, &cur) || !cur.HaveReadFrom || cur.ReadFrom != start+uint64(startSlack/time.Microsecond) {
			t.Errorf("cursor %+v, want the start's time kept (usec %d)", cur, start+uint64(startSlack/time.Microsecond))
		}
	})
}

// lines are kernel log records, one per line given.
func lines(ls ...string) [][]byte {
	rs := make([][]byte, len(ls))
	for i, l := range ls {
		rs[i] = fmt.Appendf(nil, "%s\n", l)
	}
	return rs
}

// A gap counted lost is counted once, across a SIGKILL: the cursor's move
// past the record after the gap is saved within a second (the saver here
// writes on Dirty, as the daemon's persister does within a second), not
// with the 10 s of a handled record's move. Before, that move waited up to
// 10 s, and a SIGKILL in them made the restart resume from the cursor of
// before the gap and count the same records lost again: an alert on
// autopilot_health_kmsg_lost_records_total fired for losses that happened
// once. The records after the gap are still handled again after the
// restart (the replay of up to 10 s that README states).
func TestLostRecordsAreNotCountedAgainAfterASIGKILL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"), more: make(chan struct{}, 1)}
		// run starts a reader of a store loaded from dir, saved on each
		// Dirty (no TouchLater save: the 10 s had not passed); stop ends it
		// with no save of its own (a SIGKILL).
		run := func() (mon *Monitor, stop func()) {
			mon, _, stop = startFromStateFile(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil)
			return mon, stop
		}
		mon, stop := run()
		time.Sleep(time.Second) // the ring read to its end, the start saved
		synctest.Wait()
		// The ring overwrites 3 and 4 before the reader gets to them.
		dev.log("6,5,5,-;ordinary chatter")
		time.Sleep(time.Second)
		synctest.Wait()
		// A record after it, whose move alone waits for persistLater.
		dev.log("6,6,6,-;ordinary chatter")
		time.Sleep(4 * time.Second) // 5 s after the gap: under persistLater
		synctest.Wait()
		if n, l := mon.Metrics().Records(), mon.Metrics().Lost(); n != 2 || l != 2 {
			t.Fatalf("before the SIGKILL: %v records handled, %v lost; want 2 and 2", n, l)
		}
		stop()

		// The ring as the restart finds it: 1 and 2 overwritten too.
		dev.mu.Lock()
		dev.recs, dev.pos = lines("6,5,5,-;ordinary chatter", "6,6,6,-;ordinary chatter"), 0
		dev.mu.Unlock()
		mon, stop = run()
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		if n, l := mon.Metrics().Records(), mon.Metrics().Lost(); n != 1 || l != 0 {
			t.Errorf("after the restart: %v records handled, %v lost; want 1 (6, handled again) and 0 (3 and 4 were counted before the SIGKILL)", n, l)
		}
	})
}

// A gap is counted once also when the daemon is SIGKILLed in the second
// before the save of the move past it: it is counted in
// autopilot_health_kmsg_lost_records_total only once a state file write
// that holds that move ended, so the run that found it either saved the
// move (and the restart does not count it again) or never counted it (and
// the restart, resuming from the cursor of before it, does). Before, the
// run counted it as found, and a SIGKILL before the save counted it twice.
func TestLostRecordsAreCountedOnceWhenKilledBeforeTheSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"), more: make(chan struct{}, 1)}
		var hold atomic.Bool
		run := func() (mon *Monitor, stop func()) {
			mon, _, stop = startFromStateFileHeld(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil, &hold)
			return mon, stop
		}
		mon, stop := run()
		time.Sleep(time.Second) // the ring read to its end, the start saved
		synctest.Wait()
		// The ring overwrites 3 and 4 before the reader gets to them; the
		// SIGKILL comes before the save of the move past 5.
		hold.Store(true)
		dev.log("6,5,5,-;ordinary chatter")
		time.Sleep(time.Second)
		synctest.Wait()
		before := mon.Metrics().Lost()
		if n := mon.Metrics().Records(); n != 1 {
			t.Fatalf("before the SIGKILL: %v records handled, want 1", n)
		}
		stop()
		hold.Store(false)

		mon, stop = run()
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		after := mon.Metrics().Lost()
		if before+after != 2 {
			t.Errorf("lost %v before the SIGKILL and %v after the restart; want 2 in all (3 and 4, counted once)", before, after)
		}
		if after != 2 {
			t.Errorf("after the restart: %v lost, want 2 (the restart resumes before the gap and counts it)", after)
		}
	})
}

// A gap whose save does not end (a state file write blocked in I/O) is
// counted unsavedFor after it was found all the same, at the reader's next
// tick: the lost records and the alert on them are not held for as long
// as the disk hangs.
func TestLostRecordsCountedWhenTheirSaveDoesNotEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"), more: make(chan struct{}, 1)}
		var hold atomic.Bool
		mon, _, stop := startFromStateFileHeld(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil, &hold)
		defer stop()
		time.Sleep(time.Second)
		synctest.Wait()
		hold.Store(true)
		dev.log("6,5,5,-;ordinary chatter")
		time.Sleep(time.Second)
		synctest.Wait()
		if l := mon.Metrics().Lost(); l != 0 {
			t.Fatalf("%v lost before the save; want 0 (counted once saved)", l)
		}
		time.Sleep(unsavedFor + 10*time.Second) // and the next tick
		synctest.Wait()
		if l := mon.Metrics().Lost(); l != 2 {
			t.Errorf("%v lost %v after the gap with its save never ended; want 2", l, unsavedFor+11*time.Second)
		}
	})
}

// A saved cursor of this boot ahead of the kernel's last record (a state
// file edited, or put back from another copy, by hand) is not waited out:
// once the ring buffer is read to its end, the reader goes on after its
// last record. Before, every record was left as handled before the
// restart until the kernel's numbers passed the cursor, and no condition
// of the kernel log was evaluated meanwhile, with no word of it.
func TestCursorAheadOfTheKernelIsNotWaitedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		ahead := &fakeDevice{recs: lines("6,1000,1,-;ordinary chatter")}
		_, store, stop := startFromStateFile(t, dir, func(context.Context, string) (Device, error) { return ahead, nil }, nil)
		time.Sleep(time.Minute) // the ring read to its end, the start (1000) saved
		synctest.Wait()
		stop()
		var c cursor
		if !store.Memo(CursorKey, &c) || c.Seq != 1000 {
			t.Fatalf("the first run's cursor: %+v, want seq 1000", c)
		}

		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"), more: make(chan struct{}, 1)}
		mon, _, stop := startFromStateFile(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		dev.log("3,3,3,-;INFO: task kubelet:1234 blocked for more than 120 seconds.")
		time.Sleep(time.Second)
		synctest.Wait()
		stop()
		if n, l := mon.Metrics().Records(), mon.Metrics().Lost(); n != 1 || l != 0 {
			t.Errorf("with a saved cursor (1000) ahead of the kernel's last record (2): %v records handled, %v lost; want 1 (3) and 0", n, l)
		}
	})
}

// A saved cursor that does not decode is said once, at warning, and the
// reader starts as one without a cursor does (here from the boot's start:
// both records handled). Before, it was dropped without a word, and the
// boot's records were handled again with nothing in the journal to say why.
func TestUnreadableCursorIsSaid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		state := `{"version":1,"bootID":"b","memos":{"kmsg":{"seq":"abc","have":true}}}`
		if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(state), 0o644); err != nil {
			t.Fatal(err)
		}
		store := report.NewStore("b")
		if _, err := store.Load(dir); err != nil {
			t.Fatal(err)
		}
		mon := NewMonitor(opts(t, store))
		mon.Start(t0, t0)
		log := &countingLog{}
		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter")}
		rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(log), ReadTimeout: 10 * time.Second,
			FromStart: true, Open: func(context.Context, string) (Device, error) { return dev, nil }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); close(done) }()
		time.Sleep(time.Minute)
		synctest.Wait()
		cancel()
		<-done
		if n := mon.Metrics().Records(); n != 2 {
			t.Errorf("%v records handled, want 2 (from the boot's start)", n)
		}
		var said int
		for _, l := range log.all() {
			if strings.HasPrefix(l, "WARN the saved kernel log cursor is unreadable") {
				said++
			}
		}
		if said != 1 {
			t.Errorf("the unreadable cursor said %d times, want once:\n%s", said, strings.Join(log.all(), "\n"))
		}
	})
}

// A reader that stops (the daemon's clean stop, or a reader built again
// within a run, which resumes from the cursor in memory, past the gap)
// counts the gaps whose save had not ended: none waits for a write that
// would tell it, and none is left out of
// autopilot_health_kmsg_lost_records_total.
func TestLostRecordsCountedWhenTheReaderStopsBeforeTheirSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"), more: make(chan struct{}, 1)}
		var hold atomic.Bool
		mon, _, stop := startFromStateFileHeld(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil, &hold)
		time.Sleep(time.Second)
		synctest.Wait()
		hold.Store(true)
		dev.log("6,5,5,-;ordinary chatter")
		time.Sleep(time.Second)
		synctest.Wait()
		if l := mon.Metrics().Lost(); l != 0 {
			t.Fatalf("%v lost before the save; want 0 (counted once saved)", l)
		}
		stop()
		if l := mon.Metrics().Lost(); l != 2 {
			t.Errorf("%v lost once the reader stopped with the gap's save not ended; want 2 (3 and 4)", l)
		}
	})
}

// A saved cursor ahead of the kernel's last record is not waited out on a
// chatty log either, one that never pauses for the 250 ms that tell the end
// of the ring buffer by the read timeout: a read that found no record ready
// had reached the end, and a record at or before the cursor read after it
// was logged since. Before, every record was left as handled before the
// restart for as long as the log went on without a pause (none evaluated,
// none counted lost), and those it left were left for good.
func TestCursorAheadOfTheKernelIsNotWaitedOutOnAChattyLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		ahead := &fakeDevice{recs: lines("6,1000,1,-;ordinary chatter")}
		_, _, stop := startFromStateFile(t, dir, func(context.Context, string) (Device, error) { return ahead, nil }, nil)
		time.Sleep(time.Minute) // the ring read to its end, the start (1000) saved
		synctest.Wait()
		stop()

		dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"), more: make(chan struct{}, 1)}
		mon, _, stop := startFromStateFile(t, dir, func(context.Context, string) (Device, error) { return dev, nil }, nil)
		defer stop()
		// A line every 100 ms from the start, for 30 s.
		const n = 300
		for i := range n {
			time.Sleep(100 * time.Millisecond)
			dev.mu.Lock()
			dev.recs = append(dev.recs, fmt.Appendf(nil, "6,%d,%d,-;ordinary chatter\n", 3+i, MonotonicNow()))
			dev.mu.Unlock()
			select {
			case dev.more <- struct{}{}:
			default:
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got, l := mon.Metrics().Records(), mon.Metrics().Lost(); got != n || l != 0 {
			t.Errorf("with a saved cursor (1000) ahead of the kernel's last record (2) and a line every 100 ms: %v records handled, %v lost; want %d and 0", got, l, n)
		}
	})
}

// log appends the records of the lines given, as the kernel logs them, and
// wakes a read waiting for one (d.more must be set).
func (d *fakeDevice) log(ls ...string) {
	d.mu.Lock()
	d.recs = append(d.recs, lines(ls...)...)
	d.mu.Unlock()
	d.more <- struct{}{}
}
