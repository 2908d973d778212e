package daemon

import (
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

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

// README, "Using it on a node": events are logged at most one line per
// reason every 10 s (a flood of kernel lines is counted, not logged line
// by line), the next line saying how many were not. (Held.)
func TestEventLogLinesAtMostOnePerReasonEvery10s(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf testenv.SyncBuffer
		obs := newLogObserver(slog.New(slog.NewTextHandler(&buf, nil)))
		for range 5 {
			obs.EventEmitted(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sda"})
			obs.EventEmitted(report.Event{Reason: "AtaError", Message: "ata1: failed command"})
			time.Sleep(time.Second)
		}
		time.Sleep(5*time.Second - time.Nanosecond) // 9.999999999 s after the first
		obs.EventEmitted(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sda"})
		time.Sleep(time.Nanosecond) // 10 s after the first line
		obs.EventEmitted(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sdb"})
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		var got []string
		for _, l := range lines {
			got = append(got, l[strings.Index(l, "level="):])
		}
		want := []string{
			`level=WARN msg=event reason=IOError message="Buffer I/O error on dev sda"`,
			`level=WARN msg=event reason=AtaError message="ata1: failed command"`,
			`level=WARN msg=event reason=IOError message="Buffer I/O error on dev sdb" not_logged_since_last=5`,
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}
