package checks

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

func TestCNICheck(t *testing.T) {
	root := t.TempDir()
	sock := filepath.Join(root, "var/run/cilium/cilium.sock")
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	c, _ := newCNICheck(env)
	if r, _ := c.Probe(context.Background()); r.Reason != "CiliumUnreachable" || !strings.Contains(r.Message, "/var/run/cilium/cilium.sock") {
		t.Errorf("no socket: %+v", r)
	}

	mkdir(t, filepath.Dir(sock))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	answer, code := "", 200
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
		fmt.Fprint(w, answer)
	})}
	go srv.Serve(l)
	defer srv.Close()
	for _, tc := range []struct {
		answer     string
		code       int
		wantStatus report.Status
		wantReason report.Reason
		wantMsg    string
		wantErr    bool
	}{
		{`{"cilium":{"state":"Ok","msg":""},"kubernetes":{"state":"Ok"}}`, 200, report.StatusFalse, "CNIHealthy", "cilium-agent state Ok", false},
		{`{"cilium":{"state":"Warning","msg":"1 of 12 controllers failing"}}`, 200, report.StatusTrue, "CiliumNotOk", "cilium-agent state Warning: 1 of 12 controllers failing", false},
		{`{"cilium":{"state":"Failure","msg":"kvstore unreachable"}}`, 200, report.StatusTrue, "CiliumNotOk", "cilium-agent state Failure: kvstore unreachable", false},
		{``, 500, report.StatusTrue, "CiliumNotOk", "cilium-agent /v1/healthz: HTTP 500", false},
		{`<html>nope`, 200, "", "", "", true},
		{`{"kubernetes":{"state":"Ok"}}`, 200, "", "", "", true},
		// A cilium object without a state says nothing of cilium's
		// health: not a True "cilium-agent state " (empty).
		{`{"cilium":{}}`, 200, "", "", "", true},
		{`{"cilium":{"state":"","msg":"x"}}`, 200, "", "", "", true},
		{`{"cilium":{"state":" "}}`, 200, "", "", "", true},
	} {
		answer, code = tc.answer, tc.code
		r, err := c.Probe(context.Background())
		if tc.wantErr {
			if err == nil {
				t.Errorf("answer %q: no error, %+v", tc.answer, r)
			}
			continue
		}
		if err != nil || r.Status != tc.wantStatus || r.Reason != tc.wantReason || r.Message != tc.wantMsg {
			t.Errorf("answer %q: %+v %v", tc.answer, r, err)
		}
	}
}

// FuzzCiliumStatus: whatever cilium-agent answers, parseCiliumStatus is an
// error or a state that is not blank (CNIHealthy only for "Ok" itself),
// never a panic.
func FuzzCiliumStatus(f *testing.F) {
	for _, s := range []string{
		`{"cilium":{"state":"Ok","msg":""},"kubernetes":{"state":"Ok"}}`,
		`{"cilium":{"state":"Warning","msg":"1 of 12 controllers failing"}}`,
		`{"cilium":{}}`,
		`{"cilium":null}`,
		`{"cilium":{"state":5}}`,
		`<html>`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		state, _, err := parseCiliumStatus(b)
		if err != nil {
			return
		}
		if strings.TrimSpace(state) == "" {
			t.Fatalf("%q: no error and a blank state", b)
		}
		var generic struct {
			Cilium struct {
				State string `json:"state"`
			} `json:"cilium"`
		}
		if json.Unmarshal(b, &generic) == nil && generic.Cilium.State != state {
			t.Fatalf("%q: state %q, encoding/json reads %q", b, state, generic.Cilium.State)
		}
	})
}
