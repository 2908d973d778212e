package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// stateFile is the on-disk form of the store.
type stateFile struct {
	Version    int         `json:"version"`
	BootID     string      `json:"bootID"`
	SavedAt    time.Time   `json:"savedAt"`
	Conditions []Condition `json:"conditions"`
	// Memos are the values registered with Keep (this boot's only).
	Memos map[string]json.RawMessage `json:"memos,omitempty"`
}

const stateVersion = 1

// StateFileName is the file under the state directory.
const StateFileName = "state.json"

// snapshot returns the conditions and the kept values as of one instant:
// the keepers run under the same lock as the copy of the conditions.
func (s *Store) snapshot() ([]Condition, map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	conds := make([]Condition, 0, len(s.conds))
	for _, c := range s.conds {
		conds = append(conds, c)
	}
	slices.SortFunc(conds, func(a, b Condition) int { return strings.Compare(a.Type, b.Type) })
	memos := make(map[string]any, len(s.memos)+len(s.keepers))
	for k, raw := range s.memos { // restored, and not (yet) kept by anyone: carried on
		memos[k] = raw
	}
	for k, fn := range s.keepers {
		memos[k] = fn()
	}
	return conds, memos
}

// Save writes the conditions and the kept values atomically (temp file,
// fsync, rename, fsync of the directory) to dir.
func (s *Store) Save(dir string, now time.Time) error {
	conds, memos := s.snapshot()
	sf := stateFile{Version: stateVersion, BootID: s.bootID, SavedAt: now, Conditions: conds}
	if len(memos) > 0 {
		sf.Memos = make(map[string]json.RawMessage, len(memos))
		for k, v := range memos {
			b, err := json.Marshal(v)
			if err != nil {
				return fmt.Errorf("state %s: %w", k, err)
			}
			sf.Memos[k] = b
		}
	}
	b, err := json.MarshalIndent(sf, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dir, StateFileName), append(b, '\n'), 0o644)
}

// WriteFileAtomic replaces path with data so that a crash at any moment
// leaves either the old file or the new one, whole: a temp file in the same
// directory, fsync, rename, fsync of the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// LoadResult says what Load restored.
type LoadResult struct {
	Restored int // conditions restored
	Dropped  int // conditions dropped: held until reboot, and the boot changed; or no longer in the catalog
	// Corrupt is set when the file could not be read; it was moved aside to
	// CorruptPath and the store starts empty.
	Corrupt     error
	CorruptPath string
}

// Load restores the store from dir. A missing file is not an error. Kernel
// conditions (held until reboot) are restored only when the boot is the same;
// conditions held forever and check conditions are always restored, so that a
// restart neither flaps them nor resets their transition times. A corrupt file
// is moved aside (never deleted) and reported in the result.
func (s *Store) Load(dir string) (LoadResult, error) {
	path := filepath.Join(dir, StateFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return LoadResult{}, nil
	}
	if err != nil {
		return LoadResult{}, err
	}
	var sf stateFile
	err = json.Unmarshal(b, &sf)
	if err == nil && sf.Version != stateVersion {
		err = fmt.Errorf("unsupported state version %d", sf.Version)
	}
	if err != nil {
		aside := path + ".corrupt"
		if rerr := os.Rename(path, aside); rerr != nil {
			return LoadResult{}, fmt.Errorf("state file %s unreadable (%v) and cannot be moved aside: %w", path, err, rerr)
		}
		return LoadResult{Corrupt: err, CorruptPath: aside}, nil
	}
	var res LoadResult
	var restored []Condition
	s.mu.Lock()
	for _, c := range sf.Conditions {
		desc, ok := Lookup(c.Type)
		if !ok || !desc.ValidReason(c.Status, c.Reason) {
			res.Dropped++
			continue
		}
		if desc.Hold == HoldUntilReboot && sf.BootID != s.bootID {
			res.Dropped++
			continue
		}
		s.conds[c.Type] = c
		restored = append(restored, c)
	}
	if sf.BootID == s.bootID {
		for k, raw := range sf.Memos {
			s.memos[k] = raw
		}
	}
	obs := s.observers
	s.mu.Unlock()
	res.Restored = len(restored)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	for _, c := range restored {
		for _, o := range obs {
			o.ConditionRestored(c)
		}
	}
	return res, nil
}
