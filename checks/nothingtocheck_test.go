package checks

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/syself/autopilot-health/report"
)

// What a probe collected reaches the health report even when it could not
// decide: a certificate that is not present is listed in the certs domain
// while CertRenewalFailing is Unknown (NothingToCheck), and a check that
// fails with details (no drive readable) reports them too. A run that found
// nothing to check counts as ok, not as an error.
func TestRunnerKeepsDetailsOfUndecidedRuns(t *testing.T) {
	for _, tc := range []struct {
		name       string
		res        Result
		err        error
		wantResult string
	}{
		{"nothing to check", Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: "none present"}, nil, report.ResultOK},
		{"no data", Result{Status: report.StatusUnknown, Reason: report.ReasonNoData, Message: "not yet"}, nil, report.ResultError},
		{"error", Result{}, errors.New("no NVMe drive readable"), report.ResultError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(t, nil)
			store := report.NewStore("b")
			det := report.NewDetails()
			m := report.NewMetrics("test")
			tc.res.Details = []report.Detail{{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem", Error: "not present"}}}}
			r, err := NewRunner(env, Options{Store: store, Details: det, Metrics: m, Only: []string{"CertRenewalFailing"},
				Factories: map[string]Factory{"CertRenewalFailing": fixed(probeFunc(func(context.Context) (Result, error) { return tc.res, tc.err }))}})
			if err != nil {
				t.Fatal(err)
			}
			r.RunOnce(context.Background())
			docs, err := det.Documents(env.Now(), report.RoleWorker)
			if err != nil {
				t.Fatal(err)
			}
			if d := docs[report.AnnotationPrefix+"certs"]; !strings.Contains(d, `"error":"not present"`) {
				t.Errorf("certs document: %s", d)
			}
			body := scrapeRegistry(t, m)
			if want := `autopilot_health_check_runs_total{check="CertRenewalFailing",result="` + tc.wantResult + `"} 1`; !strings.Contains(body, want) {
				t.Errorf("metrics lack %s", want)
			}
		})
	}
}

// NodeServiceDown with no operability units for the node's role checked
// nothing: Unknown, not a fake False.
func TestNodeServiceDownWithoutUnits(t *testing.T) {
	env := testEnv(t, nil)
	env.Config.Checks.NodeServiceDown.WorkerUnits = nil
	env.Systemd = newFakeManager()
	c, _ := newNodeServiceDown(env)
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck || r.Message != "no operability units configured for role worker" {
		t.Errorf("%+v %v", r, err)
	}
}

// scrapeRegistry renders the metrics as /metrics serves them.
func scrapeRegistry(t *testing.T, m *report.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(m.Gatherer(), promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// ServiceNotRecovering when not one critical unit is installed watched
// nothing: Unknown, not a fake False.
func TestServiceNotRecoveringWithoutUnits(t *testing.T) {
	env := testEnv(t, nil)
	env.Systemd = newFakeManager()
	c, _ := newServiceNotRecovering(env)
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck ||
		r.Message != "none of the critical units is installed: kubelet.service, containerd.service, syself-proxy.service" {
		t.Errorf("%+v %v", r, err)
	}
	env.Config.Checks.ServiceNotRecovering.WorkerUnits = nil
	c, _ = newServiceNotRecovering(env)
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusUnknown || r.Message != "no critical units configured for role worker" {
		t.Errorf("%+v %v", r, err)
	}
}

// A condition whose catalog row says it is evaluated on fewer nodes than it
// is set on (Evaluated, shown in the README's Nodes column) is Unknown,
// NothingToCheck, on the others, whatever the node holds: the column says
// what is true. TunnelDisconnected on a control plane: before, the column
// said "all" and only the trigger's footnote said it was always Unknown
// there.
func TestEvaluatedScopeIsUnknownElsewhere(t *testing.T) {
	n := 0
	for _, d := range report.Conditions {
		if d.Evaluated == "" || d.Evaluated == d.Scope || d.Source != report.SourceCheck {
			continue
		}
		for _, role := range []report.Role{report.RoleWorker, report.RoleControlPlane} {
			for _, gpu := range []bool{false, true} {
				if !d.Scope.Applies(role, gpu) || d.Evaluated.Applies(role, gpu) {
					continue
				}
				n++
				env := testEnv(t, nil)
				env.Role, env.GPU = role, gpu
				c, err := NewForTest(d.Type, env)
				if err != nil {
					t.Fatal(err)
				}
				r, err := c.Probe(context.Background())
				if err != nil || r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck {
					t.Errorf("%s on a %s node (gpu %v), outside %s: %+v %v", d.Type, role, gpu, d.Evaluated, r, err)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no condition with a narrower Evaluated scope (TunnelDisconnected has one)")
	}
}
