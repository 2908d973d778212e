package checks

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("CertRenewalFailing", newCertCheck) }

// certCheck: a node certificate expires within renew_within (7 days) and has
// not been renewed. The renewers (kubelet rotation, tunnel self-renew) renew
// long before that, so a certificate this close to expiry means the renewer
// is broken. A certificate shorter-lived than ten times renew_within (a
// signer's --cluster-signing-duration=24h) is within 7 days of expiry all
// its life: it counts as not renewed only in the last tenth of its lifetime
// (renewalWindow), past where kubelet rotates (70 % to 90 %). A file is
// judged by the certificate in it that expires first, the leaf or its chain,
// unless another of them is past its own window (judgeCerts). A configured
// certificate that does not exist is reported in the certs domain, not as a
// failure (kubelet-server-current.pem exists only with serverTLSBootstrap);
// one that exists and cannot be read (a symlink to nothing, left by a
// rotation that broke, or a truncated or garbled file) is an error,
// Unknown: it may be expiring, so no False.
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
	// RenewWithin is the window it is judged by (renewalWindow), a
	// duration as time.Duration writes it: renew_within, or a tenth of its
	// lifetime where that is shorter.
	RenewWithin string `json:"renewWithin,omitempty"`
	Error       string `json:"error,omitempty"`
	// Expiring: it expires within the check's renew_within (set by Probe;
	// not in the report: Problem).
	Expiring bool `json:"-"`
}

// Problem reports whether the certificate expires within the renewal
// window, or exists and could not be read (a file not present is not).
func (c CertInfo) Problem() bool {
	return c.Expiring || (c.Error != "" && c.Error != certNotPresent)
}

// certNotPresent is CertInfo.Error for a file that does not exist.
const certNotPresent = "not present"

// MarshalJSON leaves daysLeft out of a file that was not read (Error set):
// its 0 would read as a certificate that expires today.
func (c CertInfo) MarshalJSON() ([]byte, error) {
	type plain CertInfo
	if c.Error != "" {
		return json.Marshal(struct {
			Path  string `json:"path"`
			Error string `json:"error"`
		}{c.Path, c.Error})
	}
	return json.Marshal(plain(c))
}

func (c *certCheck) Probe(ctx context.Context) (Result, error) {
	now := c.env.Now()
	var infos []CertInfo
	var expiring []dueCert
	var unreadable, absent []string
	checked, short := 0, false
	for _, p := range c.paths {
		info := CertInfo{Path: p}
		certs, key, err := parseCertFile(c.env.Config.HostRoot, p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			info.Error = certNotPresent
			absent = append(absent, p)
		case err != nil:
			info.Error = err.Error()
			unreadable = append(unreadable, fmt.Sprintf("%s: %v", p, err))
		default:
			checked++
			leaf := pickLeaf(certs, key)
			first, window, due := judgeCerts(certs, now, c.within)
			short = short || window < c.within
			info.Subject, info.NotAfter = first.Subject.String(), first.NotAfter.UTC()
			info.DaysLeft = daysLeft(now, first.NotAfter)
			info.RenewWithin = window.String()
			if due {
				info.Expiring = true
				// No countdown: a message that changed at every run
				// would be a write of the Node's status each time.
				what := "expires on"
				if !first.NotAfter.After(now) {
					what = "expired on"
				}
				name := first.Subject.CommonName
				if first != leaf {
					name = fmt.Sprintf("%s, in the chain of %s", name, leaf.Subject.CommonName)
				}
				expiring = append(expiring, dueCert{
					what:   fmt.Sprintf("%s (%s) %s %s", p, name, what, first.NotAfter.UTC().Format(time.RFC3339)),
					window: window, lifetime: first.NotAfter.Sub(first.NotBefore)})
			}
		}
		infos = append(infos, info)
	}
	details := []report.Detail{{Domain: "certs", Field: "certs", Value: infos}}
	// validFor is what the files not due are valid for: renew_within, or,
	// where a certificate lives less than ten times that, a tenth of its
	// lifetime. The words are the same at every run of the same files.
	validFor := c.within.String()
	if short {
		validFor += fmt.Sprintf(" or, where shorter, a tenth of %s lifetime", plural(checked, "its", "their"))
	}
	if len(expiring) > 0 {
		// Where every certificate is judged by renew_within, the window
		// is said once, at the end; else each says its own, and a short
		// one its lifetime.
		var parts []string
		for _, e := range expiring {
			switch {
			case !short:
				parts = append(parts, e.what)
			case e.window < c.within:
				parts = append(parts, fmt.Sprintf("%s: not renewed within %s of expiry, past 90 %% of its %s lifetime", e.what, e.window, e.lifetime))
			default:
				parts = append(parts, fmt.Sprintf("%s: not renewed within %s of expiry", e.what, e.window))
			}
		}
		msg := strings.Join(parts, "; ")
		if !short {
			msg += fmt.Sprintf(": not renewed within %s of expiry", c.within)
		}
		return Result{Status: report.StatusTrue, Reason: report.ReasonCertificateExpiringSoon, Message: msg, Details: details}, nil
	}
	if len(unreadable) > 0 {
		// A certificate that exists and cannot be read (a dangling
		// symlink left by a broken rotation, a truncated file) may be
		// expiring: no claim that none is. The others are named.
		msg := strings.Join(unreadable, "; ")
		if checked > 0 {
			msg += fmt.Sprintf(" (%d other %s valid for more than %s)", checked, plural(checked, "certificate", "certificates"), validFor)
		}
		return Result{Details: details}, errors.New(msg)
	}
	if checked == 0 {
		// Nothing was checked: no certificate that could expire, so no
		// claim that none does.
		msg := "no certificates configured (checks.CertRenewalFailing.certificates is empty)"
		if len(absent) > 0 {
			msg = fmt.Sprintf("none of the %d configured certificates exists: %s", len(absent), strings.Join(absent, ", "))
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: msg, Details: details}, nil
	}
	msg := fmt.Sprintf("%d %s valid for more than %s", checked, plural(checked, "certificate", "certificates"), validFor)
	if len(absent) > 0 {
		msg += "; not present: " + strings.Join(absent, ", ")
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonCertificatesValid, Message: msg, Details: details}, nil
}

// dueCert is a file whose certificate is due (judgeCerts), for the message.
type dueCert struct {
	what             string
	window, lifetime time.Duration
}

// renewalWindow is how close to its expiry a certificate may come before it
// counts as not renewed: within, or a tenth of its lifetime (NotAfter -
// NotBefore, to the second below) where that is shorter. kubelet rotates
// its certificates at a random point between 70 % and 90 % of their
// lifetime (k8s.io/client-go/util/certificate, jitteryDuration), cert-manager
// at two thirds by default: a certificate in its last tenth was due and was
// not replaced. A 1-year certificate keeps the 7 days; one of 24 h is due in
// its last 2h24m, where before every healthy node's was True all its life.
// A certificate with NotBefore at or after NotAfter (garbage) keeps within.
func renewalWindow(cert *x509.Certificate, within time.Duration) time.Duration {
	if !cert.NotBefore.Before(cert.NotAfter) {
		return within
	}
	// Sub saturates at about 292 years: a tenth of it is past any
	// sensible within.
	if w := (cert.NotAfter.Sub(cert.NotBefore) / 10).Truncate(time.Second); w < within {
		return w
	}
	return within
}

// judgeCerts returns the certificate a file is judged by, its window
// (renewalWindow) and whether it is due: expired, or in its window. That
// is the first of the file's certificates to expire, or, where another of
// them is due and it is not (a 24 h leaf well before its 90 %, signed by an
// intermediate of a year with 5 days left), the first of those due.
func judgeCerts(certs []*x509.Certificate, now time.Time, within time.Duration) (judged *x509.Certificate, window time.Duration, due bool) {
	var first, firstDue *x509.Certificate
	for _, c := range certs {
		if first == nil || c.NotAfter.Before(first.NotAfter) {
			first = c
		}
		w := renewalWindow(c, within)
		// The left < w below is right for a notAfter past what a
		// Duration holds: the saturated Duration is past the window.
		if left := c.NotAfter.Sub(now); left <= 0 || left < w {
			if firstDue == nil || c.NotAfter.Before(firstDue.NotAfter) {
				firstDue = c
			}
		}
	}
	if firstDue != nil {
		return firstDue, renewalWindow(firstDue, within), true
	}
	return first, renewalWindow(first, within), false
}

// daysLeft is the whole days from now to t, rounded down: 0 in the last day
// before t, negative once t is past (-1 in the first day after it). It is
// not counted from t.Sub(now): a time.Duration stops at about 292 years,
// and RFC 5280's notAfter for a certificate "with no well-defined
// expiration date", 99991231235959Z, is further than that (judgeCerts'
// left < w is right all the same: the saturated Duration is still past the
// window).
func daysLeft(now, t time.Time) int {
	secs := float64(t.Unix()-now.Unix()) + float64(t.Nanosecond()-now.Nanosecond())/1e9
	return int(math.Floor(secs / (24 * 60 * 60)))
}

// LeafCertificate returns the leaf certificate of the PEM file at the host
// path p under the host root root (its links resolved as the host resolves
// them: openNoWaitIn): the one whose public key is that of the private key
// in the same file, else the first that is not a CA, else the first.
func LeafCertificate(root, p string) (*x509.Certificate, error) {
	certs, key, err := parseCertFile(root, p)
	if err != nil {
		return nil, err
	}
	return pickLeaf(certs, key), nil
}

// parseCertFile returns the certificates of the PEM file at the host path p
// under root, in file order, and the public key of its private key (nil if
// it has none or it cannot be parsed). The kubelet's *-current.pem files
// hold the certificate and its key; a file may hold a chain, in any order.
// A file that is absent is os.ErrNotExist; a symlink to nothing (a rotation
// that broke) is not: it is an error that says so. Links are resolved as
// the host resolves them (openNoWaitIn).
func parseCertFile(root, p string) ([]*x509.Certificate, crypto.PublicKey, error) {
	b, err := readCertBytes(root, p)
	if errors.Is(err, os.ErrNotExist) {
		if target, lerr := readlinkIn(root, p); lerr == nil {
			return nil, nil, fmt.Errorf("dangling symlink to %s (a certificate rotation that broke?)", target)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return parseCertPEM(b)
}

// parseCertPEM returns the certificates of PEM text, in order, and the
// public key of its private key (nil if it has none or it cannot be
// parsed). Text with no certificate, one that does not parse, a PEM block
// that does not decode (garbled, or without its END line) or a PEM block
// cut short is an error.
func parseCertPEM(b []byte) ([]*x509.Certificate, crypto.PublicKey, error) {
	var certs []*x509.Certificate
	var pub crypto.PublicKey
	for n := 1; ; n++ {
		blk, rest := pem.Decode(b)
		if blk == nil {
			break
		}
		// pem.Decode skips a block it cannot decode and returns the next
		// one: a BEGIN line before this block's own is a block skipped,
		// maybe the certificate that expires first.
		if skipped := b[:len(b)-len(rest)]; bytes.Count(skipped, pemBegin) > 1 {
			return nil, nil, fmt.Errorf("PEM block %d (%s) does not decode (a garbled file?)", n, pemType(skipped))
		}
		b = rest
		switch {
		case blk.Type == "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
			}
			certs = append(certs, c)
		case strings.HasSuffix(blk.Type, "PRIVATE KEY") && pub == nil:
			pub = publicKeyOf(blk)
		}
	}
	if bytes.Contains(b, pemBegin) {
		return nil, nil, errors.New("a PEM block is not complete (a truncated file?)")
	}
	if len(certs) == 0 {
		return nil, nil, errors.New("no PEM certificate")
	}
	return certs, pub, nil
}

var pemBegin = []byte("-----BEGIN")

// pemType is the type named by the first BEGIN line of b, shortened.
func pemType(b []byte) string {
	_, after, _ := bytes.Cut(b, pemBegin)
	t, _, _ := bytes.Cut(bytes.TrimLeft(after, " "), []byte("-----"))
	if i := bytes.IndexByte(t, '\n'); i >= 0 {
		t = t[:i]
	}
	return fmt.Sprintf("%.40s", t)
}

// maxCertFile bounds what is read of a certificate file: a kubelet's
// *-current.pem is a few KiB, a bundle of every public CA about 200 KiB.
const maxCertFile = 4 << 20

// readCertBytes reads a certificate file, through symlinks (kubelet's
// *-current.pem is one), if it is a regular file of at most maxCertFile
// bytes. It opens without blocking (openNoWait) and checks the open
// descriptor: a FIFO is refused at once, not waited on for a writer. p is
// a host path under root (openNoWaitIn).
func readCertBytes(root, p string) ([]byte, error) {
	f, fi, err := openNoWaitIn(root, p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCertFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxCertFile {
		return nil, fmt.Errorf("larger than %d bytes, not a certificate file", maxCertFile)
	}
	return b, nil
}

// publicKeyOf returns the public key of a PEM private key block, or nil.
func publicKeyOf(blk *pem.Block) crypto.PublicKey {
	var key any
	var err error
	switch blk.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(blk.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	}
	if s, ok := key.(crypto.Signer); ok && err == nil {
		return s.Public()
	}
	return nil
}

// pickLeaf returns the certificate of the key, else the first that is not a
// CA, else the first.
func pickLeaf(certs []*x509.Certificate, pub crypto.PublicKey) *x509.Certificate {
	if k, ok := pub.(interface{ Equal(crypto.PublicKey) bool }); ok {
		for _, c := range certs {
			if k.Equal(c.PublicKey) {
				return c
			}
		}
	}
	for _, c := range certs {
		if !c.IsCA {
			return c
		}
	}
	return certs[0]
}
