package checks

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
// error or a state that is not blank (CNIHealthy only for "Ok" and
// "Disabled" themselves), never a panic.
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

// TestCNIDisabledIsHealthyAsCiliumJudgesIt: cilium's API defines four
// states for the agent (api/v1/models/status.go: Ok, Warning, Failure,
// Disabled), and cilium's own consumers of GET /v1/healthz judge two of
// them healthy: `cilium status --brief` (cilium-dbg/cmd/status.go,
// statusDaemon's isUnhealthy) exits 0, and the agent's liveness endpoint
// on :9879 (agentHealthHandler) answers 200, for "Ok" and "Disabled" alike.
// The agent reports Disabled itself (daemon/cmd/status.go, getStatus: a
// container runtime that is disabled, "<version>    Container runtime is
// disabled"): a node whose agent cilium calls healthy is not CNIUnhealthy
// (before, it was True, CiliumNotOk, an alert on a healthy node).
func TestCNIDisabledIsHealthyAsCiliumJudgesIt(t *testing.T) {
	root := t.TempDir()
	sock := filepath.Join(root, "var/run/cilium/cilium.sock")
	mkdir(t, filepath.Dir(sock))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	answer := ""
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The brief answer (header brief: true): cluster, controllers, stale and cilium.
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	})}
	go srv.Serve(l)
	defer srv.Close()
	c, _ := newCNICheck(testEnv(t, func(c *config.Config) { c.HostRoot = root }))
	defer c.(*cniCheck).Close()
	for _, tc := range []struct {
		answer     string
		wantStatus report.Status
		wantReason report.Reason
		wantMsg    string
	}{
		{`{"cilium":{"msg":"1.12.4 (v1.12.4-6eaecaf)    Container runtime is disabled","state":"Disabled"},"cluster":{}}`,
			report.StatusFalse, report.ReasonCNIHealthy, "cilium-agent state Disabled: 1.12.4 (v1.12.4-6eaecaf)    Container runtime is disabled"},
		// Warning and Failure stay unhealthy, as cilium judges them.
		{`{"cilium":{"msg":"Not all probes executed at least once","state":"Warning"},"cluster":{}}`,
			report.StatusTrue, report.ReasonCiliumNotOk, "cilium-agent state Warning: Not all probes executed at least once"},
		{`{"cilium":{"msg":"1.16.3 (v1.16.3-f2217191)    Could not write CNI config file: open /host/etc/cni/net.d/05-cilium.conflist: read-only file system","state":"Failure"},"cluster":{}}`,
			report.StatusTrue, report.ReasonCiliumNotOk, "cilium-agent state Failure: 1.16.3 (v1.16.3-f2217191)    Could not write CNI config file: open /host/etc/cni/net.d/05-cilium.conflist: read-only file system"},
		// A state that is none of the four is not one cilium calls healthy.
		{`{"cilium":{"state":"disabled"}}`, report.StatusTrue, report.ReasonCiliumNotOk, "cilium-agent state disabled"},
	} {
		answer = tc.answer
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != tc.wantStatus || r.Reason != tc.wantReason || r.Message != tc.wantMsg {
			t.Errorf("answer %s:\n got %s/%s %q (err %v)\nwant %s/%s %q", tc.answer, r.Status, r.Reason, r.Message, err, tc.wantStatus, tc.wantReason, tc.wantMsg)
		}
	}
}

// cilium-agent's msg is its own text (an error it met, naming a file):
// published in the condition's message, a control character in it is
// written \xNN, never raw into `kubectl describe node`.
func TestCNIMessageIsPrintable(t *testing.T) {
	root := t.TempDir()
	sock := filepath.Join(root, "var/run/cilium/cilium.sock")
	mkdir(t, filepath.Dir(sock))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"cilium":{"state":"Failure","msg":"open /host/etc/cni/net.d/\u001b]0;x\u0007.conflist: read-only\nfile system"}}`)
	})}
	go srv.Serve(l)
	defer srv.Close()
	store := report.NewStore("b")
	r, err := NewRunner(testEnv(t, func(c *config.Config) { c.HostRoot = root }), Options{Store: store, Only: []string{"CNIUnhealthy"}})
	if err != nil {
		t.Fatal(err)
	}
	conds := r.RunOnce(t.Context())
	want := `cilium-agent state Failure: open /host/etc/cni/net.d/\x1b]0;x\x07.conflist: read-only\x0afile system`
	if len(conds) != 1 || conds[0].Reason != report.ReasonCiliumNotOk || conds[0].Message != want {
		t.Errorf("got %+v\nwant the message %q", conds, want)
	}
}

// After a boot cilium-agent starts a minute or more after this daemon (a
// pod, after the kubelet and containerd; minutes on a node that joins, while
// its image is pulled). Until it has been healthy once in this boot, within
// cniBootGrace of the boot, an unreachable or unhealthy agent is Unknown,
// NoData, not True: before, every boot and every new node set CNIUnhealthy
// (and its alert, for: 1m) while the agent started. After the grace the same
// is True; once the agent was healthy in this boot, a crash is True at once,
// also for the next daemon of the same boot (the state file), and a new boot
// starts over.
func TestCNIBootGrace(t *testing.T) {
	root := t.TempDir()
	sock := filepath.Join(root, "var/run/cilium/cilium.sock")
	state := filepath.Join(t.TempDir(), "state.json")
	sys := &fakeSys{up: 40 * time.Second}
	newCheck := func(s *report.Store) Check {
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.Sys = sys
		if s != nil {
			env.Memos = s
		}
		c, _ := newCNICheck(env)
		return c
	}
	expect := func(c Check, when string, status report.Status, reason report.Reason) {
		t.Helper()
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != status || r.Reason != reason {
			t.Errorf("%s: %+v %v, want %s %s", when, r, err, status, reason)
		}
	}
	s1 := report.NewStore("boot-1")
	c := newCheck(s1)
	r, _ := c.Probe(context.Background())
	if r.Status != report.StatusUnknown || r.Reason != report.ReasonNoData ||
		!strings.Contains(r.Message, "not been healthy yet in this boot") || !strings.Contains(r.Message, "/var/run/cilium/cilium.sock") {
		t.Errorf("no agent 40 s after the boot: %+v", r)
	}
	mkdir(t, filepath.Dir(sock))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var answer atomic.Value
	answer.Store(`{"cilium":{"state":"Warning","msg":"Initializing"}}`)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, answer.Load().(string))
	})}
	go srv.Serve(l)
	defer srv.Close()
	expect(c, "an agent not Ok yet, 40 s after the boot", report.StatusUnknown, report.ReasonNoData)
	sys.up = cniBootGrace
	expect(c, "the same at the grace's end", report.StatusTrue, report.ReasonCiliumNotOk)
	sys.up = 90 * time.Second
	answer.Store(`{"cilium":{"state":"Ok"}}`)
	expect(c, "the agent Ok", report.StatusFalse, report.ReasonCNIHealthy)
	answer.Store(`{"cilium":{"state":"Failure","msg":"kvstore unreachable"}}`)
	expect(c, "the agent failing after it was healthy in this boot", report.StatusTrue, report.ReasonCiliumNotOk)
	if err := s1.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The daemon restarts within the boot: the agent was healthy in it.
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s2), "the next daemon of the boot", report.StatusTrue, report.ReasonCiliumNotOk)
	// A new boot starts over.
	s3 := report.NewStore("boot-2")
	if _, err := s3.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s3), "a new boot", report.StatusUnknown, report.ReasonNoData)
	// The one-shot check (no state) judges by the boot's age alone.
	expect(newCheck(nil), "the one-shot check 90 s after the boot", report.StatusUnknown, report.ReasonNoData)
}
