package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"golang.org/x/sys/unix"
)

// fakeJournalctl is a journalctl stand-in: a shell script that records its
// arguments for call n in args.<n>, prints out.<n>, and, when err.<n>
// exists, prints it to stderr and exits 1.
type fakeJournalctl struct {
	dir string
}

func newFakeJournalctl(t *testing.T) *fakeJournalctl {
	t.Helper()
	testenv.StartsProcesses(t)
	f := &fakeJournalctl{dir: t.TempDir()}
	script := fmt.Sprintf(`#!/bin/sh
d=%q
n=$(cat "$d/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$d/count"
printf '%%s\n' "$@" > "$d/args.$n"
[ -f "$d/out.$n" ] && cat "$d/out.$n"
if [ -f "$d/err.$n" ]; then cat "$d/err.$n" >&2; exit 1; fi
exit 0
`, f.dir)
	if err := os.WriteFile(f.path(), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeJournalctl) path() string { return filepath.Join(f.dir, "journalctl") }

// serve sets what call n prints: the given lines of the captured fixture
// (1-based), then extra lines.
func (f *fakeJournalctl) serve(t *testing.T, n int, fixtureLines []int, extra ...string) {
	t.Helper()
	lines := journalFixture(t)
	var out []string
	for _, i := range fixtureLines {
		out = append(out, lines[i-1])
	}
	out = append(out, extra...)
	text := strings.Join(out, "\n")
	if text != "" {
		text += "\n"
	}
	if err := os.WriteFile(filepath.Join(f.dir, fmt.Sprintf("out.%d", n)), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeJournalctl) fail(t *testing.T, n int, stderr string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, fmt.Sprintf("err.%d", n)), []byte(stderr), 0o644); err != nil {
		t.Fatal(err)
	}
}

// args returns the arguments of call n.
func (f *fakeJournalctl) args(t *testing.T, n int) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("args.%d", n)))
	if err != nil {
		t.Fatalf("journalctl call %d: %v", n, err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// journalRoot is a host root with a journal file, as journald leaves it.
func journalRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	d := filepath.Join(root, "run/log/journal/73bee9439449423da2f8c4806e805444")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "system.journal"), nil, 0o640); err != nil {
		t.Fatal(err)
	}
	return root
}

func heartbeatEnv(t *testing.T, root string, fj *fakeJournalctl, now *time.Time) *Env {
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		c.Checks.KubeletHeartbeatFailed.Journalctl = fj.path()
	})
	env.Now = func() time.Time { return *now }
	return env
}

func probeHeartbeat(t *testing.T, c Check, wantStatus report.Status, wantReason report.Reason, wantMsg string) {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != wantStatus || r.Reason != wantReason || r.Message != wantMsg {
		t.Errorf("got %s/%s %q (err %v)\nwant %s/%s %q", r.Status, r.Reason, r.Message, err, wantStatus, wantReason, wantMsg)
	}
}

func probeHeartbeatErr(t *testing.T, c Check, wantErr string) {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err == nil || err.Error() != wantErr {
		t.Errorf("got %s/%s %q, error %v\nwant error %q", r.Status, r.Reason, r.Message, err, wantErr)
	}
}

// Times in the fixture: lines 1-4 at 19:06:46.913451, line 5 at .914011,
// lines 6-9 at 19:07:17.9..., line 10 at 19:07:27.647904 (2026-12-02 UTC).
var (
	hbLast   = time.UnixMicro(1796238447647904).UTC() // line 10
	cursor5  = "s=3a7de8ba767941d7802f48f8d5767386;i=8;b=0e8831569cd045b0a40199f64b37fa93;m=23b02d1f1;t=661ab582d0fdb;x=c780f19bda1fc0a0"
	cursor10 = "s=3a7de8ba767941d7802f48f8d5767386;i=d;b=0e8831569cd045b0a40199f64b37fa93;m=23d705eb6;t=661ab5a9a9ca0;x=1ff0d707ec92fc66"
)

const hbKlog10 = `E1202 19:00:04.000000       1 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`

func wantArgs(t *testing.T, got []string, root, from string) {
	t.Helper()
	want := []string{"--no-pager", "--quiet", "--output=json", "--output-fields=MESSAGE", "--root=" + root, from, "_SYSTEMD_UNIT=kubelet.service"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("journalctl %q\nwant %q", got, want)
	}
}

// The captured journal: kubelet gave up (six entries of three forms); True
// while the last one is within the window, False once a whole window has
// passed; each run continues after the last cursor.
func TestKubeletHeartbeatCapturedJournal(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(time.Minute)
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)

	fj.serve(t, 1, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:27Z (within the last 5m; 6 such entries since the last run): "+hbKlog10)
	// The first run reads the last window.
	wantArgs(t, fj.args(t, 1), root, fmt.Sprintf("--since=@%d", now.Add(-5*time.Minute).Unix()))

	// Nothing new; 4 minutes after the last one it is still within the window.
	now = hbLast.Add(4 * time.Minute)
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:27Z (within the last 5m; 0 such entries since the last run): "+hbKlog10)
	wantArgs(t, fj.args(t, 2), root, "--after-cursor="+cursor10)

	// A whole window without one: False, with the time of the last one.
	now = hbLast.Add(5*time.Minute + time.Second)
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (0 entries read); the last one at 2026-12-02T19:07:27Z`)
	wantArgs(t, fj.args(t, 3), root, "--after-cursor="+cursor10)
}

// Kubelet's own failed tries ("Error updating node status, will retry"), a
// non-UTF-8 entry and a null MESSAGE are not a give-up.
func TestKubeletHeartbeatQuietJournal(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2, 4, 5})
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (4 entries read); none since 2026-12-02T19:02:27Z`)
	// An empty read (a unit that logged nothing) keeps the cursor.
	now = hbLast.Add(5 * time.Minute)
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (0 entries read); none since 2026-12-02T19:02:27Z`)
	wantArgs(t, fj.args(t, 2), root, "--after-cursor="+cursor5)
}

// The match strings are configuration.
func TestKubeletHeartbeatMatchIsConfigurable(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(30 * time.Second)
	env := heartbeatEnv(t, root, fj, &now)
	env.Config.Checks.KubeletHeartbeatFailed.Match = []string{"Error updating node status"}
	env.Config.Checks.KubeletHeartbeatFailed.Interval = config.Duration{Duration: time.Minute}
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2, 3})
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Error updating node status" in the last 1m (3 entries read); the last one at 2026-12-02T19:06:46Z`)
}

// The journal cannot be read: Unknown (an error), never a clean window.
func TestKubeletHeartbeatJournalUnreadable(t *testing.T) {
	now := hbLast
	t.Run("no journal files", func(t *testing.T) {
		fj := newFakeJournalctl(t)
		c, _ := newKubeletHeartbeatCheck(heartbeatEnv(t, t.TempDir(), fj, &now))
		probeHeartbeatErr(t, c, "no journal files in /run/log/journal or /var/log/journal: is systemd-journald running?")
	})
	t.Run("no journalctl", func(t *testing.T) {
		fj := newFakeJournalctl(t)
		env := heartbeatEnv(t, journalRoot(t), fj, &now)
		env.Config.Checks.KubeletHeartbeatFailed.Journalctl = "/nonexistent/journalctl"
		c, _ := newKubeletHeartbeatCheck(env)
		probeHeartbeatErr(t, c, "fork/exec /nonexistent/journalctl: no such file or directory")
	})
	t.Run("only garbage", func(t *testing.T) {
		fj := newFakeJournalctl(t)
		c, _ := newKubeletHeartbeatCheck(heartbeatEnv(t, journalRoot(t), fj, &now))
		fj.serve(t, 1, nil, "-- No entries --", `{"MESSAGE":"x"}`)
		probeHeartbeatErr(t, c, `journalctl printed 2 lines that are not journal entries (first: "-- No entries --": not a journal entry: invalid character '-' in numeric literal)`)
	})
	t.Run("some garbage", func(t *testing.T) {
		fj := newFakeJournalctl(t)
		c, _ := newKubeletHeartbeatCheck(heartbeatEnv(t, journalRoot(t), fj, &now))
		fj.serve(t, 1, []int{1}, `{"__CURSOR":"s=1"`)
		probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
			`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (1 entry read); none since 2026-12-02T19:02:27Z; skipped 1 line of journalctl output that is not a journal entry (first: "{\"__CURSOR\":\"s=1\"": not a journal entry: unexpected end of JSON input)`)
	})
}

// A journal the reader may not list (`autopilot-health check` without sudo:
// journald's machine directory is root:systemd-journal, mode 2750) is no
// missing journal: the error says it cannot be read and why, not "is
// systemd-journald running?", which sent an operator to a journald that ran.
func TestKubeletHeartbeatJournalNotReadableByTheUser(t *testing.T) {
	now := hbLast
	root := journalRoot(t)
	// The host root and its parent searchable by all (a test's temporary
	// directories are 0700): only the machine directory's mode is met.
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	machine := filepath.Join(root, "run/log/journal/73bee9439449423da2f8c4806e805444")
	if err := os.Chmod(machine, 0o750); err != nil {
		t.Fatal(err)
	}
	fj := newFakeJournalctl(t)
	c, _ := newKubeletHeartbeatCheck(heartbeatEnv(t, root, fj, &now))
	// Unprivileged reads as nobody through setfsuid: the process stays
	// root, the reader is not.
	defer func(f func() int) { journalReaderUID = f }(journalReaderUID)
	journalReaderUID = func() int { return 65534 }
	var err error
	testenv.Unprivileged(t, func() { _, err = c.Probe(context.Background()) })
	want := "cannot read the journal: /run/log/journal/73bee9439449423da2f8c4806e805444: permission denied (run it as root, or as a member of the systemd-journal group)"
	if err == nil || err.Error() != want {
		t.Errorf("error %v\nwant %q", err, want)
	}
	// Readable by the user: its files are found, as root finds them.
	if err := os.Chmod(machine, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.Unprivileged(t, func() { err = c.(*kubeletHeartbeatCheck).journalPresent() })
	if err != nil {
		t.Errorf("a journal the user may read: %v", err)
	}
}

// The daemon runs as root under its unit with no capability at all
// (CapabilityBoundingSet= empty): a journal directory root does not own and
// may not list (its mode, an ACL; or SELinux or AppArmor, which refuse root
// with every capability too) refuses it. "run it as root" sent the operator
// of a daemon that is root nowhere; the error says that root was refused
// and what may refuse it.
func TestKubeletHeartbeatJournalNotReadableByRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skip(t, "needs root: the reader is root without the capabilities that override a directory's permissions")
	}
	now := hbLast
	root := journalRoot(t)
	machine := filepath.Join(root, "run/log/journal/73bee9439449423da2f8c4806e805444")
	if err := os.Chown(machine, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(machine, 0o700); err != nil {
		t.Fatal(err)
	}
	fj := newFakeJournalctl(t)
	c, _ := newKubeletHeartbeatCheck(heartbeatEnv(t, root, fj, &now))
	err := rootWithoutCapabilities(t, c.(*kubeletHeartbeatCheck).journalPresent)
	want := "cannot read the journal: /run/log/journal/73bee9439449423da2f8c4806e805444: permission denied to root " +
		"(the daemon's unit gives it no capability to pass over a directory's owner, mode or ACL; or SELinux or AppArmor refuses it)"
	if err == nil || err.Error() != want {
		t.Errorf("error %v\nwant %q", err, want)
	}
}

// rootWithoutCapabilities runs fn on a thread of its own that is root with
// no capability, as the daemon under its unit is, and returns its error.
func rootWithoutCapabilities(t *testing.T, fn func() error) error {
	t.Helper()
	type result struct{ err, setup error }
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- result{setup: fmt.Errorf("capset: %w", err)}
			return
		}
		done <- result{err: fn()}
	}()
	r := <-done
	if r.setup != nil {
		t.Fatal(r.setup)
	}
	return r.err
}

// journalctl refuses a cursor it cannot seek to: Unknown with its words, and
// the next run reads from the last successful run's time instead.
func TestKubeletHeartbeatBadCursor(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2})
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (2 entries read); none since 2026-12-02T19:02:27Z`)
	read1 := now

	now = hbLast.Add(5 * time.Minute)
	fj.fail(t, 2, "Failed to seek to cursor: Invalid argument\n")
	cur := "s=3a7de8ba767941d7802f48f8d5767386;i=5;b=0e8831569cd045b0a40199f64b37fa93;m=23b02cfc1;t=661ab582d0dab;x=7c28430aa71f07fd"
	probeHeartbeatErr(t, c, "journalctl --no-pager --quiet --output=json --output-fields=MESSAGE --root="+root+
		" --after-cursor=<last cursor read> _SYSTEMD_UNIT=kubelet.service: exit status 1: Failed to seek to cursor: Invalid argument")
	wantArgs(t, fj.args(t, 2), root, "--after-cursor="+cur)

	// Twenty minutes later: from the last good read, not only the last
	// window; the give-up first read now was within the window of the last
	// good read, which did not report it: True now, not lost.
	now = hbLast.Add(20 * time.Minute)
	fj.serve(t, 3, []int{6})
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		`kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:17Z (first read in this run, within 5m of the last read at 2026-12-02T19:07:27Z; 1 such entries): E1202 19:00:01.000000    74 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`)
	wantArgs(t, fj.args(t, 3), root, fmt.Sprintf("--since=@%d", read1.Unix()))
}

// journalctl fails the same way at every run (the sandbox denies the
// journal), with no cursor to go on from, so each run asks --since a time of
// its own: the failure is logged once and the condition (CheckFailed) keeps
// its message. Before, the error named --since=@<now-5m>, so each run's was
// new: a warning every run and a new message, a Node status write, every 5
// minutes.
func TestKubeletHeartbeatSameFailureLoggedOnce(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast
	env := heartbeatEnv(t, root, fj, &now)
	var logs testenv.SyncBuffer
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Only: []string{"KubeletHeartbeatFailed"}})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for i := 1; i <= 3; i++ {
		fj.fail(t, i, "Failed to open journal: Permission denied\n")
		conds := r.RunOnce(t.Context())
		if len(conds) != 1 || conds[0].Reason != report.ReasonCheckFailed {
			t.Fatalf("run %d: %+v", i, conds)
		}
		msgs = append(msgs, conds[0].Message)
		wantArgs(t, fj.args(t, i), root, fmt.Sprintf("--since=@%d", now.Add(-5*time.Minute).Unix()))
		now = now.Add(5 * time.Minute)
	}
	want := "journalctl --no-pager --quiet --output=json --output-fields=MESSAGE --root=" + root +
		" --since=<start of the read> _SYSTEMD_UNIT=kubelet.service: exit status 1: Failed to open journal: Permission denied"
	for i, m := range msgs {
		if m != want {
			t.Errorf("run %d: message %q\nwant %q", i+1, m, want)
		}
	}
	if n := strings.Count(logs.String(), "check failed"); n != 1 {
		t.Errorf("%d 'check failed' lines for 3 runs failing the same way, want 1:\n%s", n, logs.String())
	}
}

// max_entries bounds a run: one that read that many without a match is
// Unknown, and the next run goes on from there.
func TestKubeletHeartbeatMaxEntries(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast
	env := heartbeatEnv(t, root, fj, &now)
	env.Config.Checks.KubeletHeartbeatFailed.MaxEntries = 3
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2, 4, 5, 6})
	probeHeartbeatErr(t, c, "kubelet.service logged more than max_entries (3) entries since the last run: read the first ones, the rest on the next run")
	cur4 := "s=3a7de8ba767941d7802f48f8d5767386;i=7;b=0e8831569cd045b0a40199f64b37fa93;m=23b02cfc1;t=661ab582d0dab;x=a1f1fa17e241bba1"
	fj.serve(t, 2, []int{5, 6})
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		`kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:17Z (within the last 5m; 1 such entries since the last run): E1202 19:00:01.000000    74 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`)
	wantArgs(t, fj.args(t, 2), root, "--after-cursor="+cur4)

	// A match within the bound is True even when the bound is reached.
	fj.serve(t, 3, []int{7, 8, 9, 10})
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		`kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:17Z (within the last 5m; 3 such entries since the last run): first of two\x0aE1202 19:00:03.000000    1 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`)
}

// A daemon restart within the boot continues after the saved cursor and
// remembers the last give-up; a new boot starts over with the last window.
func TestKubeletHeartbeatStateSurvivesRestartWithinBoot(t *testing.T) {
	root := journalRoot(t)
	state := t.TempDir()
	fj := newFakeJournalctl(t)
	now := hbLast.Add(time.Minute)

	s1 := report.NewStore("boot-1")
	env := heartbeatEnv(t, root, fj, &now)
	env.Memos = s1
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusTrue {
		t.Fatalf("first daemon: %+v %v", r, err)
	}
	select {
	case <-s1.Dirty():
	default:
		t.Error("a read that moved the cursor did not mark the state dirty")
	}
	if err := s1.Save(state, now); err != nil {
		t.Fatal(err)
	}

	// Second daemon, same boot, ten minutes later.
	now = hbLast.Add(10 * time.Minute)
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	env2 := heartbeatEnv(t, root, fj, &now)
	env2.Memos = s2
	c2, _ := newKubeletHeartbeatCheck(env2)
	fj.serve(t, 2, nil)
	probeHeartbeat(t, c2, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (0 entries read); the last one at 2026-12-02T19:07:27Z`)
	wantArgs(t, fj.args(t, 2), root, "--after-cursor="+cursor10)

	// A new boot: the saved cursor belongs to the old one.
	if err := s2.Save(state, now); err != nil {
		t.Fatal(err)
	}
	s3 := report.NewStore("boot-2")
	if _, err := s3.Load(state); err != nil {
		t.Fatal(err)
	}
	env3 := heartbeatEnv(t, root, fj, &now)
	env3.Memos = s3
	c3, _ := newKubeletHeartbeatCheck(env3)
	// Not one entry of the unit in the new boot yet: no data, not a clean
	// window (a wrong unit name would otherwise look healthy forever).
	fj.serve(t, 3, nil)
	probeHeartbeat(t, c3, report.StatusUnknown, report.ReasonNoData,
		`no journal entries of kubelet.service since 2026-12-02T19:12:27Z: is that kubelet's unit, and does it log to the journal?`)
	wantArgs(t, fj.args(t, 3), root, fmt.Sprintf("--since=@%d", now.Add(-5*time.Minute).Unix()))
}

// The host's own journal (host_root "/") is read without --root.
func TestKubeletHeartbeatHostJournalHasNoRoot(t *testing.T) {
	now := hbLast
	for _, root := range []string{"/", ""} {
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		c, _ := newKubeletHeartbeatCheck(env)
		var st kubeletHeartbeatState
		q := c.(*kubeletHeartbeatCheck).query(&st, now)
		if got := strings.Join(q.args(), " "); got != "--no-pager --quiet --output=json --output-fields=MESSAGE --since=@1796238147 _SYSTEMD_UNIT=kubelet.service" {
			t.Errorf("host_root %q: args %s", root, got)
		}
		if q.Journalctl != "/usr/bin/journalctl" {
			t.Errorf("journalctl %s", q.Journalctl)
		}
	}
}

// A journalctl that hangs is given up at the check's deadline (the runner's
// context), with the context's error.
func TestKubeletHeartbeatHonoursContext(t *testing.T) {
	root := journalRoot(t)
	hang := filepath.Join(t.TempDir(), "journalctl")
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	now := hbLast
	env := heartbeatEnv(t, root, newFakeJournalctl(t), &now)
	env.Config.Checks.KubeletHeartbeatFailed.Journalctl = hang
	c, _ := newKubeletHeartbeatCheck(env)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if r, err := c.Probe(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %+v, error %v; want the context's deadline", r, err)
	}
}

// A re-plan builds the check again within the run: the new one continues
// after the cursor of the one it replaces.
func TestKubeletHeartbeatSurvivesReplan(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(time.Minute)
	s := report.NewStore("boot-1")
	if _, err := s.Load(t.TempDir()); err != nil { // no state file yet
		t.Fatal(err)
	}
	env := heartbeatEnv(t, root, fj, &now)
	env.Memos = s
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusTrue {
		t.Fatalf("first check: %+v %v", r, err)
	}
	env2 := *env // as the re-plan copies it
	c2, _ := newKubeletHeartbeatCheck(&env2)
	now = hbLast.Add(6 * time.Minute)
	probeHeartbeat(t, c2, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (0 entries read); the last one at 2026-12-02T19:07:27Z`)
	wantArgs(t, fj.args(t, 2), root, "--after-cursor="+cursor10)
}

// A give-up logged just after a run, first read by the next run more than a
// window later (runs are an interval apart plus their own time), is True:
// not lost. An old one first read long after is not.
func TestKubeletHeartbeatGiveUpBetweenRunsIsNotLost(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(-time.Millisecond) // just before entry 10, the give-up
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2})
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (2 entries read); none since 2026-12-02T19:02:27Z`)
	now = hbLast.Add(5*time.Minute + 2*time.Millisecond)
	fj.serve(t, 2, []int{10})
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		`kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:27Z (first read in this run, within 5m of the last read at 2026-12-02T19:07:27Z; 1 such entries): E1202 19:00:04.000000       1 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`)
	// The next run, nothing new: the give-up is out of the window.
	now = now.Add(5 * time.Minute)
	fj.serve(t, 3, nil)
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (0 entries read); the last one at 2026-12-02T19:07:27Z`)
}

// A give-up stamped in the future (the clock stepped back) is not True for
// as long as the clock takes to catch up.
func TestKubeletHeartbeatFutureEntry(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(-time.Hour)
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 10})
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (2 entries read); the last one at 2026-12-02T19:07:27Z`)
}

// hbGiveUp is a journal entry of kubelet giving up, logged at at, with a
// cursor of its own (seq).
func hbGiveUp(seq int, at time.Time) string {
	return fmt.Sprintf(`{"__CURSOR":"s=3a7de8ba767941d7802f48f8d5767386;i=%x;b=0e8831569cd045b0a40199f64b37fa93","_BOOT_ID":"0e8831569cd045b0a40199f64b37fa93","MESSAGE":%q,"__REALTIME_TIMESTAMP":"%d","__MONOTONIC_TIMESTAMP":"%d"}`,
		seq, hbKlog10, at.UnixMicro(), 9620709046+seq)
}

// A give-up logged after the clock was set back (chrony's makestep after a
// boot whose RTC ran ahead) is the last one, though its time is before the
// one logged before the step: the condition says when kubelet last gave up,
// and stays True for a window after it. Before, the give-up with the later
// time stayed the last: the message named a time an hour ahead, and the
// condition went False a run later, a minute and a half after kubelet gave
// up.
func TestKubeletHeartbeatGiveUpAfterTheClockWasSetBack(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	ahead := hbLast.Add(time.Hour) // the clock an hour ahead
	now := ahead
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, nil, hbGiveUp(1, ahead.Add(-10*time.Second)))
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T20:07:17Z (within the last 5m; 1 such entries since the last run): "+hbKlog10)

	// The clock is set back the hour; kubelet gives up again.
	now = hbLast.Add(time.Minute)
	fj.serve(t, 2, nil, hbGiveUp(2, hbLast.Add(30*time.Second)))
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:57Z (within the last 5m; 1 such entries since the last run): "+hbKlog10)

	// The next run, nothing new: that give-up is still within the window.
	now = hbLast.Add(2 * time.Minute)
	fj.serve(t, 3, nil)
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:57Z (within the last 5m; 0 such entries since the last run): "+hbKlog10)
}

// hbEntryOfBoot is a journal entry of kubelet logged at at in the boot
// bootID (journald's form, without dashes), with a cursor of its own (seq).
func hbEntryOfBoot(seq int, bootID, msg string, at time.Time) string {
	return fmt.Sprintf(`{"__CURSOR":"s=3a7de8ba767941d7802f48f8d5767386;i=%x;b=%s","_BOOT_ID":"%s","MESSAGE":%q,"__REALTIME_TIMESTAMP":"%d","__MONOTONIC_TIMESTAMP":"%d"}`,
		seq, bootID, bootID, msg, at.UnixMicro(), 1000000+seq)
}

// A node rebooted a minute after kubelet gave up (the API server out of
// reach, the node rebooted to fix it): the first run of the new boot reads
// the last window, which the persistent journal fills with the boot
// before's entries too. Kubelet's give-ups of that boot are not this
// kubelet's: the condition is not True for the new boot's first interval.
// Before, it was, naming a give-up logged before the reboot.
func TestKubeletHeartbeatGiveUpOfTheBootBeforeIsNotThisBoots(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(2 * time.Minute) // the fixture's boot, 0e88..., ended a minute after its last give-up
	env := heartbeatEnv(t, root, fj, &now)
	env.BootID = "5C1A9E2B-7D4F-4E8A-9B3C-2F6D8E0A1B4C" // as /proc/sys/kernel/random/boot_id writes it, less the case
	const thisBoot = "5c1a9e2b7d4f4e8a9b3c2f6d8e0a1b4c"
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
		hbEntryOfBoot(1, thisBoot, `I1202 19:09:20.000000    71 server.go:487] "Kubelet version" kubeletVersion="v1.31.0"`, hbLast.Add(110*time.Second)))
	probeHeartbeat(t, c, report.StatusFalse, report.ReasonKubeletHeartbeatOK,
		`kubelet.service logged no entry with "Unable to update node status" and "update node status exceeds retry count" in the last 5m (11 entries read); none since 2026-12-02T19:04:27Z`)

	// This boot's kubelet gives up: True.
	now = now.Add(5 * time.Minute)
	fj.serve(t, 2, nil, hbEntryOfBoot(2, thisBoot, hbKlog10, now.Add(-time.Minute)))
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:13:27Z (within the last 5m; 1 such entries since the last run): "+hbKlog10)
}

// The give-up's MESSAGE is kubelet's text: published in the condition's
// message, a control character in it is written \xNN (a newline would
// forge a line, an escape sequence reach a terminal through kubectl).
func TestKubeletHeartbeatMessageIsPrintable(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(time.Minute)
	env := heartbeatEnv(t, root, fj, &now)
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Only: []string{"KubeletHeartbeatFailed"}})
	if err != nil {
		t.Fatal(err)
	}
	fj.serve(t, 1, nil, `{"__CURSOR":"s=1;i=1","MESSAGE":"E1202 19:07:27.000000       1 kubelet_node_status.go:536] \"Unable to update node status\" err=\"update node status exceeds retry count\u001b[2J\nI1202 forged\"","__REALTIME_TIMESTAMP":"1796238447647904"}`)
	conds := r.RunOnce(t.Context())
	want := `kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:27Z (within the last 5m; 1 such entries since the last run): ` +
		`E1202 19:07:27.000000       1 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count\x1b[2J\x0aI1202 forged"`
	if len(conds) != 1 || conds[0].Reason != report.ReasonNodeStatusUpdateGaveUp || conds[0].Message != want {
		t.Errorf("got %+v\nwant the message %q", conds, want)
	}
}

// A give-up whose MESSAGE is not UTF-8 (journalctl writes it as an array
// of bytes) names its bad bytes \xNN, as every message does, not as U+FFFD;
// a MESSAGE shortened to 300 bytes is not cut inside a \xNN.
func TestKubeletHeartbeatMessageNotUTF8(t *testing.T) {
	root := journalRoot(t)
	fj := newFakeJournalctl(t)
	now := hbLast.Add(time.Minute)
	env := heartbeatEnv(t, root, fj, &now)
	c, _ := newKubeletHeartbeatCheck(env)
	fj.serve(t, 1, nil, `{"__CURSOR":"s=1;i=1","MESSAGE":[69,49,50,48,50,32,49,57,58,48,55,58,50,55,46,48,48,48,48,48,48,32,32,32,32,32,32,32,49,32,107,117,98,101,108,101,116,95,110,111,100,101,95,115,116,97,116,117,115,46,103,111,58,53,51,54,93,32,34,85,110,97,98,108,101,32,116,111,32,117,112,100,97,116,101,32,110,111,100,101,32,115,116,97,116,117,115,34,32,101,114,114,61,34,117,112,100,97,116,101,32,110,111,100,101,32,115,116,97,116,117,115,32,101,120,99,101,101,100,115,32,114,101,116,114,121,32,99,111,117,110,116,32,255,254,34],"__REALTIME_TIMESTAMP":"1796238447647904"}`)
	probeHeartbeat(t, c, report.StatusTrue, report.ReasonNodeStatusUpdateGaveUp,
		"kubelet gave up updating the node status: kubelet.service logged at 2026-12-02T19:07:27Z (within the last 5m; 1 such entries since the last run): "+
			`E1202 19:07:27.000000       1 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count \xff\xfe"`)
	if got := shorten(strings.Repeat("x", 298)+"\x1b[2J", 300); got != strings.Repeat("x", 298)+"..." {
		t.Errorf("shorten cut to %q", got[290:])
	}
}
