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
// is broken. A file is judged by the certificate in it that expires first,
// the leaf or its chain. A configured certificate that does not exist is
// reported in the certs domain, not as a failure (kubelet-server-current.pem
// exists only with serverTLSBootstrap); one that exists and cannot be read
// (a symlink to nothing, left by a rotation that broke, or a truncated or
// garbled file) is an error, Unknown: it may be expiring, so no False.
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
	var expiring, unreadable, absent []string
	checked := 0
	for _, p := range c.paths {
		info := CertInfo{Path: p}
		leaf, first, err := readCertFile(c.env.Config.HostRoot, p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			info.Error = certNotPresent
			absent = append(absent, p)
		case err != nil:
			info.Error = err.Error()
			unreadable = append(unreadable, fmt.Sprintf("%s: %v", p, err))
		default:
			checked++
			info.Subject, info.NotAfter = first.Subject.String(), first.NotAfter.UTC()
			left := first.NotAfter.Sub(now)
			info.DaysLeft = daysLeft(now, first.NotAfter)
			if left < c.within {
				info.Expiring = true
				// No countdown: a message that changed at every run
				// would be a write of the Node's status each time.
				what := "expires on"
				if left <= 0 {
					what = "expired on"
				}
				name := first.Subject.CommonName
				if first != leaf {
					name = fmt.Sprintf("%s, in the chain of %s", name, leaf.Subject.CommonName)
				}
				expiring = append(expiring, fmt.Sprintf("%s (%s) %s %s", p, name, what, first.NotAfter.UTC().Format(time.RFC3339)))
			}
		}
		infos = append(infos, info)
	}
	details := []report.Detail{{Domain: "certs", Field: "certs", Value: infos}}
	if len(expiring) > 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonCertificateExpiringSoon,
			Message: strings.Join(expiring, "; ") + fmt.Sprintf(": not renewed within %s of expiry", c.within), Details: details}, nil
	}
	if len(unreadable) > 0 {
		// A certificate that exists and cannot be read (a dangling
		// symlink left by a broken rotation, a truncated file) may be
		// expiring: no claim that none is. The others are named.
		msg := strings.Join(unreadable, "; ")
		if checked > 0 {
			msg += fmt.Sprintf(" (%d other %s valid for more than %s)", checked, plural(checked, "certificate", "certificates"), c.within)
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
	msg := fmt.Sprintf("%d %s valid for more than %s", checked, plural(checked, "certificate", "certificates"), c.within)
	if len(absent) > 0 {
		msg += "; not present: " + strings.Join(absent, ", ")
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonCertificatesValid, Message: msg, Details: details}, nil
}

// daysLeft is the whole days from now to t, rounded down: 0 in the last day
// before t, negative once t is past (-1 in the first day after it). It is
// not counted from t.Sub(now): a time.Duration stops at about 292 years,
// and RFC 5280's notAfter for a certificate "with no well-defined
// expiration date", 99991231235959Z, is further than that (the left <
// within above is right all the same: the saturated Duration is still past
// the window).
func daysLeft(now, t time.Time) int {
	secs := float64(t.Unix()-now.Unix()) + float64(t.Nanosecond()-now.Nanosecond())/1e9
	return int(math.Floor(secs / (24 * 60 * 60)))
}

// readCertFile reads the certificates of a PEM file (the kubelet's
// *-current.pem files hold the certificate and its key; a file may hold a
// chain, in any order). It returns the leaf (LeafCertificate) and the
// certificate that expires first, the leaf or one of its chain: the file
// stops working when that one expires. A file that is absent is
// os.ErrNotExist; a symlink to nothing (a rotation that broke) is not: it is
// an error that says so. p is a host path, read under the host root root
// (its links resolved as the host resolves them: openNoWaitIn).
func readCertFile(root, p string) (leaf, first *x509.Certificate, err error) {
	certs, key, err := parseCertFile(root, p)
	if err != nil {
		return nil, nil, err
	}
	leaf = pickLeaf(certs, key)
	first = leaf
	for _, c := range certs {
		if c.NotAfter.Before(first.NotAfter) {
			first = c
		}
	}
	return leaf, first, nil
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
// it has none or it cannot be parsed).
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
