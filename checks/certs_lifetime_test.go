package checks

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A certificate shorter-lived than ten times renew_within counts as not
// renewed only in the last tenth of its lifetime: kubelet rotates at a
// random point between 70 % and 90 % of it (client-go's jitteryDuration),
// so one in its last tenth was due and was not replaced. A cluster whose
// signer issues 24 h certificates (--cluster-signing-duration=24h) has
// every healthy node's certificate within 7 days of expiry all its life:
// before, CertRenewalFailing was True on every node, always. A 1-year
// certificate keeps the 7 days; an expired one is True whatever its
// lifetime; one whose NotBefore is not before its NotAfter (garbage) keeps
// the 7 days.
func TestCertShortLivedIsDueInTheLastTenthOfItsLifetime(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name     string
		lifetime time.Duration // NotAfter - NotBefore; negative: NotBefore after NotAfter
		left     time.Duration // NotAfter - now
		want     report.Status
		window   string // the certs entry's renewWithin
		wantMsg  string // the message, where True
	}{
		{"24h at half its life", day, 12 * time.Hour, report.StatusFalse, "2h24m0s", ""},
		// kubelet may rotate as late as 90 %: at 85 % it is not late.
		{"24h at 85 %", day, 3*time.Hour + 36*time.Minute, report.StatusFalse, "2h24m0s", ""},
		{"24h with exactly a tenth left", day, 2*time.Hour + 24*time.Minute, report.StatusFalse, "2h24m0s", ""},
		{"24h a minute past 90 %", day, 2*time.Hour + 23*time.Minute, report.StatusTrue, "2h24m0s",
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-02T14:23:00Z: not renewed within 2h24m0s of expiry, past 90 % of its 24h0m0s lifetime"},
		{"24h expired an hour ago", day, -time.Hour, report.StatusTrue, "2h24m0s",
			kubeletClientPEM + " (system:node:n1) expired on 2026-12-02T11:00:00Z: not renewed within 2h24m0s of expiry, past 90 % of its 24h0m0s lifetime"},
		{"72h with 10h left", 3 * day, 10 * time.Hour, report.StatusFalse, "7h12m0s", ""},
		{"72h with 7h left", 3 * day, 7 * time.Hour, report.StatusTrue, "7h12m0s",
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-02T19:00:00Z: not renewed within 7h12m0s of expiry, past 90 % of its 72h0m0s lifetime"},
		// 70 days: a tenth is the 7 days, no shorter.
		{"70 days with 8 days left", 70 * day, 8 * day, report.StatusFalse, "168h0m0s", ""},
		{"70 days with 6 days left", 70 * day, 6 * day, report.StatusTrue, "168h0m0s",
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-08T12:00:00Z: not renewed within 168h0m0s of expiry"},
		{"1y with 8 days left", 365 * day, 8 * day, report.StatusFalse, "168h0m0s", ""},
		{"1y with 6 days left", 365 * day, 6 * day, report.StatusTrue, "168h0m0s",
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-08T12:00:00Z: not renewed within 168h0m0s of expiry"},
		{"1y at half its life", 365 * day, 182 * day, report.StatusFalse, "168h0m0s", ""},
		// A tenth of 5 s is 0 s: still True at its notAfter.
		{"5s at its notAfter", 5 * time.Second, 0, report.StatusTrue, "0s",
			kubeletClientPEM + " (system:node:n1) expired on 2026-12-02T12:00:00Z: not renewed within 0s of expiry, past 90 % of its 5s lifetime"},
		{"NotBefore = NotAfter, 6 days left", 0, 6 * day, report.StatusTrue, "168h0m0s",
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-08T12:00:00Z: not renewed within 168h0m0s of expiry"},
		{"NotBefore after NotAfter, 6 days left", -day, 6 * day, report.StatusTrue, "168h0m0s",
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-08T12:00:00Z: not renewed within 168h0m0s of expiry"},
		{"NotBefore after NotAfter, 8 days left", -day, 8 * day, report.StatusFalse, "168h0m0s", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			notAfter := now.Add(tc.left)
			leaf := newCertFixtureFrom(t, "system:node:n1", notAfter.Add(-tc.lifetime), notAfter, false, nil)
			writeCertFile(t, root+kubeletClientPEM, leaf.keyPEM(t), leaf.certPEM())
			r, err := probeKubeletCert(t, root, now)
			if err != nil || r.Status != tc.want {
				t.Fatalf("got %s/%s %q, error %v; want %s", r.Status, r.Reason, r.Message, err, tc.want)
			}
			if tc.want == report.StatusTrue && (r.Reason != report.ReasonCertificateExpiringSoon || r.Message != tc.wantMsg) {
				t.Errorf("got %s %q\nwant CertificateExpiringSoon %q", r.Reason, r.Message, tc.wantMsg)
			}
			infos, _ := r.Details[0].Value.([]CertInfo)
			if len(infos) != 1 || infos[0].RenewWithin != tc.window || infos[0].Expiring != (tc.want == report.StatusTrue) {
				t.Errorf("certs domain: %+v, want renewWithin %s", infos, tc.window)
			}
		})
	}
}

// The False message says what the certificates are valid for: renew_within
// alone while each lives ten times that or more (as before), else with the
// tenth of a shorter lifetime. The words do not change from run to run.
func TestCertValidMessageOfShortLivedCertificates(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	root := t.TempDir()
	short := newCertFixtureFrom(t, "system:node:n1", now.Add(-12*time.Hour), now.Add(12*time.Hour), false, nil)
	long := newCertFixture(t, "system:node:n1", now.Add(200*24*time.Hour), false, nil)
	writeCertFile(t, root+kubeletClientPEM, short.keyPEM(t), short.certPEM())
	writeCertFile(t, root+kubeletServerPEM, long.keyPEM(t), long.certPEM())
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Now = func() time.Time { return now }
	c, _ := newCertCheck(env)
	r, err := c.Probe(context.Background())
	if want := "2 certificates valid for more than 168h0m0s or, where shorter, a tenth of their lifetime"; err != nil || r.Status != report.StatusFalse || r.Message != want {
		t.Errorf("got %s/%s %q, error %v\nwant False %q", r.Status, r.Reason, r.Message, err, want)
	}
	got, err := json.Marshal(r.Details[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `"daysLeft":0,"renewWithin":"2h24m0s"}`) || !strings.Contains(string(got), `"daysLeft":200,"renewWithin":"168h0m0s"}`) {
		t.Errorf("certs domain %s: want each certificate's renewWithin", got)
	}
}

// In a chain each certificate is judged by its own lifetime: a 24 h leaf
// well before its 90 % does not hide an intermediate of a year with 5 days
// left, though the leaf expires first; an intermediate that expires before
// the leaf is still judged first; a leaf past its 90 % is named with its
// lifetime.
func TestCertChainOfAShortLivedLeaf(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ca := newCertFixture(t, "kubernetes-ca", now.Add(3650*24*time.Hour), true, nil)
	for _, tc := range []struct {
		name      string
		interLeft time.Duration // the intermediate's notAfter - now (a 1-year certificate)
		leafLeft  time.Duration // the leaf's notAfter - now (a 24 h certificate)
		want      report.Status
		wantMsg   string
		wantSub   string // the certs entry's subject
	}{
		{"leaf at 17 %, intermediate 5 days left", 5 * 24 * time.Hour, 20 * time.Hour, report.StatusTrue,
			kubeletClientPEM + " (intermediate, in the chain of system:node:n1) expires on 2026-12-07T12:00:00Z: not renewed within 168h0m0s of expiry", "CN=intermediate"},
		{"intermediate first to expire, 10h left", 10 * time.Hour, 20 * time.Hour, report.StatusTrue,
			kubeletClientPEM + " (intermediate, in the chain of system:node:n1) expires on 2026-12-02T22:00:00Z: not renewed within 168h0m0s of expiry", "CN=intermediate"},
		{"leaf past 90 %, intermediate 20 days left", 20 * 24 * time.Hour, 2 * time.Hour, report.StatusTrue,
			kubeletClientPEM + " (system:node:n1) expires on 2026-12-02T14:00:00Z: not renewed within 2h24m0s of expiry, past 90 % of its 24h0m0s lifetime", "CN=system:node:n1"},
		{"leaf at 17 %, intermediate 300 days left", 300 * 24 * time.Hour, 20 * time.Hour, report.StatusFalse,
			"", "CN=system:node:n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			inter := newCertFixture(t, "intermediate", now.Add(tc.interLeft), true, &ca)
			leaf := newCertFixtureFrom(t, "system:node:n1", now.Add(tc.leafLeft-24*time.Hour), now.Add(tc.leafLeft), false, &inter)
			writeCertFile(t, root+kubeletClientPEM, leaf.keyPEM(t), leaf.certPEM(), inter.certPEM())
			r, err := probeKubeletCert(t, root, now)
			if err != nil || r.Status != tc.want || (tc.want == report.StatusTrue && r.Message != tc.wantMsg) {
				t.Errorf("got %s/%s %q, error %v\nwant %s %q", r.Status, r.Reason, r.Message, err, tc.want, tc.wantMsg)
			}
			if infos, _ := r.Details[0].Value.([]CertInfo); len(infos) != 1 || infos[0].Subject != tc.wantSub {
				t.Errorf("certs domain: %+v, want subject %q", infos, tc.wantSub)
			}
		})
	}
}
