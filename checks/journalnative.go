package checks

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/rawsys"
)

// readJournalNative reads q from the journal files under root (journalDirs)
// without journalctl, and yields what readJournal yields for q: the same
// entries in the same order, with the same cursors, times, boot IDs and
// MESSAGE values. It follows what journalctl 252 (sd-journal) does for a
// single field match: each file is positioned at its first entry of the
// match at or after the start (by sequence number in a file of the cursor's
// sequence, else by wall-clock time, with journald's array bisection), the
// files are merged by sd-journal's order, and an entry equal to the last one
// yielded is skipped. A cursor whose file is gone, its entry copied into a
// file of another sequence (journald's flush to /var), goes on after the
// copy (copiedCursor). Where journalctl's result would depend on something
// this reader does not follow (a file of another sequence holding the
// cursor's boot but no copy of its entry: sd-journal seeks it by monotonic
// time; the same entry in two files; an order that depends on the order of
// the directory's entries), it returns an error wrapping
// errJournalUnsupported, and the caller asks journalctl.
func readJournalNative(ctx context.Context, root string, q journalQuery, fn func(journalEntry)) (journalRead, error) {
	var r journalRead
	match := []byte("_SYSTEMD_UNIT=" + q.Unit)
	var cur *journalCursor
	if q.After != "" {
		c, err := parseJournalCursor(q.After)
		if err != nil {
			return r, err
		}
		cur = &c
	}
	paths, err := journalFiles(root, q.Root == "")
	if err != nil {
		return r, err
	}
	var files []*journalFile
	defer func() {
		for _, f := range files {
			f.fd.Close()
		}
	}()
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		f, err := openNativeFile(p)
		if err != nil {
			return r, fmt.Errorf("%s: %w", p, err)
		}
		if f != nil {
			files = append(files, f)
		}
	}
	if cur != nil {
		if cur, err = copiedCursor(files, cur); err != nil {
			return r, err
		}
	}
	var srcs []*nativeSource
	for _, f := range files {
		s, err := positionNativeSource(f, match, cur, q.Since)
		if f.tilde && errors.Is(err, errJournalCorrupt) {
			s, err = nil, nil
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", f.path, err)
		}
		if s != nil {
			srcs = append(srcs, s)
		}
	}

	var last *nativeCand // the location: the last entry yielded (or skipped as the cursor's)
	first := true
	for {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		// Each file moves past what is not after the location.
		if last != nil {
			for _, s := range srcs {
				for s.cand != nil && compareWithLocation(s.cand, last, s == last.src) <= 0 {
					if err := s.advance(); err != nil {
						return r, fmt.Errorf("%s: %w", s.f.path, err)
					}
				}
			}
		}
		best, err := pickNext(srcs)
		if err != nil {
			return r, err
		}
		if best == nil {
			return r, nil
		}
		c := best.cand
		if err := best.advance(); err != nil {
			return r, fmt.Errorf("%s: %w", best.f.path, err)
		}
		last = c
		if first && cur != nil && cur.matches(c) {
			first = false
			continue // --after-cursor: the cursor's own entry
		}
		first = false
		e, err := c.src.journalEntry(c)
		if err != nil {
			return r, fmt.Errorf("%s: %w", c.src.f.path, err)
		}
		r.Entries++
		r.Cursor = e.Cursor
		fn(e)
		if q.Max > 0 && r.Entries >= q.Max {
			r.Truncated = true
			return r, nil
		}
	}
}

// journalCursor is a cursor as journalctl prints it.
type journalCursor struct {
	seqnumID  [16]byte
	seqnum    uint64
	bootID    [16]byte
	monotonic uint64
	realtime  uint64
	xorHash   uint64
}

// parseJournalCursor reads s=..;i=..;b=..;m=..;t=..;x=.. (all six, as
// sd_journal_get_cursor writes them); anything else is left to journalctl.
func parseJournalCursor(s string) (journalCursor, error) {
	var c journalCursor
	parts := strings.Split(s, ";")
	if len(parts) != 6 {
		return c, unsupportedf(FallbackCursor, "a cursor not of the form s=;i=;b=;m=;t=;x=")
	}
	for i, key := range []string{"s", "i", "b", "m", "t", "x"} {
		k, v, ok := strings.Cut(parts[i], "=")
		if !ok || k != key || v == "" {
			return c, unsupportedf(FallbackCursor, "a cursor not of the form s=;i=;b=;m=;t=;x=")
		}
		var err error
		switch key {
		case "s":
			err = parseID128(v, &c.seqnumID)
		case "b":
			err = parseID128(v, &c.bootID)
		case "i":
			c.seqnum, err = strconv.ParseUint(v, 16, 64)
		case "m":
			c.monotonic, err = strconv.ParseUint(v, 16, 64)
		case "t":
			c.realtime, err = strconv.ParseUint(v, 16, 64)
		case "x":
			c.xorHash, err = strconv.ParseUint(v, 16, 64)
		}
		if err != nil {
			return c, unsupportedf(FallbackCursor, "a cursor not of the form s=;i=;b=;m=;t=;x=")
		}
	}
	return c, nil
}

func parseID128(s string, id *[16]byte) error {
	if len(s) != 32 || strings.ToLower(s) != s {
		return errors.New("not an ID")
	}
	_, err := hex.Decode(id[:], []byte(s))
	return err
}

// matches is sd_journal_test_cursor: the entry is the cursor's.
func (c *journalCursor) matches(e *nativeCand) bool {
	return c.seqnumID == e.src.f.hdr.seqnumID && c.seqnum == e.seqnum && c.bootID == e.bootID &&
		c.monotonic == e.monotonic && c.realtime == e.realtime && c.xorHash == e.xorHash
}

// journalFiles lists the journal files journalctl reads: *.journal and
// *.journal~ (journald's name for a file it found unclean) in the machine
// directories of /run/log/journal and /var/log/journal. Layouts whose
// reading by journalctl this reader does not follow are errJournalUnsupported.
//
// localOnly is journalctl without --root (host_root "/"): sd-journal opened
// with SD_JOURNAL_LOCAL_ONLY reads, under /var/log/journal, only the
// directory of this machine's ID (/etc/machine-id), and under /run all.
// Another machine's directory there (an image built with a persistent
// journal and given a new machine ID at first boot) is not read; where
// this machine's ID cannot be read, journalctl is asked.
func journalFiles(root string, localOnly bool) ([]string, error) {
	var out []string
	machines := map[string]bool{}
	var localID string
	var localErr error
	if localOnly {
		b, err := readMachineID(filepath.Join(root, "/etc/machine-id"))
		localID = strings.TrimSpace(string(b))
		var id [16]byte
		if err == nil {
			err = parseID128(localID, &id)
		}
		localErr = err
	}
	for _, d := range journalDirs {
		// As journalctl --root finds it: a /var/log the host links to a
		// data disk (/var/log -> /data/log) is <root>/data/log.
		dir := hostio.InRoot(root, d)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, de := range ents {
			name := de.Name()
			if !de.IsDir() {
				if journalFileName(name) {
					return nil, unsupportedf(FallbackLayout, "a journal file outside a machine directory (%s)", filepath.Join(dir, name))
				}
				continue
			}
			var id [16]byte
			if parseID128(name, &id) != nil {
				continue // a journal namespace (<machine-id>.<namespace>) or other: journalctl does not read it either
			}
			if localOnly && d == "/var/log/journal" {
				if localErr != nil {
					return nil, unsupportedf(FallbackLayout, "this machine's ID (/etc/machine-id) not read: %v", localErr)
				}
				if name != localID {
					continue // another machine's: journalctl does not read it
				}
			}
			machines[name] = true
			files, err := os.ReadDir(filepath.Join(dir, name))
			if err != nil {
				return nil, err
			}
			for _, fe := range files {
				if journalFileName(fe.Name()) && fe.Type().IsRegular() {
					out = append(out, filepath.Join(dir, name, fe.Name()))
				}
			}
		}
	}
	if len(machines) > 1 {
		return nil, unsupportedf(FallbackLayout, "journal directories of %d machines", len(machines))
	}
	return out, nil
}

// readMachineID reads the machine ID file at path (33 bytes; more than
// 4 KiB is an error, not an ID) by ordinary system calls, not os
// (rawsys.ReadFileNoPoll): os.ReadFile registers the file with the
// runtime's poller, four fcntl(2) and a refused epoll_ctl(2) each read
// (TestNativeJournalReadSystemCalls). O_NONBLOCK: a FIFO there does not
// hold the open (nor the read, an error then); a regular file ignores it.
func readMachineID(path string) ([]byte, error) {
	const max = 4 << 10
	b, err := rawsys.ReadFileNoPoll(path, unix.O_NONBLOCK, 64, max)
	if errors.Is(err, rawsys.ErrTooLarge) {
		return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("larger than %d bytes", max)}
	}
	return b, err
}

func journalFileName(n string) bool {
	return strings.HasSuffix(n, ".journal") || strings.HasSuffix(n, ".journal~")
}

// nativeSource is one file's entries of the match, from the start.
type nativeSource struct {
	f    *journalFile
	it   entryIter
	cand *nativeCand // the next entry, nil at the end
}

// nativeCand is an entry of a source.
type nativeCand struct {
	jEntry
	src  *nativeSource
	size uint64
}

// openNativeFile opens the file (its fd kept in the journalFile, to close):
// nil for a ~ file left out.
//
// A *.journal~ file is one journald found not closed (journald or the node
// crashed) and will never write again; after a power cut or a kernel panic
// its tail is often torn (pages of it never written back). sd-journal reads
// such a file as far as it can: its bisection stops short of an invalid
// entry, and a file it cannot open, seek or iterate on is left out, the
// entries already read from it kept ("Can't iterate through ..., ignoring").
// So does this reader for a ~ file's inconsistencies (errJournalCorrupt):
// the file is left out (here, or where readJournalNative positions it), or
// ends there. Any other file's are errors, the run reads with journalctl.
func openNativeFile(path string) (*journalFile, error) {
	tilde := strings.HasSuffix(path, ".journal~")
	f, fd, err := osJournalFile(path)
	if err != nil {
		if tilde && errors.Is(err, errJournalCorrupt) {
			return nil, nil
		}
		return nil, err
	}
	f.tilde, f.fd = tilde, fd
	return f, nil
}

// copiedCursor is, where no file is of the cursor's sequence and one holds
// a copy of the cursor's entry, the cursor of that copy; else cur.
// journald's flush of /run/log/journal to /var/log/journal (at
// systemd-journal-flush.service, every boot) copies the boot's entries into
// a file of a new sequence (the same boot, times and hashes) and removes
// /run's files, the cursor's among them. With the copy's cursor the read
// goes on after the copy, by sequence number, each line once. journalctl
// seeks such a file by the cursor's boot and monotonic time, at the first
// of the entries of that time, and skips one: journald stamps the lines it
// reads from a stream at once with one time, so after a cursor within such
// a burst journalctl gives the burst's lines before it again.
func copiedCursor(files []*journalFile, cur *journalCursor) (*journalCursor, error) {
	for _, f := range files {
		if f.hdr.seqnumID == cur.seqnumID {
			return cur, nil
		}
	}
	for _, f := range files {
		e, ok, err := f.findCopy(cur)
		if f.tilde && errors.Is(err, errJournalCorrupt) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.path, err)
		}
		if ok {
			c := *cur
			c.seqnumID, c.seqnum = f.hdr.seqnumID, e.seqnum
			return &c, nil
		}
	}
	return cur, nil
}

// findCopy finds the entry of the cursor's boot, monotonic time, wall-clock
// time and hash: among the boot's entries of that monotonic time (several
// for a burst of lines), found by journald's bisection.
//
// Lines alike (the same line twice in one burst: the same fields, time and
// hash) have copies alike; the cursor's is the one at its place in the
// flush: journald's /run sequence starts at 1 with the boot, and the flush
// copies it in order, so entry i is the copy at the boot's first entry's
// sequence number + i - 1 here. Where that is not one of them (the /run
// file vacuumed before the flush), the first of them.
func (f *journalFile) findCopy(cur *journalCursor) (jEntry, bool, error) {
	boot, ok, err := f.findData([]byte("_BOOT_ID=" + idHex(cur.bootID)))
	if err != nil || !ok {
		return jEntry{}, false, err
	}
	it := entryIter{f: f, d: boot, cutShort: f.tilde}
	if err := it.seek(func(e jEntry) bool { return e.monotonic >= cur.monotonic }); err != nil {
		return jEntry{}, false, err
	}
	var alike []jEntry
	for {
		e, _, ok, err := it.next()
		if err != nil {
			return jEntry{}, false, err
		}
		if !ok || e.bootID != cur.bootID || e.monotonic != cur.monotonic {
			break
		}
		if e.realtime == cur.realtime && e.xorHash == cur.xorHash {
			alike = append(alike, e)
		}
	}
	switch len(alike) {
	case 0:
		return jEntry{}, false, nil
	case 1:
		return alike[0], true, nil
	}
	first := entryIter{f: f, d: boot, cutShort: f.tilde}
	e0, _, ok, err := first.next()
	if err != nil || !ok {
		return alike[0], true, err
	}
	for _, e := range alike {
		if e.seqnum-e0.seqnum == cur.seqnum-1 {
			return e, true, nil
		}
	}
	return alike[0], true, nil
}

// positionNativeSource positions an open file at its first entry of the
// match after the start: nil when it has none.
func positionNativeSource(f *journalFile, match []byte, cur *journalCursor, since time.Time) (*nativeSource, error) {
	s := &nativeSource{f: f}
	if f.creating {
		return nil, nil
	}
	bySeqnum := cur != nil && cur.seqnumID == f.hdr.seqnumID
	if bySeqnum && f.hdr.tailEntrySeqnum < cur.seqnum {
		return nil, nil // the file ends before the cursor
	}
	d, ok, err := f.findData(match)
	if err != nil || !ok {
		return nil, err
	}
	s.it = entryIter{f: f, d: d, cutShort: f.tilde}
	switch {
	case bySeqnum:
		err = s.it.seek(func(e jEntry) bool { return e.seqnum >= cur.seqnum })
	case cur != nil:
		// sd-journal seeks a file of another sequence by monotonic time
		// when it holds entries of the cursor's boot (with its own
		// intersection of the boot's entries and the match's): not
		// followed here. Where a file holds a copy of the cursor's entry
		// (journald's flush to /var), copiedCursor made the cursor that
		// copy's, of the file's sequence.
		var has bool
		if _, has, err = f.findData([]byte("_BOOT_ID=" + idHex(cur.bootID))); err != nil {
			return nil, err
		}
		if has {
			return nil, unsupportedf(FallbackCursor, "a journal file of another sequence than the cursor's holds entries of the cursor's boot, and none holds the cursor's entry")
		}
		err = s.it.seek(func(e jEntry) bool { return e.realtime >= cur.realtime })
	default:
		t := uint64(since.Unix()) * 1e6 // --since=@<seconds>
		if since.Unix() < 0 {
			t = 0
		}
		err = s.it.seek(func(e jEntry) bool { return e.realtime >= t })
	}
	if err != nil {
		return nil, err
	}
	if err := s.advance(); err != nil {
		return nil, err
	}
	if s.cand == nil {
		return nil, nil
	}
	return s, nil
}

// advance moves the source to its next entry; a ~ file ends at an
// inconsistency (openNativeFile).
func (s *nativeSource) advance() error {
	e, size, ok, err := s.it.next()
	if s.f.tilde && errors.Is(err, errJournalCorrupt) {
		s.it.finished = true
		s.cand = nil
		return nil
	}
	if err != nil {
		return err
	}
	if !ok {
		s.cand = nil
		return nil
	}
	s.cand = &nativeCand{jEntry: e, src: s, size: size}
	return nil
}

// pickNext is the source whose candidate sd-journal yields next: the one
// before all others by compareEntryOrder. Two candidates that are the same
// entry (the same boot, times and hash: a copy in two files), or no single
// first one (the order mixes sequence numbers and times and is not
// transitive: sd-journal's pick then depends on the directory's order), are
// errJournalUnsupported.
func pickNext(srcs []*nativeSource) (*nativeSource, error) {
	var best *nativeSource
	for _, s := range srcs {
		if s.cand == nil {
			continue
		}
		if best == nil || compareEntryOrder(s.cand, best.cand) < 0 {
			best = s
		}
	}
	if best == nil {
		return nil, nil
	}
	for _, s := range srcs {
		if s == best || s.cand == nil {
			continue
		}
		if compareEntryOrder(best.cand, s.cand) >= 0 {
			if sameEntry(best.cand, s.cand) {
				return nil, unsupportedf(FallbackOrder, "the same entry in two journal files")
			}
			return nil, unsupportedf(FallbackOrder, "journal files whose entries sd-journal orders by the directory's order")
		}
	}
	return best, nil
}

func sameEntry(a, b *nativeCand) bool {
	return a.bootID == b.bootID && a.monotonic == b.monotonic && a.realtime == b.realtime && a.xorHash == b.xorHash
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// compareEntryOrder is sd-journal's compare_entry_order.
func compareEntryOrder(a, b *nativeCand) int {
	if sameEntry(a, b) {
		return 0
	}
	return compareOrder(a, b, a.src.f.hdr.seqnumID == b.src.f.hdr.seqnumID)
}

// compareOrder is what compareEntryOrder and compareWithLocation compare
// once the entries are not the same: the sequence numbers when sameSeq,
// the monotonic times within one boot, then the realtimes, then the xor
// hashes.
func compareOrder(a, b *nativeCand, sameSeq bool) int {
	if sameSeq {
		if r := cmpU64(a.seqnum, b.seqnum); r != 0 {
			return r
		}
	}
	if a.bootID == b.bootID {
		if r := cmpU64(a.monotonic, b.monotonic); r != 0 {
			return r
		}
	}
	if r := cmpU64(a.realtime, b.realtime); r != 0 {
		return r
	}
	return cmpU64(a.xorHash, b.xorHash)
}

// compareWithLocation is sd-journal's compare_with_location, the location
// being the last entry yielded (all its fields set).
func compareWithLocation(e, l *nativeCand, sameFile bool) int {
	sameSeq := e.src.f.hdr.seqnumID == l.src.f.hdr.seqnumID
	if sameEntry(e, l) && sameSeq && e.seqnum == l.seqnum && !sameFile {
		return 0
	}
	return compareOrder(e, l, sameSeq)
}

// journalEntry reads the candidate's MESSAGE values and makes the entry
// journalctl --output=json --output-fields=MESSAGE prints for it.
func (s *nativeSource) journalEntry(c *nativeCand) (journalEntry, error) {
	f := s.f
	e := journalEntry{
		Cursor: fmt.Sprintf("s=%s;i=%x;b=%s;m=%x;t=%x;x=%x", idHex(f.hdr.seqnumID), c.seqnum, idHex(c.bootID), c.monotonic, c.realtime, c.xorHash),
		// journalctl prints the boot ID of the entry's header.
		Realtime: time.UnixMicro(int64(c.realtime)).UTC(),
		BootID:   idHex(c.bootID),
	}
	items, err := f.entryItems(c.offset, c.size)
	if err != nil {
		return e, err
	}
	const field = "MESSAGE="
	for _, off := range items {
		d, err := f.dataObject(off)
		if err != nil {
			return e, err
		}
		if d.flags == 0 {
			// Look at the field's name before reading the value.
			start := off + f.dataPayloadOffset()
			n := off + d.size - start
			if n < uint64(len(field)) {
				continue
			}
			b, err := f.read(start, uint64(len(field)))
			if err != nil {
				return e, err
			}
			if string(b) != field {
				continue
			}
		}
		p, over, err := f.payload(d, jsonValueMax)
		if err != nil {
			return e, err
		}
		if over || !bytes.HasPrefix(p, []byte(field)) {
			continue // null in journalctl's JSON (a value over 4096 bytes), or another field
		}
		e.Messages = append(e.Messages, p[len(field):])
	}
	return e, nil
}

// entryIter walks a DATA object's entries: its first entry (entry_offset),
// then the items of its entry-array chain, n_entries in all. Entry offsets
// strictly increase, and so do the arrays' offsets: a corrupt chain is an
// error, never a loop.
type entryIter struct {
	f *journalFile
	d jData

	pos      uint64   // logical index of the next entry (0: entry_offset)
	items    []uint64 // the current array's items
	base     uint64   // the logical index of items[0]
	nextArr  uint64   // the next array's offset
	lastArr  uint64   // the current array's offset
	lastEnt  uint64   // the offset of the last entry read
	finished bool
	// cutShort: seek takes an invalid last item of an array (0, or not a
	// valid entry) for the end of the entries, as sd-journal's
	// generic_array_bisect does ("cutting algorithm short"): a ~ file's
	// torn tail. An invalid item met while bisecting within an array (a
	// hole, not a torn tail) stays an error: the ~ file is left out.
	cutShort bool
}

// loadArray reads the array at off, whose first item has logical index base.
func (it *entryIter) loadArray(off, base uint64) error {
	if off <= it.lastArr || off == 0 {
		return corruptf("entry array chain goes from %d to %d", it.lastArr, off)
	}
	next, items, err := it.f.entryArray(off)
	if err != nil {
		return err
	}
	it.items, it.base, it.nextArr, it.lastArr = items, base, next, off
	return nil
}

// seek positions the iterator at the first entry for which right holds, as
// sd-journal's generic_array_bisect_plus_one looks for it: the first entry,
// then each array by its last used item, then a bisection within the array.
func (it *entryIter) seek(right func(jEntry) bool) error {
	n := it.d.nEntries
	if n == 0 || it.d.entryOffset == 0 {
		it.finished = true
		return nil
	}
	e, _, err := it.f.entry(it.d.entryOffset)
	if err != nil {
		return err
	}
	if right(e) {
		it.pos = 0
		return nil
	}
	remaining := n - 1
	a := it.d.entryArrayOffset
	var base, prev uint64
	for a != 0 {
		if a <= prev {
			return corruptf("entry array chain goes from %d to %d", prev, a)
		}
		prev = a
		next, slots, err := it.f.entryArrayHeader(a)
		if err != nil {
			return err
		}
		k := min(slots, remaining)
		if k == 0 {
			break
		}
		lastOff, err := it.f.entryArrayItem(a, k-1)
		if err != nil {
			return err
		}
		var e jEntry
		if lastOff == 0 {
			err = corruptf("entry array at %d: item %d is 0", a, k-1)
		} else {
			e, _, err = it.f.entry(lastOff)
		}
		if it.cutShort && errors.Is(err, errJournalCorrupt) {
			// The entries end before this item: the same array again,
			// with k-1 items.
			remaining = k - 1
			prev = a - 1
			continue
		}
		if err != nil {
			return err
		}
		if right(e) {
			it.lastArr = 0 // the chain up to a was checked above
			if err := it.loadArray(a, base); err != nil {
				return err
			}
			lo, hi := uint64(0), k-1
			for lo < hi {
				mid := (lo + hi) / 2
				off := it.items[mid]
				if off == 0 {
					return corruptf("entry array at %d: item %d is 0", a, mid)
				}
				e, _, err := it.f.entry(off)
				if err != nil {
					return err
				}
				if right(e) {
					hi = mid
				} else {
					lo = mid + 1
				}
			}
			it.pos = 1 + base + lo
			it.lastEnt = 0
			if lo > 0 {
				it.lastEnt = it.items[lo-1]
			}
			return nil
		}
		if slots >= remaining {
			break
		}
		remaining -= slots
		base += slots
		a = next
	}
	it.finished = true
	return nil
}

// next returns the next entry.
func (it *entryIter) next() (jEntry, uint64, bool, error) {
	if it.finished || it.pos >= it.d.nEntries {
		return jEntry{}, 0, false, nil
	}
	var off uint64
	if it.pos == 0 {
		off = it.d.entryOffset
	} else {
		i := it.pos - 1
		if it.items == nil {
			if err := it.loadArray(it.d.entryArrayOffset, 0); err != nil {
				return jEntry{}, 0, false, err
			}
		}
		for i >= it.base+uint64(len(it.items)) {
			if err := it.loadArray(it.nextArr, it.base+uint64(len(it.items))); err != nil {
				return jEntry{}, 0, false, err
			}
		}
		off = it.items[i-it.base]
	}
	if off <= it.lastEnt {
		return jEntry{}, 0, false, corruptf("entry offsets go from %d to %d", it.lastEnt, off)
	}
	e, size, err := it.f.entry(off)
	if err != nil {
		return jEntry{}, 0, false, err
	}
	it.lastEnt = off
	it.pos++
	return e, size, true, nil
}
