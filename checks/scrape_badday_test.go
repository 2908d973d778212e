package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// The proxy's metrics endpoint on a bad day, served by a real HTTP server
// on a real socket: each answer has the result that says what is known.
// A 500 with a page that says ready is a failed answer, not the page; a
// gzip body the daemon did not ask for (it asks uncompressed) is not
// exposition text (Unknown), never decoded past its bound; a connection
// reset mid-body is no answer (True), with no local port in the message;
// a huge ready value is ready.
func TestProxyBadDayAnswers(t *testing.T) {
	var h http.HandlerFunc
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r) }))
	defer srv.Close()
	env := testEnv(t, func(c *config.Config) { c.Checks.ProxyNotServing.MetricsURL = srv.URL + "/metrics" })
	c, _ := newProxyCheck(env)
	defer c.(Closer).Close()
	for _, tc := range []struct {
		name    string
		h       http.HandlerFunc
		status  report.Status // "" for an error (Unknown)
		reason  report.Reason
		message string // in the message, or in the error
	}{
		{"500 with a page", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500); fmt.Fprint(w, "ready 1\n") },
			report.StatusTrue, report.ReasonProxyUnreachable, "HTTP 500"},
		{"gzip not asked for", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			fmt.Fprint(w, "\x1f\x8b\x08\x00not gzip at all")
		}, "", "", `does not start with a metric name`},
		{"reset mid-body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			fmt.Fprint(w, "ready 1\n")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.(*net.TCPConn).SetLinger(0) // an RST, not a FIN
			conn.Close()
		}, report.StatusTrue, report.ReasonProxyUnreachable, "reading the page: read tcp " + srv.Listener.Addr().String() + ": read: connection reset by peer"},
		{"a huge value", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "# TYPE ready gauge\nready 1e308\n") },
			report.StatusFalse, report.ReasonProxyServing, "ready is 1e+308"},
	} {
		h = tc.h
		r, err := c.Probe(context.Background())
		if tc.status == "" {
			if err == nil || !isPageError(err) || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("%s: %+v %v; want an error (Unknown) containing %q", tc.name, r, err, tc.message)
			}
			continue
		}
		if err != nil || r.Status != tc.status || r.Reason != tc.reason || !strings.Contains(r.Message, tc.message) {
			t.Errorf("%s: %+v %v; want %s/%s containing %q", tc.name, r, err, tc.status, tc.reason, tc.message)
		}
	}
}

// Certificate files on a bad day, real files next to a valid certificate
// made with crypto/x509: a DER file (not PEM), a symlink loop, a directory
// in the file's place are each Unknown naming the file and why, never a
// False from the valid one beside it.
func TestCertBadDayFilesAreUnknown(t *testing.T) {
	d := t.TempDir()
	ok := filepath.Join(d, "ok.pem")
	writeCert(t, ok, "ok", time.Now().Add(100*24*time.Hour))
	if err := os.WriteFile(filepath.Join(d, "der.crt"), []byte{0x30, 0x82, 0x01, 0x0a, 0x02, 0x01}, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Symlink("loop2.pem", filepath.Join(d, "loop1.pem"))
	os.Symlink("loop1.pem", filepath.Join(d, "loop2.pem"))
	os.Mkdir(filepath.Join(d, "dir.pem"), 0o755)
	for file, why := range map[string]string{"der.crt": "no PEM certificate", "loop1.pem": "too many levels of symbolic links", "dir.pem": "not a regular file"} {
		p := filepath.Join(d, file)
		env := testEnv(t, func(c *config.Config) { c.Checks.CertRenewalFailing.Certificates = []string{ok, p} })
		c, _ := newCertCheck(env)
		r, err := c.Probe(context.Background())
		if err == nil || !strings.Contains(err.Error(), p+": ") || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "1 other certificate valid") {
			t.Errorf("%s: %+v %v; want an error (Unknown) naming it: %s", file, r, err, why)
		}
	}
}
