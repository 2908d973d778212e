package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
)

// A daemon that got its stop and is saving its state says so on the
// first line, not "ready".
func TestStatusShowsAStoppingDaemon(t *testing.T) {
	now := time.Now()
	var b bytes.Buffer
	printStatus(&b, daemon.StatusReport{Version: "v1", Node: "n1", Role: "worker", PID: 42, Started: now.Add(-time.Hour), Now: now, Ready: true, Stopping: true})
	first, _, _ := strings.Cut(b.String(), "\n")
	if !strings.HasSuffix(first, ", STOPPING (ending its loops and saving its state)") {
		t.Errorf("first line %q, want it to end with the stop", first)
	}
}
