package daemon

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// README, "Using it on a node": `journalctl -u autopilot-health` has a
// line per condition change, and `-p warning` shows the problems: a
// condition turning True is a warning, one turning False or Unknown is
// info, and a change of its detail alone (another kernel line, a new
// percentage) is debug, not a line at the default level. (Held.)
func TestConditionChangeLogPriorities(t *testing.T) {
	var buf testenv.SyncBuffer
	obs := newLogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	c := func(s report.Status, reason report.Reason, msg string) report.Condition {
		return report.Condition{Type: "DiskUsageHigh", Status: s, Reason: reason, Message: msg}
	}
	ok := c(report.StatusFalse, report.ReasonDiskUsageOK, "1 filesystem not over 90%")
	high := c(report.StatusTrue, report.ReasonFilesystemSpaceHigh, "/ 91% of space used")
	higher := c(report.StatusTrue, report.ReasonFilesystemSpaceHigh, "/ 95% of space used")
	failed := c(report.StatusUnknown, report.ReasonCheckFailed, "boom")
	obs.ConditionChanged(nil, ok)
	obs.ConditionChanged(&ok, high)
	obs.ConditionChanged(&high, higher)
	obs.ConditionChanged(&higher, ok)
	obs.ConditionChanged(&ok, failed)
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if !strings.Contains(l, `msg="condition changed"`) {
			t.Errorf("not a condition change: %s", l)
		}
		got = append(got, l[strings.Index(l, "level=")+len("level="):strings.Index(l, " msg=")])
	}
	if want := "INFO WARN DEBUG INFO INFO"; strings.Join(got, " ") != want {
		t.Errorf("levels %q, want %q:\n%s", strings.Join(got, " "), want, buf.String())
	}
}
