package checks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("CNIUnhealthy", newCNICheck) }

// cniCheck asks the local cilium-agent for its health over its API socket
// (GET /v1/healthz, the call `cilium status` makes): True when the agent's
// own state is one cilium itself calls unhealthy (Warning, Failure, or a
// state that is none of its four; `cilium status` and the agent's liveness
// endpoint call Ok and Disabled healthy), or the socket does not answer. The connection is
// kept between probes, as the CRI call's (keptSocket): a connection the
// agent dropped by restarting is not an outage (net/http makes the GET
// again on a new one), and a socket the agent made anew is probed anew.
//
// After a boot cilium-agent is a pod like any other: it starts after the
// kubelet and the container runtime, a minute or more after this daemon
// (minutes on a node that joins, while its image is pulled). Until the agent
// has been healthy once in this boot, and within cniBootGrace of the boot,
// an unreachable or unhealthy agent is Unknown, NoData ("not healthy yet in
// this boot"), not True: every boot and every new node would otherwise set
// the condition, and its alert, for the agent's start. After the grace the
// same answer is True; once the agent was healthy in this boot, at once.
// "Healthy in this boot" is kept in the state file (Env.Memos), so a daemon
// restart within the boot does not give a crashed agent the grace again.
type cniCheck struct {
	env    *Env
	socket string
	sock   *keptSocket
	tr     *http.Transport
	client *http.Client
	// grace: the agent answered Ok or Disabled in this boot (bootGrace).
	grace bootGrace
}

// CNIKey is the name under which CNIUnhealthy keeps, in the state file,
// whether cilium-agent has been healthy in this boot.
const CNIKey = "cni"

// cniBootGrace is how long after the boot an agent that has not been
// healthy yet in this boot is not yet a problem (see cniCheck).
const cniBootGrace = 10 * time.Minute

func newCNICheck(env *Env) (Check, error) {
	c := env.Config.Checks.CNIUnhealthy
	tr := &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: keptConnIdle, DisableCompression: true}
	return &cniCheck{env: env, socket: c.Socket, sock: newKeptSocket(env.Path(c.Socket), tr), tr: tr,
		client: &http.Client{Transport: tr, Timeout: probeTimeout(c.Timeout.Duration)},
		grace:  newBootGrace(CNIKey, cniBootGrace, "cilium-agent has not been healthy yet in this boot")}, nil
}

// Close closes the kept connection (Closer).
func (c *cniCheck) Close() { c.tr.CloseIdleConnections() }

// ciliumStatus is the part of cilium's StatusResponse (api/v1/openapi.yaml)
// the check reads.
type ciliumStatus struct {
	Cilium *struct {
		State string `json:"state"`
		Msg   string `json:"msg"`
	} `json:"cilium"`
}

func (c *cniCheck) Probe(ctx context.Context) (Result, error) {
	return c.grace.probe(ctx, c.env, c.probe)
}

func (c *cniCheck) probe(ctx context.Context) (Result, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://cilium/v1/healthz", nil)
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("brief", "true")
	c.sock.check()
	resp, err := c.client.Do(req)
	if d, denied := socketDenied(err); denied {
		// Not an agent that does not answer: one this process may not ask.
		return Result{}, fmt.Errorf("cilium-agent API on %s: %w", c.socket, d)
	}
	if err != nil {
		return Result{Status: report.StatusTrue, Reason: report.ReasonCiliumUnreachable, Message: fmt.Sprintf("cilium-agent API on %s: %v", c.socket, err)}, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Result{Status: report.StatusTrue, Reason: report.ReasonCiliumUnreachable, Message: fmt.Sprintf("cilium-agent API on %s: %v", c.socket, err)}, nil
	}
	if resp.StatusCode != http.StatusOK {
		return Result{Status: report.StatusTrue, Reason: report.ReasonCiliumNotOk, Message: fmt.Sprintf("cilium-agent /v1/healthz: HTTP %d", resp.StatusCode)}, nil
	}
	state, msg, err := parseCiliumStatus(body)
	if err != nil {
		// An answer we cannot read says nothing about cilium's health.
		return Result{}, fmt.Errorf("cilium-agent /v1/healthz: unreadable answer (%d bytes): %v", len(body), err)
	}
	switch state {
	case "Ok":
		return Result{Status: report.StatusFalse, Reason: report.ReasonCNIHealthy, Message: "cilium-agent state Ok"}, nil
	case "Disabled":
		// Healthy as cilium judges it: `cilium status --brief` exits 0 and
		// the agent's liveness endpoint answers 200 for Ok and Disabled
		// alike (their isUnhealthy); the agent reports Disabled for a
		// component it was told not to use ("Container runtime is
		// disabled"). Its message is a fixed text, so it is kept.
		m := "cilium-agent state Disabled"
		if msg != "" {
			m += ": " + msg
		}
		return Result{Status: report.StatusFalse, Reason: report.ReasonCNIHealthy, Message: m}, nil
	}
	m := fmt.Sprintf("cilium-agent state %s", state)
	if msg != "" {
		m += ": " + msg
	}
	return Result{Status: report.StatusTrue, Reason: report.ReasonCiliumNotOk, Message: m}, nil
}

// parseCiliumStatus reads the agent's own state and message from a
// /v1/healthz answer. An answer without a cilium object, or whose cilium
// object has no state (or a blank one), is an error: it says nothing of
// cilium's health (before, an empty state was a True "cilium-agent state ").
func parseCiliumStatus(body []byte) (state, msg string, err error) {
	var st ciliumStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return "", "", err
	}
	if st.Cilium == nil {
		return "", "", errors.New("no cilium status")
	}
	if strings.TrimSpace(st.Cilium.State) == "" {
		return "", "", errors.New("cilium status without a state")
	}
	return st.Cilium.State, st.Cilium.Msg, nil
}
