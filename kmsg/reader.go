package kmsg

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// BufSize is the read buffer: the kernel returns one record per read() and
// fails with EINVAL (losing the record) when the buffer is too small.
const BufSize = 8192

// Reader follows /dev/kmsg and feeds the monitor.
type Reader struct {
	Path    string
	Monitor *Monitor
	Log     *slog.Logger
	// CursorFile keeps the last handled sequence number and the boot it
	// belongs to, so a restart within the same boot resumes right after it.
	CursorFile string
	BootID     string
	// FromStart reads the records still in the ring buffer on a fresh start
	// (a new boot, no cursor) instead of starting at the end.
	FromStart bool
	// Progress is called at least every ReadTimeout while the device is
	// open and being read; a reader that cannot open the device stops
	// calling it, which fails /healthz and the watchdog.
	Progress    func(loop string, maxSilence time.Duration)
	ReadTimeout time.Duration
}

type cursor struct {
	BootID string `json:"bootID"`
	Seq    uint64 `json:"seq"`
	// IOErrors are the disk I/O errors in DisksFailure's window (kernel
	// time and device), so a restart within the boot does not forget them.
	IOErrors []ioError `json:"ioErrors,omitempty"`
}

type ioError struct {
	Usec uint64 `json:"usec"`
	Dev  string `json:"dev"`
}

func (rd *Reader) loadCursor() (cursor, bool) {
	b, err := os.ReadFile(rd.CursorFile)
	if err != nil {
		return cursor{}, false
	}
	var c cursor
	if json.Unmarshal(b, &c) != nil || c.BootID != rd.BootID {
		return cursor{}, false
	}
	return c, true
}

func (rd *Reader) saveCursor(seq uint64) error {
	b, _ := json.Marshal(cursor{BootID: rd.BootID, Seq: seq, IOErrors: rd.Monitor.windowEntries()})
	tmp := rd.CursorFile + ".tmp"
	if err := os.MkdirAll(filepath.Dir(rd.CursorFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, rd.CursorFile)
}

// MonotonicNow returns CLOCK_MONOTONIC in microseconds, the clock of the
// kernel log's timestamps.
func MonotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3
}

// BootWall returns the wall time of kernel time 0.
func BootWall() time.Time {
	return time.Now().Add(-time.Duration(MonotonicNow()) * time.Microsecond)
}

// Run reads until ctx is done, reopening the device with backoff after
// errors. It never returns early: a monitor that cannot read says so in the
// log and the metrics, and stops reporting progress.
func (rd *Reader) Run(ctx context.Context) {
	if rd.ReadTimeout == 0 {
		rd.ReadTimeout = 10 * time.Second
	}
	cur, resume := rd.loadCursor()
	if resume {
		rd.Monitor.restoreWindow(cur.IOErrors)
	}
	last, haveLast := cur.Seq, resume
	saved := last
	lastSave := time.Now()
	defer func() {
		if haveLast && last != saved {
			rd.saveCursor(last)
		}
	}()
	bootWall := BootWall()
	buf := make([]byte, BufSize)
	wait := time.Second
	for ctx.Err() == nil {
		f, err := os.OpenFile(rd.Path, os.O_RDONLY, 0)
		if err == nil {
			if haveLast || rd.FromStart {
				_, err = f.Seek(0, io.SeekStart)
			} else {
				_, err = f.Seek(0, io.SeekEnd)
			}
		}
		if err != nil {
			if f != nil {
				f.Close()
			}
			rd.Monitor.m.up.Set(0)
			rd.Log.Error("cannot read the kernel log; kernel conditions are not being evaluated", "path", rd.Path, "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, time.Minute)
			continue
		}
		if haveLast {
			rd.Log.Info("kernel log monitor resuming after the last record handled", "seq", last)
		} else if rd.FromStart {
			rd.Log.Info("kernel log monitor reading the records of this boot still in the ring buffer")
		}
		rd.Monitor.m.up.Set(1)
		stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
		var beat time.Time
		for ctx.Err() == nil {
			// Progress at most once a second: in a flood this loop turns
			// for every record.
			if now := time.Now(); rd.Progress != nil && now.Sub(beat) >= time.Second {
				rd.Progress("kmsg", rd.ReadTimeout+5*time.Second)
				beat = now
			}
			f.SetReadDeadline(time.Now().Add(rd.ReadTimeout))
			n, err := f.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				rd.Monitor.Tick(MonotonicNow(), time.Now())
				continue
			}
			if errors.Is(err, syscall.EPIPE) {
				// The ring buffer overwrote records we had not read; the
				// next read returns the oldest one left. The gap in the
				// sequence numbers says how many were lost.
				continue
			}
			if err != nil {
				rd.Monitor.m.up.Set(0)
				rd.Monitor.m.reopens.Inc()
				rd.Log.Error("reading the kernel log failed; reopening", "path", rd.Path, "err", err)
				break
			}
			wait = time.Second
			rec, perr := ParseRecord(buf[:n])
			if perr != nil {
				rd.Monitor.m.parseErrors.Inc()
				continue
			}
			if haveLast && rec.Seq <= last {
				continue // handled before the restart
			}
			if haveLast && rec.Seq > last+1 {
				lost := rec.Seq - last - 1
				rd.Monitor.m.lost.Add(float64(lost))
				rd.Log.Warn("kernel log records were overwritten before they could be read", "lost", lost, "after_seq", last)
			}
			rd.Monitor.Handle(rec, bootWall.Add(time.Duration(rec.Usec)*time.Microsecond))
			last, haveLast = rec.Seq, true
			if time.Since(lastSave) >= time.Second && rd.CursorFile != "" {
				if err := rd.saveCursor(last); err == nil {
					saved = last
				}
				lastSave = time.Now()
			}
		}
		stop()
		f.Close()
		rd.Monitor.m.up.Set(0)
	}
}

// Scan reads every record still in the ring buffer once (for the one-shot
// check) and returns how many it handled.
func Scan(path string, mon *Monitor) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	bootWall := BootWall()
	buf := make([]byte, BufSize)
	n := 0
	for {
		k, err := unix.Read(fd, buf)
		switch {
		case err == unix.EAGAIN:
			mon.Tick(MonotonicNow(), time.Now())
			return n, nil
		case err == unix.EPIPE:
			continue
		case err != nil:
			return n, &os.PathError{Op: "read", Path: path, Err: err}
		}
		rec, perr := ParseRecord(buf[:k])
		if perr != nil {
			mon.m.parseErrors.Inc()
			continue
		}
		mon.Handle(rec, bootWall.Add(time.Duration(rec.Usec)*time.Microsecond))
		n++
	}
}
