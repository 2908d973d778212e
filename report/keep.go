package report

import (
	"encoding/json"
)

// Keep registers fn, whose value is saved in the state file under key at
// every Save, in the same atomic write as the conditions. fn is called with
// the store's lock held, so what it returns is consistent with the
// conditions saved beside it: a producer that updates its value only after
// the Set calls its input caused (the kernel log cursor after a record's
// conditions) can never have a saved value that runs ahead of the saved
// conditions. fn must not call the Store, and must return a value that
// later changes do not alter (a copy). Kept values belong to one boot: Load
// restores them only when the boot is the same.
func (s *Store) Keep(key string, fn func() any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepers[key] = fn
	delete(s.last, key)
}

// KeepLast is Keep for a value that holds what other producers handed over
// to its own before they moved their kept values on: its fn is called after
// every Keep's fn of the same save. The Event writer's pending occurrences
// are such a value, the kernel log cursor such another: read in this order,
// every record the saved cursor counts as handled has its occurrence in
// the saved events (a record handled between the two reads is in both, and
// handled again at the next start, never lost).
func (s *Store) KeepLast(key string, fn func() any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepers[key] = fn
	s.last[key] = true
}

// Memo decodes the value kept under key in this boot into v and reports
// whether there was one that decoded: the value the next Save would write
// when a producer is registered with Keep (a producer rebuilt within the
// run, a check re-planned, resumes where the one it replaces was), else the
// value Load restored.
func (s *Store) Memo(key string, v any) bool {
	ok, err := s.MemoErr(key, v)
	return ok && err == nil
}

// MemoErr is Memo that tells a value kept under key that does not decode
// into v (ok, with the error) from no value (not ok).
func (s *Store) MemoErr(key string, v any) (ok bool, err error) {
	s.mu.Lock()
	raw, ok := s.memos[key]
	if fn := s.keepers[key]; fn != nil {
		raw, err = json.Marshal(fn())
		ok = err == nil
	}
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(raw, v)
}

// encodedWrite is what the keepers with an OnWritten hook returned into
// one encoded write.
type encodedWrite struct {
	gen  uint64
	vals map[string]any
}

// maxInWrite bounds the encoded writes whose end is awaited: one is in
// flight at a time, and an encoding whose write never started (or whose
// writer never tells its end) is dropped once this many came after it.
const maxInWrite = 4

// OnWritten registers fn, called once the write of a state file that
// holds the value key's keeper (Keep) returned ended: with that value,
// and the write's error (nil: the value is on disk). A value whose
// write is never told ended is never passed. Only whoever writes the
// state file tells the ends of its writes (ReportWrites): a producer that
// must know what is on disk (the kernel log reader, which counts a gap of
// lost records only once the move past it is saved, so that a restart
// does not count it again) asks WritesReported first. fn is called
// without the store's lock held; it must not block.
func (s *Store) OnWritten(key string, fn func(v any, err error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onWritten[key] = fn
}

// ReportWrites says that the writer of this store's state file tells the
// end of each write (EncodeWrite, WriteEnded). Save does so itself.
func (s *Store) ReportWrites() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writesReported = true
}

// WritesReported reports whether the ends of the state file's writes are
// told (ReportWrites): where not, no OnWritten hook is ever called.
func (s *Store) WritesReported() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writesReported
}

// encodedLocked numbers a write being encoded and keeps what the keepers
// with an OnWritten hook returned into it (memos: the snapshot's values).
func (s *Store) encodedLocked(memos map[string]any) uint64 {
	s.writeGen++
	if len(s.onWritten) == 0 {
		return s.writeGen
	}
	vals := make(map[string]any, len(s.onWritten))
	for k := range s.onWritten {
		if v, ok := memos[k]; ok {
			vals[k] = v
		}
	}
	if len(s.inWrite) == maxInWrite {
		s.inWrite = append(s.inWrite[:0], s.inWrite[1:]...)
	}
	s.inWrite = append(s.inWrite, encodedWrite{gen: s.writeGen, vals: vals})
	return s.writeGen
}

// WriteEnded tells the store that the write of the bytes EncodeWrite
// returned with gen ended, with err (nil: they are on disk), and calls the
// OnWritten hooks with the values it held. Writes encoded before it whose
// end was not told are forgotten.
func (s *Store) WriteEnded(gen uint64, err error) {
	s.mu.Lock()
	var w encodedWrite
	n := 0
	for n < len(s.inWrite) && s.inWrite[n].gen <= gen {
		if s.inWrite[n].gen == gen {
			w = s.inWrite[n]
		}
		n++
	}
	s.inWrite = append(s.inWrite[:0], s.inWrite[n:]...)
	type call struct {
		fn func(any, error)
		v  any
	}
	var calls []call
	for k, v := range w.vals {
		if fn := s.onWritten[k]; fn != nil {
			calls = append(calls, call{fn, v})
		}
	}
	s.mu.Unlock()
	for _, c := range calls {
		c.fn(c.v, err)
	}
}
