package checks

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

func TestProxyCheck(t *testing.T) {
	page := ""
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		fmt.Fprint(w, page)
	}))
	defer srv.Close()
	env := testEnv(t, func(c *config.Config) { c.Checks.ProxyNotServing.MetricsURL = srv.URL + "/metrics" })
	c, _ := newProxyCheck(env)
	for _, tc := range []struct {
		page       string
		status     int
		wantStatus report.Status
		wantReason report.Reason
		wantMsg    string
	}{
		{"# TYPE ready gauge\nready 1\nother_total 5\n", 200, report.StatusFalse, "ProxyServing", "/metrics: ready is 1"},
		{"# TYPE ready gauge\nready 0\n", 200, report.StatusTrue, "ProxyNotReady", "/metrics: ready is 0 (no valid target set)"},
		{"other 1\n", 200, report.StatusTrue, "ProxyNotReady", "/metrics has no ready gauge"},
		{"", 503, report.StatusTrue, "ProxyUnreachable", "HTTP 503"},
	} {
		page, status = tc.page, tc.status
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != tc.wantStatus || r.Reason != tc.wantReason || !strings.Contains(r.Message, tc.wantMsg) {
			t.Errorf("page %q: %+v %v; want %s/%s containing %q", tc.page, r, err, tc.wantStatus, tc.wantReason, tc.wantMsg)
		}
	}
	// A page that is not the proxy's metrics: something answered, and what it
	// says is not known: an error (Unknown, CheckFailed), as for TunnelDisconnected.
	for _, p := range []string{"ready{not closed 1\n", "<html><body>502 Bad Gateway</body></html>\n",
		"# TYPE ready histogram\nready_bucket{le=\"1\"} 1\n"} {
		page, status = p, 200
		if r, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), srv.URL+"/metrics: metrics page: ") {
			t.Errorf("page %q: %+v %v; want a page error", p, r, err)
		}
	}
	// A ready value that is no readiness (NaN, an infinity, a negative
	// value; one series of several): an error (Unknown), as TunnelDisconnected
	// treats such a connection count. Before, each was ProxyServing (False).
	for _, p := range []string{"# TYPE ready gauge\nready NaN\n", "ready -1\n", "ready +Inf\n", "ready -Inf\n",
		"# TYPE ready gauge\nready{a=\"x\"} 1\nready{a=\"y\"} NaN\n"} {
		page, status = p, 200
		if r, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), srv.URL+"/metrics: ready is ") || !strings.Contains(err.Error(), ", not a readiness value") {
			t.Errorf("page %q: %+v %v; want an error", p, r, err)
		}
	}
	srv.Close()
	if r, _ := c.Probe(context.Background()); r.Reason != "ProxyUnreachable" || !strings.Contains(r.Message, "connection refused") {
		t.Errorf("endpoint down: %+v", r)
	}
}

// A garbage metrics page is an error, never a panic. parseMetric reads
// only the lines of the metric's family (family): on a page that expfmt's
// parser takes whole, it finds what that parser finds.
func FuzzParseMetric(f *testing.F) {
	f.Add("# TYPE ready gauge\nready 1\n")
	f.Add("ready{a=\"b\"} 0 1700000000\n# HELP x y\n")
	f.Add("# TYPE ready histogram\nready_bucket{le=\"1\"} 1\n")
	f.Add("# TYPE other counter\nother_total{a=\"}\\\"\"} 3\nready 2\n{\"ready\", a=\"b\"} 4\n")
	f.Add("# TYPE ready_x gauge\nready_x 1\n# TYPE ready gauge\nready{x=\"1\"} NaN\n  ready{x=\"2\",} +Inf 12\n")
	f.Add("ready{a=\"x\",b=\"y\"} 1\nready{b=\"y\",a=\"x\"} 0\n")
	f.Add("ready{a=\"\"} 1\nready 0\n")
	f.Add("\"ready\"1\n\"ready\"{a=\"b\"}2\n")
	f.Fuzz(func(t *testing.T, page string) {
		vals, found, err := parseMetric(strings.NewReader(page), "ready")
		if err == nil && !found && len(vals) > 0 {
			t.Fatal("values without the metric")
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, whole := p.TextToMetricFamilies(strings.NewReader(page))
		if whole != nil {
			return // not a page expfmt takes: parseMetric may be more lenient, never less
		}
		// expfmt takes one series given twice; parseMetric refuses it
		// (TestScrapeSeriesTwiceIsAPageError).
		if err != nil && !strings.Contains(err.Error(), " is a ") && !(strings.Contains(err.Error(), " is given twice") && hasSeriesTwice(fams["ready"])) {
			t.Fatalf("expfmt takes the page whole, parseMetric refuses it: %v", err)
		}
		if _, ok := fams["ready"]; ok != found {
			t.Fatalf("found %v, expfmt's families have ready: %v", found, ok)
		}
		if err == nil && hasSeriesTwice(fams["ready"]) {
			t.Fatal("a series given twice is read")
		}
		if err == nil && len(vals) != len(fams["ready"].GetMetric()) {
			t.Fatalf("%d values, expfmt has %d series", len(vals), len(fams["ready"].GetMetric()))
		}
		// The values read are expfmt's, series by series; a family that
		// is no gauge, counter or untyped one is refused naming its type.
		want, wantFound, wantErr := expfmtValues(fams, "ready")
		if err != nil && strings.Contains(err.Error(), " is a ") != (wantErr != nil) {
			t.Fatalf("parseMetric: %v; expfmt's family: %v", err, wantErr)
		}
		if err == nil && (wantErr != nil || wantFound != found || !sameFloats(vals, want)) {
			t.Fatalf("parseMetric read %v (found %v), expfmt %v (found %v, %v)", vals, found, want, wantFound, wantErr)
		}
	})
}

// expfmtValues is the reference reading of the metric name on a page that
// expfmt's parser took whole: its series' values, in expfmt's order.
func expfmtValues(fams map[string]*dto.MetricFamily, name string) ([]float64, bool, error) {
	f, ok := fams[name]
	if !ok {
		return nil, false, nil
	}
	var out []float64
	for _, m := range f.GetMetric() {
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			out = append(out, m.GetGauge().GetValue())
		case dto.MetricType_COUNTER:
			out = append(out, m.GetCounter().GetValue())
		case dto.MetricType_UNTYPED:
			out = append(out, m.GetUntyped().GetValue())
		default:
			return nil, true, fmt.Errorf("a %s", f.GetType())
		}
	}
	return out, true, nil
}

// sameFloats: a and b hold the same values in the same order (a NaN is
// the same as a NaN).
func sameFloats(a, b []float64) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) })
}

// hasSeriesTwice reports whether f gives one label set twice (expfmt's
// view, compared as sorted name/value pairs, independently of seriesKey).
func hasSeriesTwice(f *dto.MetricFamily) bool {
	seen := map[string]bool{}
	for _, m := range f.GetMetric() {
		var pairs []string
		for _, l := range m.GetLabel() {
			if l.GetValue() != "" { // an empty value is no label
				pairs = append(pairs, fmt.Sprintf("%q:%q", l.GetName(), l.GetValue()))
			}
		}
		sort.Strings(pairs)
		k := strings.Join(pairs, "\x00")
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

func writeCert(t *testing.T, path, cn string, notAfter time.Time) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: notAfter.Add(-365 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	os.MkdirAll(filepath.Dir(path), 0o755)
	// Key first, as in kubelet-client-current.pem.
	b := append(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCertCheck(t *testing.T) {
	root := t.TempDir()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Now = func() time.Time { return now }
	client := root + "/var/lib/kubelet/pki/kubelet-client-current.pem"
	c, _ := newCertCheck(env)

	// No certificate at all: nothing was checked, so no claim that none
	// expires.
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck ||
		r.Message != "none of the 2 configured certificates exists: /var/lib/kubelet/pki/kubelet-client-current.pem, /var/lib/kubelet/pki/kubelet-server-current.pem" {
		t.Errorf("no certificate: %+v %v", r, err)
	}
	store := report.NewStore("b")
	runner, err := NewRunner(env, Options{Store: store, Only: []string{"CertRenewalFailing"}})
	if err != nil {
		t.Fatal(err)
	}
	runner.RunOnce(context.Background())
	if got, _ := store.Get("CertRenewalFailing"); got.Status != report.StatusUnknown || got.Reason != report.ReasonNothingToCheck || got.Message != r.Message {
		t.Errorf("no certificate, through the runner: %+v", got)
	}

	writeCert(t, client, "system:node:n1", now.Add(200*24*time.Hour))
	r, err = c.Probe(context.Background())
	if err != nil || r.Status != report.StatusFalse ||
		r.Message != "1 certificate valid for more than 168h0m0s; not present: /var/lib/kubelet/pki/kubelet-server-current.pem" {
		t.Errorf("valid (server cert absent): %+v %v", r, err)
	}
	infos := r.Details[0].Value.([]CertInfo)
	if len(infos) != 2 || infos[0].DaysLeft != 200 || infos[1].Error != "not present" {
		t.Errorf("certs domain: %+v", infos)
	}

	writeCert(t, client, "system:node:n1", now.Add(6*24*time.Hour))
	r, _ = c.Probe(context.Background())
	if r.Status != report.StatusTrue || r.Reason != "CertificateExpiringSoon" ||
		r.Message != "/var/lib/kubelet/pki/kubelet-client-current.pem (system:node:n1) expires on 2026-12-08T12:00:00Z: not renewed within 168h0m0s of expiry" {
		t.Errorf("expiring: %+v", r)
	}
	writeCert(t, client, "system:node:n1", now.Add(-time.Hour))
	if r, _ := c.Probe(context.Background()); !strings.Contains(r.Message, "expired on "+now.Add(-time.Hour).UTC().Format(time.RFC3339)) {
		t.Errorf("expired: %+v", r)
	}
	os.WriteFile(client, []byte("not pem"), 0o600)
	if _, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("garbage file: %v", err)
	}
	// One readable, one not: the unreadable one may be expiring, so not
	// valid: an error that names it and says the other is valid.
	server := root + "/var/lib/kubelet/pki/kubelet-server-current.pem"
	writeCert(t, server, "n1", now.Add(300*24*time.Hour))
	if r, err := c.Probe(context.Background()); err == nil || r.Status == report.StatusFalse ||
		err.Error() != "/var/lib/kubelet/pki/kubelet-client-current.pem: no PEM certificate (1 other certificate valid for more than 168h0m0s)" {
		t.Errorf("one unreadable: %+v %v", r, err)
	}
	writeCert(t, client, "system:node:n1", now.Add(200*24*time.Hour))
	if r, _ := c.Probe(context.Background()); r.Status != report.StatusFalse || r.Message != "2 certificates valid for more than 168h0m0s" {
		t.Errorf("both valid: %+v", r)
	}

	// None configured.
	env.Config.Checks.CertRenewalFailing.Certificates = nil
	c, _ = newCertCheck(env)
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck ||
		r.Message != "no certificates configured (checks.CertRenewalFailing.certificates is empty)" {
		t.Errorf("none configured: %+v %v", r, err)
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}
