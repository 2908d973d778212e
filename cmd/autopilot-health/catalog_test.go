package main

import (
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// catalog's events table is aligned as its conditions table is: before,
// its rows were written with raw tabs, so on a terminal the SOURCE and
// NODES columns of CperHardwareErrorRecoverable stood a tab stop right of
// TaskHung's.
func TestCatalogEventsTableIsAligned(t *testing.T) {
	code, out, errs := run(t, "catalog")
	if code != exitOK || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if strings.Contains(out, "\t") {
		t.Errorf("catalog's table holds raw tabs:\n%q", out)
	}
	_, events, ok := strings.Cut(out, "\nEVENT")
	if !ok {
		t.Fatalf("no events table:\n%s", out)
	}
	rows := strings.Split(strings.TrimRight("EVENT"+events, "\n"), "\n")
	if len(rows) != len(report.Events)+1 {
		t.Fatalf("%d rows, want a header and %d events:\n%s", len(rows), len(report.Events), out)
	}
	col := strings.Index(rows[0], "SOURCE")
	for _, r := range rows[1:] {
		name, rest, _ := strings.Cut(r, " ")
		if i := len(r) - len(strings.TrimLeft(rest, " ")); i != col || name == "" {
			t.Errorf("row %q: its source starts at column %d, the header's SOURCE at %d", r, i, col)
		}
	}
}
