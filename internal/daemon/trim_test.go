package daemon

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/internal/trim"
)

func rssFileKB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// The test binary trims its own start-up pages, as the daemon does after
// its first pass: its file-backed resident set shrinks, and it keeps
// running (this test goes on calling code that was dropped).
func TestTrimStartupPages(t *testing.T) {
	before := rssFileKB(t)
	n, err := trim.StartupPages()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFileKB(t)
	if n == 0 || after >= before {
		t.Fatalf("advised %d bytes; RssFile %d kB before, %d kB after", n, before, after)
	}
	t.Logf("advised %d bytes; RssFile %d kB -> %d kB", n, before, after)
	// Still works: a configuration, metrics, a scrape.
	_ = testConfig(t)
}

// The second trim comes a minute after the first pass, then at the next
// 10 s point of the daemon's grid: never sooner than the minute.
func TestTrimAgainAMinuteAfterTheFirstPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		start := time.Now()
		d := &Daemon{log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			firstPassDone: make(chan struct{}),
			parts:         &Parts{Grid: tick.New(start.Add(-3 * time.Second))}} // points at 7 s, 17 s, ... from start
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() { d.trimAgain(ctx); close(done) }()
		time.Sleep(5 * time.Second)
		close(d.firstPassDone) // the first pass at 5 s: a minute later is 65 s, the next point 67 s
		time.Sleep(61*time.Second + 999*time.Millisecond)
		synctest.Wait()
		if strings.Contains(logs.String(), "once more") {
			t.Fatalf("trimmed before 67 s:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
		<-done
		if !strings.Contains(logs.String(), "trimmed the pages of the binary once more") {
			t.Errorf("not trimmed at 67 s:\n%s", logs.String())
		}
		if got := time.Since(start); got != 67*time.Second {
			t.Errorf("trimmed at %s, want 67s", got)
		}
	})
}
