package checks

import (
	"context"
	"time"
)

// JournalEntryForTest is a journal entry as KubeletHeartbeatFailed reads it.
type JournalEntryForTest struct {
	Cursor   string
	Realtime time.Time
	BootID   string
	Messages [][]byte
}

// ReadJournalForTest reads a unit's entries under root as
// KubeletHeartbeatFailed does, natively (journalctl "") or with that
// journalctl, after a cursor or else since a time, at most max (0: all):
// integration tests compare the two readers on a real journald's files.
func ReadJournalForTest(ctx context.Context, journalctl, root, unit, after string, since time.Time, max int) ([]JournalEntryForTest, error) {
	q := journalQuery{Journalctl: journalctl, Root: root, Unit: unit, After: after, Since: since, Max: max}
	var out []JournalEntryForTest
	fn := func(e journalEntry) {
		out = append(out, JournalEntryForTest{Cursor: e.Cursor, Realtime: e.Realtime, BootID: e.BootID, Messages: e.Messages})
	}
	var err error
	if journalctl == "" {
		_, err = readJournalNative(ctx, root, q, fn)
	} else {
		_, err = readJournal(ctx, q, fn)
	}
	return out, err
}
