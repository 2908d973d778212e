package checks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The journal is read through journalctl --output=json, journald's own
// reader (the shipped binary has no cgo, so no sd-journal), one entry per
// line. A line that is not an entry is skipped and counted, never fatal.

// journalEntry is one line of journalctl --output=json: the fields this
// daemon reads.
type journalEntry struct {
	Cursor   string    // __CURSOR: where to continue after this entry
	Realtime time.Time // __REALTIME_TIMESTAMP: when journald received it
	BootID   string    // _BOOT_ID: the boot it was logged in ("" when absent)
	// Messages are the values of MESSAGE: none when the field is absent, or
	// null (journalctl writes null for a value over 4096 bytes without
	// --all); several when the entry has the field more than once.
	Messages [][]byte
}

// maxJournalLine bounds one line of journalctl output; a longer one is
// skipped (with --output-fields=MESSAGE and without --all a line is a few
// kilobytes at most).
const maxJournalLine = 1 << 20

// parseJournalLine decodes one line of journalctl --output=json. Field values
// are JSON strings, or, for a value that is not valid UTF-8, an array of its
// bytes; a field present more than once is an array of such values.
func parseJournalLine(line []byte) (journalEntry, error) {
	var raw struct {
		Cursor   *string         `json:"__CURSOR"`
		Realtime *string         `json:"__REALTIME_TIMESTAMP"`
		BootID   string          `json:"_BOOT_ID"`
		Message  json.RawMessage `json:"MESSAGE"`
	}
	if err := json.Unmarshal(line, &raw); err != nil {
		return journalEntry{}, fmt.Errorf("not a journal entry: %w", err)
	}
	if raw.Cursor == nil || *raw.Cursor == "" {
		return journalEntry{}, errors.New("not a journal entry: no __CURSOR")
	}
	if raw.Realtime == nil {
		return journalEntry{}, errors.New("not a journal entry: no __REALTIME_TIMESTAMP")
	}
	usec, err := strconv.ParseInt(*raw.Realtime, 10, 64)
	if err != nil || usec < 0 {
		return journalEntry{}, fmt.Errorf("not a journal entry: __REALTIME_TIMESTAMP %q is not microseconds", *raw.Realtime)
	}
	e := journalEntry{Cursor: *raw.Cursor, Realtime: time.UnixMicro(usec).UTC(), BootID: raw.BootID}
	if len(raw.Message) > 0 {
		if e.Messages, err = journalValues(raw.Message); err != nil {
			return journalEntry{}, fmt.Errorf("not a journal entry: MESSAGE: %w", err)
		}
	}
	return e, nil
}

// journalValues decodes a field of journalctl's JSON: null, a string, an
// array of bytes (one value that is not UTF-8), or an array of those (the
// field repeated).
func journalValues(raw json.RawMessage) ([][]byte, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case bytes.Equal(raw, []byte("null")):
		return nil, nil
	case len(raw) > 0 && raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return [][]byte{[]byte(s)}, nil
	case len(raw) > 0 && raw[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, err
		}
		if len(items) > 0 && isJSONNumber(items[0]) { // one binary value
			b, err := journalBytes(items)
			if err != nil {
				return nil, err
			}
			return [][]byte{b}, nil
		}
		var vals [][]byte
		for _, it := range items { // the field repeated
			it = bytes.TrimSpace(it)
			switch {
			case bytes.Equal(it, []byte("null")):
			case len(it) > 0 && it[0] == '"':
				var s string
				if err := json.Unmarshal(it, &s); err != nil {
					return nil, err
				}
				vals = append(vals, []byte(s))
			case len(it) > 0 && it[0] == '[':
				var nums []json.RawMessage
				if err := json.Unmarshal(it, &nums); err != nil {
					return nil, err
				}
				b, err := journalBytes(nums)
				if err != nil {
					return nil, err
				}
				vals = append(vals, b)
			default:
				return nil, fmt.Errorf("value %.40s is neither a string nor bytes", it)
			}
		}
		return vals, nil
	}
	return nil, fmt.Errorf("value %.40s is neither a string nor bytes", raw)
}

func isJSONNumber(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && (b[0] == '-' || (b[0] >= '0' && b[0] <= '9'))
}

// journalBytes decodes an array of numbers 0-255.
func journalBytes(nums []json.RawMessage) ([]byte, error) {
	b := make([]byte, len(nums))
	for i, n := range nums {
		v, err := strconv.ParseUint(string(bytes.TrimSpace(n)), 10, 8)
		if err != nil {
			return nil, fmt.Errorf("byte %d: %.20s is not 0-255", i, n)
		}
		b[i] = byte(v)
	}
	return b, nil
}

// journalQuery is one read of a unit's entries (those whose _SYSTEMD_UNIT
// is Unit).
type journalQuery struct {
	Journalctl string // path of journalctl
	Root       string // --root (the host root), "" for this system's journal
	Unit       string
	After      string    // --after-cursor, when not ""
	Since      time.Time // else --since (whole seconds, rounded down)
	Max        int       // stop after this many entries (0: no bound)
}

func (q journalQuery) args() []string {
	a := []string{"--no-pager", "--quiet", "--output=json", "--output-fields=MESSAGE"}
	if q.Root != "" {
		a = append(a, "--root="+q.Root)
	}
	if q.After != "" {
		a = append(a, "--after-cursor="+q.After)
	} else {
		a = append(a, "--since=@"+strconv.FormatInt(q.Since.Unix(), 10))
	}
	// The unit's own entries, as the native reader reads them
	// (readJournalNative): not --unit=, which also matches what PID 1 and
	// systemd-coredump log about the unit.
	return append(a, "_SYSTEMD_UNIT="+q.Unit)
}

// describe is the command line for an error: the arguments, less the values
// that move from run to run (the cursor, the start time). An error that
// stays the same while journalctl fails the same way is logged once and
// leaves the condition's message as it is; with --since=@<now-5m> in it,
// each run's error was new.
func (q journalQuery) describe() string {
	a := q.args()
	for i, s := range a {
		switch {
		case strings.HasPrefix(s, "--after-cursor="):
			a[i] = "--after-cursor=<last cursor read>"
		case strings.HasPrefix(s, "--since="):
			a[i] = "--since=<start of the read>"
		}
	}
	return filepath.Base(q.Journalctl) + " " + strings.Join(a, " ")
}

// journalRead says what one read saw.
type journalRead struct {
	Entries   int    // entries read
	Skipped   int    // lines that were not entries
	FirstBad  string // the first of them (shortened), for the message
	Truncated bool   // Max entries were read; the rest is left for the next read
	Cursor    string // the cursor of the last entry read ("" when none)
}

// readJournal runs journalctl for q and calls fn with each entry, in journal
// order. A non-zero exit, or journalctl not starting, is an error with
// journalctl's own words (and the command line, less its moving values); a line that is not an entry is skipped and counted.
func readJournal(ctx context.Context, q journalQuery, fn func(journalEntry)) (journalRead, error) {
	var r journalRead
	cmd := exec.CommandContext(ctx, q.Journalctl, q.args()...)
	var stderr limitedBuffer
	stderr.max = 2048
	cmd.Stderr = &stderr
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	if err := cmd.Start(); err != nil {
		return r, err
	}
	br := bufio.NewReaderSize(out, 64<<10)
	var readErr error
	for {
		line, overlong, err := readLine(br, maxJournalLine)
		if len(line) > 0 || overlong {
			if overlong {
				r.skip(fmt.Sprintf("a line over %d bytes", maxJournalLine))
			} else if e, perr := parseJournalLine(line); perr != nil {
				r.skip(fmt.Sprintf("%.80q: %v", line, perr))
			} else {
				r.Entries++
				r.Cursor = e.Cursor
				fn(e)
				if q.Max > 0 && r.Entries >= q.Max {
					r.Truncated = true
					break
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	if r.Truncated {
		cmd.Process.Kill() // the rest is for the next read
		cmd.Wait()
		return r, nil
	}
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if werr != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = "no message"
		}
		return r, fmt.Errorf("%s: %w: %s", q.describe(), werr, msg)
	}
	if readErr != nil {
		return r, fmt.Errorf("reading the output of %s: %w", q.Journalctl, readErr)
	}
	return r, nil
}

func (r *journalRead) skip(what string) {
	if r.Skipped == 0 {
		r.FirstBad = what
	}
	r.Skipped++
}

// readLine reads one line (without its newline) of at most max bytes; a
// longer one is consumed and reported as overlong, with no bytes.
func readLine(br *bufio.Reader, max int) (line []byte, overlong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !overlong {
			if len(buf)+len(chunk) > max+1 { // +1: the newline
				overlong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if overlong {
			return nil, true, err
		}
		return bytes.TrimRight(buf, "\r\n"), false, err
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}
