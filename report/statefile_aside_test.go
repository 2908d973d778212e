package report

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loadWithin runs Load, failing the test rather than hanging when it blocks
// (a FIFO opened for reading without O_NONBLOCK waits for a writer).
func loadWithin(t *testing.T, s *Store, dir string) (LoadResult, error) {
	t.Helper()
	type out struct {
		res LoadResult
		err error
	}
	ch := make(chan out, 1)
	go func() {
		res, err := s.Load(dir)
		ch <- out{res, err}
	}()
	select {
	case o := <-ch:
		return o.res, o.err
	case <-time.After(5 * time.Second):
		t.Fatal("Load blocked")
		return LoadResult{}, nil
	}
}

// Whatever is at state.json that is not a state file the daemon wrote is
// moved aside, and the daemon starts empty, never refusing to start.
func TestLoadMovesAsideWhatIsNotAStateFile(t *testing.T) {
	// A valid state file elsewhere, for the symlink to point at.
	good := t.TempDir()
	s0 := NewStore("b")
	s0.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	if err := s0.Save(good, t0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		make func(t *testing.T, p string)
		kind fs.FileMode
	}{
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "inside"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, fs.ModeDir},
		{"symlink", func(t *testing.T, p string) {
			if err := os.Symlink(filepath.Join(good, StateFileName), p); err != nil {
				t.Fatal(err)
			}
		}, fs.ModeSymlink},
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, fs.ModeNamedPipe},
		{"oversized", func(t *testing.T, p string) {
			b, err := os.ReadFile(filepath.Join(good, StateFileName))
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, strings.Repeat(" ", maxStateFile)...) // valid JSON, too large
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, 0},
		{"wrong version", func(t *testing.T, p string) {
			if err := os.WriteFile(p, []byte(`{"version":99}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, StateFileName)
			tc.make(t, p)
			s := NewStore("b")
			res, err := loadWithin(t, s, dir)
			if err != nil || res.Corrupt == nil || res.MoveErr != nil || res.CorruptPath != p+".corrupt" {
				t.Fatalf("Load = %+v, %v; want Corrupt set, moved aside to %s", res, err, p+".corrupt")
			}
			if fi, err := os.Lstat(res.CorruptPath); err != nil || fi.Mode().Type() != tc.kind {
				t.Errorf("not kept as it was at %s: %v, %v", res.CorruptPath, fi, err)
			}
			if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s still in place (%v)", p, err)
			}
			if len(s.All()) != 0 {
				t.Errorf("store not empty: %+v", s.All())
			}
			if err := s.Save(dir, t0); err != nil {
				t.Errorf("Save after moving aside: %v", err)
			}
		})
	}
}

// A read error (here: the state directory is a file, ENOTDIR) and a file
// that cannot be moved aside: the daemon still starts empty, the result says
// why it was not moved, and saving fails with an error that names the state
// file, the same every time (the save loop logs once per distinct error).
func TestLoadStartsEmptyWhenItCannotMoveAside(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := NewStore("b").Load(notDir)
	if err != nil || res.Corrupt == nil || res.CorruptPath != "" || res.MoveErr == nil {
		t.Errorf("Load(a file as the directory) = %+v, %v; want Corrupt and MoveErr set, no error", res, err)
	}

	// A directory at state.json the load did not move (created after it):
	// saving fails, naming it, the same every time.
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	s := NewStore("b")
	if res, err = s.Load(dir); err != nil || res.Corrupt != nil {
		t.Fatalf("Load(empty) = %+v, %v", res, err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	err1 := s.Save(dir, t0)
	err2 := s.Save(dir, t0.Add(time.Second))
	if err1 == nil || err2 == nil {
		t.Fatalf("Save over a directory = %v, %v; want errors", err1, err2)
	}
	if err1.Error() != err2.Error() || !strings.Contains(err1.Error(), p) {
		t.Errorf("save errors %q and %q: want the same, naming %s", err1, err2, p)
	}
}

// A second corrupt file never replaces the first: both are kept, with their
// contents.
func TestCorruptStatesInARowAreAllKept(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	for i, content := range []string{"{first", "{second", "{third"} {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := NewStore("b").Load(dir)
		want := p + ".corrupt"
		if i > 0 {
			want += "." + strconv.Itoa(i)
		}
		if err != nil || res.Corrupt == nil || res.CorruptPath != want {
			t.Fatalf("Load %d = %+v, %v; want moved aside to %s", i, res, err, want)
		}
	}
	for name, want := range map[string]string{".corrupt": "{first", ".corrupt.1": "{second", ".corrupt.2": "{third"} {
		if b, err := os.ReadFile(p + name); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p+name, b, err, want)
		}
	}
}

// MoveAside replaces nothing, whatever the kinds: not an empty directory,
// not a dangling symlink; it takes the name one past the highest taken,
// whatever the gaps, so the numbers say the order.
func TestMoveAsideNeverReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.json")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p+".corrupt", 0o755); err != nil { // rename(2) would replace it
		t.Fatal(err)
	}
	if got, err := MoveAside(p); err != nil || got.To != p+".corrupt.1" || len(got.Removed) != 0 {
		t.Errorf("MoveAside(dir) = %+v, %v; want %s", got, err, p+".corrupt.1")
	}

	if err := os.WriteFile(p, []byte("file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", p+".corrupt.2"); err != nil {
		t.Fatal(err)
	}
	os.Remove(p + ".corrupt.1") // a gap: not taken again, the order kept
	if got, err := MoveAside(p); err != nil || got.To != p+".corrupt.3" {
		t.Errorf("MoveAside(file) = %+v, %v; want %s", got, err, p+".corrupt.3")
	}
	if b, err := os.ReadFile(p + ".corrupt.3"); err != nil || string(b) != "file" {
		t.Errorf("moved file = %q, %v", b, err)
	}
	if fi, err := os.Lstat(p + ".corrupt"); err != nil || !fi.IsDir() {
		t.Errorf("%s.corrupt replaced: %v, %v", p, fi, err)
	}
	if l, err := os.Readlink(p + ".corrupt.2"); err != nil || l != "nowhere" {
		t.Errorf("%s.corrupt.2 replaced: %q, %v", p, l, err)
	}
	// Names not of its form are not counted: not .corrupt.04, not .corrupt.x.
	for _, n := range []string{".corrupt.04", ".corrupt.x", ".corrupt.-7"} {
		if err := os.WriteFile(p+n, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(p, []byte("again"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := MoveAside(p); err != nil || got.To != p+".corrupt.4" {
		t.Errorf("MoveAside = %+v, %v; want %s", got, err, p+".corrupt.4")
	}
}

// A state file found corrupt at every start (a bad disk, a crash loop):
// what is moved aside stays bounded, the newest KeepAside kept with their
// contents, each start removing the oldest, and nothing else in the
// directory touched. A directory moved aside that is not empty cannot be
// removed: it is kept, the result says why, and the next oldest goes.
func TestCorruptStateAtEveryStartKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	other := filepath.Join(dir, "tamper.json.corrupt")
	if err := os.WriteFile(other, []byte("not ours"), 0o644); err != nil {
		t.Fatal(err)
	}
	const starts = 200
	for i := 0; i < starts; i++ {
		if err := os.WriteFile(p, []byte("{start "+strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := NewStore("b").Load(dir)
		want := p + ".corrupt"
		if i > 0 {
			want += "." + strconv.Itoa(i)
		}
		if err != nil || res.Corrupt == nil || res.CorruptPath != want {
			t.Fatalf("start %d: Load = %+v, %v; want moved aside to %s", i, res, err, want)
		}
		if wantRemoved := max(0, i+1-KeepAside); len(res.AsideRemoved) != min(1, wantRemoved) || res.AsideRemoveErr != nil {
			t.Fatalf("start %d: removed %q, %v; want %d, the oldest", i, res.AsideRemoved, res.AsideRemoveErr, min(1, wantRemoved))
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	var want []string
	for i := starts - KeepAside; i < starts; i++ {
		want = append(want, StateFileName+".corrupt."+strconv.Itoa(i))
	}
	want = append(want, "tamper.json.corrupt")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("after %d corrupt starts the directory holds %q; want %q", starts, got, want)
	}
	for i := starts - KeepAside; i < starts; i++ {
		if b, err := os.ReadFile(p + ".corrupt." + strconv.Itoa(i)); err != nil || string(b) != "{start "+strconv.Itoa(i) {
			t.Errorf("%s.corrupt.%d = %q, %v", p, i, b, err)
		}
	}

	// An older build's leftovers, .corrupt to .corrupt.999: the next start
	// keeps KeepAside in all, its own and the newest of them, and the
	// directory among them it cannot remove.
	dir = t.TempDir()
	p = filepath.Join(dir, StateFileName)
	for i := 0; i < 1000; i++ {
		if err := os.WriteFile(asideName(p, i), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(asideName(p, 3)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(asideName(p, 3), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(asideName(p, 3), "inside"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := NewStore("b").Load(dir)
	if err != nil || res.CorruptPath != p+".corrupt.1000" || len(res.AsideRemoved) != 996 || res.AsideRemoveErr == nil {
		t.Fatalf("Load over 1,000 left = to %s, removed %d, %v, %v; want to .corrupt.1000, 996 removed and one error",
			res.CorruptPath, len(res.AsideRemoved), res.AsideRemoveErr, err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != KeepAside {
		t.Errorf("%d entries left, %v; want %d", len(ents), err, KeepAside)
	}
	if fi, err := os.Lstat(asideName(p, 3)); err != nil || !fi.IsDir() {
		t.Errorf("the directory moved aside: %v, %v; want it kept", fi, err)
	}
}

// A crash between a save's temp file and its rename leaves the temp file:
// Load removes the state file's own (state.json.tmp<digits>, regular
// files) and nothing else: not a symlink of that name (nor what it points
// to), not a directory, not other files' temps or names that merely start
// alike.
func TestLoadRemovesTempFilesLeftByACrash(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(outside, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	s0 := NewStore("b")
	s0.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	if err := s0.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	leftovers := []string{StateFileName + ".tmp1780316546", StateFileName + ".tmp3923618647"}
	kept := []string{StateFileName + ".tmp", StateFileName + ".tmp12x", StateFileName + ".corrupt",
		"tamper.json.tmp1780316546", "other.json.tmp42", "x" + StateFileName + ".tmp7"}
	for _, n := range append(leftovers, kept...) {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("{half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := StateFileName + ".tmp55"
	if err := os.Symlink(outside, filepath.Join(dir, link)); err != nil {
		t.Fatal(err)
	}
	sub := StateFileName + ".tmp66"
	if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, link, sub, StateFileName)

	s := NewStore("b")
	res, err := s.Load(dir)
	if err != nil || res.TempsRemoved != len(leftovers) || res.TempsErr != nil || res.Restored != 1 {
		t.Errorf("Load = %+v, %v; want %d temp files removed and the state restored", res, err, len(leftovers))
	}
	for _, n := range leftovers {
		if _, err := os.Lstat(filepath.Join(dir, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left in place: %v", n, err)
		}
	}
	for _, n := range kept {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s removed: %v", n, err)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the symlink's target removed: %v", err)
	}
	// Without a state file too (the crash came before the first rename).
	os.Remove(filepath.Join(dir, StateFileName))
	os.WriteFile(filepath.Join(dir, leftovers[0]), nil, 0o644)
	if res, err := NewStore("b").Load(dir); err != nil || res.TempsRemoved != 1 {
		t.Errorf("Load without a state file = %+v, %v; want 1 temp file removed", res, err)
	}
}
