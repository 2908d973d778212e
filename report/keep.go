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
}

// Memo decodes the value kept under key in this boot into v and reports
// whether there was one that decoded: the value the next Save would write
// when a producer is registered with Keep (a producer rebuilt within the
// run, a check re-planned, resumes where the one it replaces was), else the
// value Load restored.
func (s *Store) Memo(key string, v any) bool {
	s.mu.Lock()
	raw, ok := s.memos[key]
	if fn := s.keepers[key]; fn != nil {
		b, err := json.Marshal(fn())
		raw, ok = b, err == nil
	}
	s.mu.Unlock()
	return ok && json.Unmarshal(raw, v) == nil
}
