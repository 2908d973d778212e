package checks

import "sync"

// bootValue is a check's small value kept in the state file for this boot
// through Env.Memos: read back once from what was saved (a daemon restart
// within the boot continues from it), saved with every save of the store,
// and the store told when it changes. Without Memos (the one-shot check) it
// only holds the value. Checks that keep something use one (nodeinfo.go:
// "nodes.json was written in this boot", kubeletheartbeat.go: the journal cursor,
// sourceip.go: the audit log position, nodetampered.go: this boot's baseline
// digest).
type bootValue[T comparable] struct {
	key string
	// valid, if set, says whether a saved value may be restored.
	valid func(T) bool
	// read, if set, is the value saved, read at every save: the value
	// lives elsewhere (nodetampered.go: the tamper keeper's KeptDigest),
	// and set only tells the store that it changed.
	read func() T

	once sync.Once
	mu   sync.Mutex
	v    T
}

// restore reads the saved value, once, and from then on keeps the value in
// the state file. It must run without b.mu held: Memo takes the store's
// lock, and the store calls snapshot (b.mu) with its lock held.
func (b *bootValue[T]) restore(m Memos) {
	b.once.Do(func() {
		if m == nil {
			return
		}
		var saved T
		if m.Memo(b.key, &saved) && (b.valid == nil || b.valid(saved)) {
			b.mu.Lock()
			b.v = saved
			b.mu.Unlock()
		}
		m.Keep(b.key, b.snapshot)
	})
}

func (b *bootValue[T]) snapshot() any {
	if b.read != nil {
		return b.read()
	}
	return b.get()
}

func (b *bootValue[T]) get() T {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.v
}

// set stores v and, when it changed, tells the store (m may be nil).
func (b *bootValue[T]) set(m Memos, v T) {
	b.mu.Lock()
	changed := v != b.v
	b.v = v
	b.mu.Unlock()
	if changed && m != nil {
		m.Touch()
	}
}
