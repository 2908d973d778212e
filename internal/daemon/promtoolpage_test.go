package daemon

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// What `promtool check metrics` says of the daemon's page, once its first
// pass is done (the kernel log's families too): nothing but the three lints
// of the names the spec fixes, node-problem-detector's problem_counter (no
// _total) and problem_gauge; every other family's name, type, HELP and
// unit suffix passes. promtool from PATH or tests/.cache/bin, as
// internal/manifests finds it.
func TestPromtoolCheckMetricsOnThePage(t *testing.T) {
	pt, err := exec.LookPath("promtool")
	if err != nil {
		pt, _ = filepath.Abs("../../tests/.cache/bin/promtool")
		if _, err := os.Stat(pt); err != nil {
			testenv.Skip(t, "promtool not found (in PATH or tests/.cache/bin)")
		}
	}
	cfg := testConfig(t)
	cfg.Kmsg.Enabled = true
	d, url := metricsDaemon(t, cfg)
	var page []byte
	await(t, d, "the first pass done on the page", func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		page, err = io.ReadAll(resp.Body)
		return err == nil && strings.Contains(string(page), "\nautopilot_health_ready 1\n")
	})
	cmd := exec.Command(pt, "check", "metrics")
	cmd.Stdin = strings.NewReader(string(page))
	out, _ := cmd.CombinedOutput()
	var lints []string
	for l := range strings.Lines(string(out)) {
		lints = append(lints, strings.TrimSpace(l))
	}
	slices.Sort(lints)
	want := []string{
		`problem_counter counter metrics should have "_total" suffix`,
		"problem_counter metric name should not include type 'counter'",
		"problem_gauge metric name should not include type 'gauge'",
	}
	if !slices.Equal(lints, want) {
		t.Errorf("promtool check metrics:\n%s\nwant only the spec's names' lints:\n%s", out, strings.Join(want, "\n"))
	}
	for _, fam := range []string{"autopilot_health_kmsg_reader_up", "autopilot_health_check_runs_total", "problem_counter"} {
		if !strings.Contains(string(page), "# TYPE "+fam+" ") {
			t.Errorf("the page checked has no %s", fam)
		}
	}
}
