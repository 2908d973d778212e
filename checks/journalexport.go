package checks

import (
	"context"
	"io"
	"sync/atomic"
	"time"
)

// JournalEntryForTest is a journal entry as KubeletHeartbeatFailed reads it.
type JournalEntryForTest = journalEntry

// ReadJournalForTest reads a unit's entries under root as
// KubeletHeartbeatFailed does, natively (journalctl "") or with that
// journalctl, after a cursor or else since a time, at most max (0: all):
// integration tests compare the two readers on a real journald's files.
func ReadJournalForTest(ctx context.Context, journalctl, root, unit, after string, since time.Time, max int) ([]JournalEntryForTest, error) {
	q := journalQuery{Journalctl: journalctl, Root: root, Unit: unit, After: after, Since: since, Max: max}
	var out []JournalEntryForTest
	fn := func(e journalEntry) { out = append(out, e) }
	var err error
	if journalctl == "" {
		_, err = readJournalNative(ctx, root, q, fn)
	} else {
		_, err = readJournal(ctx, q, fn)
	}
	return out, err
}

// CountJournalReadsForTest makes the native reader count its reads (preads)
// of journal files in n; the returned function undoes it.
func CountJournalReadsForTest(n *atomic.Int64) func() {
	old := journalReaderAt
	journalReaderAt = func(fd *journalFD) io.ReaderAt { return countingReaderAt{fd, n} }
	return func() { journalReaderAt = old }
}

type countingReaderAt struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countingReaderAt) ReadAt(b []byte, off int64) (int, error) {
	c.n.Add(1)
	return c.r.ReadAt(b, off)
}
