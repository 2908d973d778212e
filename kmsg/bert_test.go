package kmsg

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// The kernel's lines about the BERT records it did not print
// (drivers/acpi/apei/bert.c, pr_fmt "BERT: "; see bert.go) are logged as a
// warning naming the count, as a fatal error of the previous boot among
// those records sets no CperHardwareErrorFatal; the lines around them are
// not. Before, both lines were read and dropped, matching no rule, and
// nothing said that records went unread.
func TestBERTRecordsNotPrintedAreSaid(t *testing.T) {
	for _, c := range []struct {
		msg   string // as the kernel prints it (Unescape's result)
		warn  bool
		count string // the records attribute, "" for none
	}{
		// 6.0+ (ACPI_BERT_PRINT_MAX_RECORDS, ACPI_BERT_PRINT_MAX_LEN): pr_info(HW_ERR "Skipped %d error records\n").
		{"BERT: [Hardware Error]: Skipped 3 error records", true, "3"},
		{"BERT: [Hardware Error]: Skipped 127 error records", true, "127"},
		// 5.17 to 5.19 (3f8dec116210): one record of two lines, no record printed.
		{"BERT: Max print length exceeded, table data is available at:\n/sys/firmware/acpi/tables/data/BERT", true, ""},
		// The kernel's other BERT lines (6.1+'s count of every record; the header before the printed ones).
		{"BERT: Total records found: 8", false, ""},
		{"BERT: Error records from previous boot:", false, ""},
		{"BERT: [Hardware Error]: Skipped error records", false, ""},
		{"BERT: [Hardware Error]: Skipped 3x error records", false, ""},
		{"mydrv: BERT: [Hardware Error]: Skipped 3 error records", false, ""},
	} {
		var out bytes.Buffer
		st := report.NewStore("b")
		o := opts(t, st)
		o.Log = slog.New(slog.NewTextHandler(&out, nil))
		mon := NewMonitor(o)
		mon.Start(t0, t0)
		mon.Handle(Record{Seq: 1, Usec: 900000, Level: 6, Message: []byte(strings.ReplaceAll(c.msg, "\n", `\x0a`))}, t0)
		got := out.String()
		said := strings.Contains(got, "level=WARN") && strings.Contains(got, "Boot Error Record Table (BERT)") && strings.Contains(got, "CperHardwareErrorFatal")
		if said != c.warn {
			t.Errorf("%q: logged %q, want a warning: %v", c.msg, got, c.warn)
			continue
		}
		if c.count != "" && !strings.Contains(got, " records="+c.count) {
			t.Errorf("%q: logged %q, want records=%s", c.msg, got, c.count)
		}
		if cond, _ := st.Get("CperHardwareErrorFatal"); cond.Status == report.StatusTrue {
			t.Errorf("%q set CperHardwareErrorFatal", c.msg)
		}
	}
}

// Reading a record that is not BERT's costs no allocation for the test.
func TestParseBERTUnprintedDoesNotAllocate(t *testing.T) {
	lines := [][]byte{[]byte("EXT4-fs (sda1): mounted filesystem"), []byte("BERT: Total records found: 8"), []byte("BERT: [Hardware Error]: Skipped 3 error records")}
	if n := testing.AllocsPerRun(100, func() {
		for _, l := range lines {
			parseBERTUnprinted(l)
		}
	}); n != 0 {
		t.Errorf("%v allocations a run", n)
	}
}
