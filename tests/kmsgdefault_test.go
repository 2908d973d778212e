//go:build integration

package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The daemon under its shipped units (its helper opening /dev/kmsg) in a
// real systemd 252 as the other tests' daemonNamespace sets it up, with the
// default [kmsg]: the kernel log reader opens the log and its loop makes
// progress, on a kernel with dmesg_restrict=1 too (a node's PID 1 holds
// CAP_SYSLOG, which the helper's unit keeps). Before, daemonNamespace's
// systemd ran without CAP_SYSLOG in its bounding set, the helper's open was
// refused with EPERM, and every test of it that left kmsg on found the
// reader down and `/healthz` answering 503 "stuck loops: kmsg" 40 s in
// (TestDaemonWorksOnWhileJournaldIsStopped turned kmsg off for it).
func TestShippedUnitReadsTheKernelLog(t *testing.T) {
	const unit = "autopilot-health.service"
	metricsPort := freeTCPPort(t)
	s := daemonNamespace(t, "kmsgdefault", nil, fmt.Sprintf(goodConfig, metricsPort), unit, "autopilot-health-privileged.service")
	ctx := context.Background()
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	waitUnitFor(t, s, unit, time.Minute, "active", active)
	base := fmt.Sprintf("http://127.0.0.1:%d", metricsPort)
	// Two beats of the reader's loop after the reader opened the log: it
	// makes progress (at least every 10 s, its read timeout, on a quiet
	// log), not only at its start.
	var first float64
	t.Cleanup(func() {
		if t.Failed() {
			h, err := httpGet(base + "/healthz")
			t.Logf("/healthz: %q %v", h, err)
		}
	})
	eventually(t, 45*time.Second, "the kernel log reader up and its loop beating", func() (bool, string) {
		page, err := httpGet(base + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		up, _ := metricValue(page, "autopilot_health_kmsg_reader_up")
		beat, _ := metricValue(page, `autopilot_health_loop_last_progress_timestamp_seconds{loop="kmsg"}`)
		if up == 1 && first == 0 {
			first = beat
		}
		return up == 1 && first != 0 && beat > first, fmt.Sprintf("reader_up %v, the kmsg loop's last progress %v (first seen up at %v); /healthz and the journal follow", up, beat, first)
	})
	if j := s.Journal(unit); strings.Contains(j, "cannot open the kernel log") {
		t.Errorf("the reader could not open the kernel log:\n%s", lastBytes(j, 3000))
	}
	resp, err := httpGet(base + "/healthz")
	if err != nil || !strings.HasPrefix(resp, "ok") {
		t.Errorf("/healthz: %q %v", resp, err)
	}
}
