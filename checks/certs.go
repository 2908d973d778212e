package checks

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("CertRenewalFailing", newCertCheck) }

// certCheck: a node certificate expires within renew_within (7 days) and has
// not been renewed. The renewers (kubelet rotation, tunnel self-renew) renew
// long before that, so a certificate this close to expiry means the renewer
// is broken. A configured certificate that does not exist is reported in
// the certs domain, not as a failure (kubelet-server-current.pem exists only
// with serverTLSBootstrap).
type certCheck struct {
	env    *Env
	paths  []string
	within time.Duration
}

func newCertCheck(env *Env) (Check, error) {
	c := env.Config.Checks.CertRenewalFailing
	return &certCheck{env: env, paths: c.Certificates, within: c.RenewWithin.Duration}, nil
}

// CertInfo is one certificate in the certs report domain.
type CertInfo struct {
	Path     string    `json:"path"`
	Subject  string    `json:"subject,omitempty"`
	NotAfter time.Time `json:"notAfter,omitzero"`
	DaysLeft int       `json:"daysLeft"`
	Error    string    `json:"error,omitempty"`
}

func (c *certCheck) Probe(ctx context.Context) (Result, error) {
	now := c.env.Now()
	var infos []CertInfo
	var expiring, unreadable, absent []string
	checked := 0
	for _, p := range c.paths {
		info := CertInfo{Path: p}
		cert, err := FirstCertificate(c.env.Path(p))
		switch {
		case errors.Is(err, os.ErrNotExist):
			info.Error = "not present"
			absent = append(absent, p)
		case err != nil:
			info.Error = err.Error()
			unreadable = append(unreadable, fmt.Sprintf("%s: %v", p, err))
		default:
			checked++
			info.Subject, info.NotAfter = cert.Subject.String(), cert.NotAfter.UTC()
			left := cert.NotAfter.Sub(now)
			info.DaysLeft = int(left.Hours() / 24)
			if left < c.within {
				what := fmt.Sprintf("expires in %s", left.Round(time.Minute))
				if left <= 0 {
					what = fmt.Sprintf("expired %s ago", (-left).Round(time.Minute))
				}
				expiring = append(expiring, fmt.Sprintf("%s (%s) %s, on %s", p, cert.Subject.CommonName, what, cert.NotAfter.UTC().Format(time.RFC3339)))
			}
		}
		infos = append(infos, info)
	}
	details := []report.Detail{{Domain: "certs", Field: "certs", Value: infos}}
	if len(expiring) > 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonCertificateExpiringSoon,
			Message: strings.Join(expiring, "; ") + fmt.Sprintf(": not renewed within %s of expiry", c.within), Details: details}, nil
	}
	if len(unreadable) > 0 && checked == 0 {
		return Result{Details: details}, errors.New(strings.Join(unreadable, "; "))
	}
	if checked == 0 && len(unreadable) == 0 {
		// Nothing was checked: no certificate that could expire, so no
		// claim that none does.
		msg := "no certificates configured (checks.CertRenewalFailing.certificates is empty)"
		if len(absent) > 0 {
			msg = fmt.Sprintf("none of the %d configured certificates exists: %s", len(absent), strings.Join(absent, ", "))
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: msg, Details: details}, nil
	}
	msg := fmt.Sprintf("%d %s valid for more than %s", checked, plural(checked, "certificate", "certificates"), c.within)
	if len(unreadable) > 0 {
		msg += "; not readable: " + strings.Join(unreadable, "; ")
	}
	if len(absent) > 0 {
		msg += "; not present: " + strings.Join(absent, ", ")
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonCertificatesValid, Message: msg, Details: details}, nil
}

// FirstCertificate returns the first certificate of a PEM file (the
// kubelet's *-current.pem files hold the certificate and its key).
func FirstCertificate(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM certificate")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}
