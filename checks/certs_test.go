package checks

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// certFixture is a certificate and its key, for building PEM files.
type certFixture struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// newCertFixture makes a certificate for cn, valid until notAfter, signed by
// parent (self-signed when parent is nil); ca makes it a CA.
func newCertFixture(t testing.TB, cn string, notAfter time.Time, ca bool, parent *certFixture) certFixture {
	t.Helper()
	return newCertFixtureFrom(t, cn, notAfter.Add(-365*24*time.Hour), notAfter, ca, parent)
}

// newCertFixtureFrom is newCertFixture valid from notBefore, not a year
// before notAfter.
func newCertFixtureFrom(t testing.TB, cn string, notBefore, notAfter time.Time, ca bool, parent *certFixture) certFixture {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter,
		BasicConstraintsValid: true, IsCA: ca}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certFixture{cert: c, key: key}
}

func (c certFixture) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
}

func (c certFixture) keyPEM(t testing.TB) []byte {
	t.Helper()
	kb, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// probeKubeletCert is a run of CertRenewalFailing on kubelet's client
// certificate under the host root root, at now (the clock's time where now
// is zero).
func probeKubeletCert(t *testing.T, root string, now time.Time) (Result, error) {
	t.Helper()
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		c.Checks.CertRenewalFailing.Certificates = []string{kubeletClientPEM}
	})
	if !now.IsZero() {
		env.Now = func() time.Time { return now }
	}
	c, _ := newCertCheck(env)
	return c.Probe(context.Background())
}

func writeCertFile(t *testing.T, path string, parts ...[]byte) {
	t.Helper()
	mkdir(t, filepath.Dir(path))
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

const (
	kubeletClientPEM = "/var/lib/kubelet/pki/kubelet-client-current.pem"
	kubeletServerPEM = "/var/lib/kubelet/pki/kubelet-server-current.pem"
)

// A certificate file that exists and cannot be read (a symlink to nothing,
// left by a rotation that broke; a file cut short by a full disk) may be
// expiring: the condition is Unknown (CheckFailed) naming it, never False
// because another certificate is valid, and not the "not present" of a
// certificate the node does not use.
func TestCertUnreadableIsNotValid(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, root string)
		wantErr string
	}{
		{"dangling symlink", func(t *testing.T, root string) {
			mkdir(t, root+"/var/lib/kubelet/pki")
			if err := os.Symlink("kubelet-client-2026-01-01-00-00-00.pem", root+kubeletClientPEM); err != nil {
				t.Fatal(err)
			}
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: dangling symlink to kubelet-client-2026-01-01-00-00-00.pem (a certificate rotation that broke?) (1 other certificate valid for more than 168h0m0s)"},
		{"truncated", func(t *testing.T, root string) {
			writeCertFile(t, root+kubeletClientPEM, []byte("-----BEGIN CERTIFICATE-----\nMIIB"))
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: a PEM block is not complete (a truncated file?) (1 other certificate valid for more than 168h0m0s)"},
		{"key whole, certificate cut short", func(t *testing.T, root string) {
			leaf := newCertFixture(t, "system:node:n1", now.Add(200*24*time.Hour), false, nil)
			c := leaf.certPEM()
			writeCertFile(t, root+kubeletClientPEM, leaf.keyPEM(t), c[:len(c)/2])
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: a PEM block is not complete (a truncated file?) (1 other certificate valid for more than 168h0m0s)"},
		// pem.Decode skips a block it cannot decode and goes on to the
		// next: a garbled certificate before a whole one was left out,
		// and the file judged by the others (a CA valid for years).
		{"garbled certificate, then a whole one", func(t *testing.T, root string) {
			ca := newCertFixture(t, "kubernetes-ca", now.Add(3650*24*time.Hour), true, nil)
			leaf := newCertFixture(t, "system:node:n1", now.Add(48*time.Hour), false, &ca)
			garbled := bytes.Replace(leaf.certPEM(), []byte("M"), []byte("*"), 1)
			writeCertFile(t, root+kubeletClientPEM, leaf.keyPEM(t), garbled, ca.certPEM())
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: PEM block 2 (CERTIFICATE) does not decode (a garbled file?) (1 other certificate valid for more than 168h0m0s)"},
		{"a certificate without its END line, then a whole one", func(t *testing.T, root string) {
			ca := newCertFixture(t, "kubernetes-ca", now.Add(3650*24*time.Hour), true, nil)
			inter := newCertFixture(t, "intermediate", now.Add(48*time.Hour), true, &ca)
			leaf := newCertFixture(t, "system:node:n1", now.Add(300*24*time.Hour), false, &inter)
			cut := bytes.Replace(inter.certPEM(), []byte("-----END CERTIFICATE-----\n"), nil, 1)
			writeCertFile(t, root+kubeletClientPEM, leaf.certPEM(), cut, leaf.keyPEM(t))
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: PEM block 2 (CERTIFICATE) does not decode (a garbled file?) (1 other certificate valid for more than 168h0m0s)"},
		{"empty", func(t *testing.T, root string) {
			writeCertFile(t, root+kubeletClientPEM)
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: no PEM certificate (1 other certificate valid for more than 168h0m0s)"},
		// Not a certificate file whatever it starts with: read up to the
		// bound, not whole (a path that names a log or an image would
		// be read into memory at every run).
		{"larger than the bound", func(t *testing.T, root string) {
			leaf := newCertFixture(t, "system:node:n1", now.Add(200*24*time.Hour), false, nil)
			writeCertFile(t, root+kubeletClientPEM, leaf.keyPEM(t), leaf.certPEM(), bytes.Repeat([]byte("\n"), maxCertFile))
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: larger than 4194304 bytes, not a certificate file (1 other certificate valid for more than 168h0m0s)"},
		{"a directory", func(t *testing.T, root string) {
			mkdir(t, root+kubeletClientPEM)
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem: not a regular file (1 other certificate valid for more than 168h0m0s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			srv := newCertFixture(t, "system:node:n1", now.Add(300*24*time.Hour), false, nil)
			writeCertFile(t, root+kubeletServerPEM, srv.keyPEM(t), srv.certPEM())
			env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
			env.Now = func() time.Time { return now }
			c, _ := newCertCheck(env)
			r, err := c.Probe(context.Background())
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("got %s/%s %q, error %v\nwant the error %q", r.Status, r.Reason, r.Message, err, tc.wantErr)
			}
			// The certs domain still says what each file is.
			if infos, _ := r.Details[0].Value.([]CertInfo); len(infos) != 2 || infos[0].Error == "" || infos[0].Error == "not present" || infos[1].DaysLeft != 300 {
				t.Errorf("certs domain: %+v", r.Details)
			}

			// Through the runner: Unknown, CheckFailed.
			store := report.NewStore("b")
			runner, err := NewRunner(env, Options{Store: store, Only: []string{"CertRenewalFailing"}})
			if err != nil {
				t.Fatal(err)
			}
			runner.RunOnce(context.Background())
			if got, _ := store.Get("CertRenewalFailing"); got.Status != report.StatusUnknown || got.Reason != report.ReasonCheckFailed {
				t.Errorf("through the runner: %s/%s %q", got.Status, got.Reason, got.Message)
			}
		})
	}
}

// A file with a chain is judged by the certificate in it that expires first,
// whatever the order: the leaf after its CA, or an intermediate that expired
// before the leaf. A long-lived chain does not hide a leaf about to expire,
// and a leaf after its CA is still the leaf.
func TestCertChainIsJudgedByTheFirstToExpire(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ca := newCertFixture(t, "kubernetes-ca", now.Add(3650*24*time.Hour), true, nil)
	for _, tc := range []struct {
		name    string
		file    func(t *testing.T) []byte
		wantMsg string
		wantSub string
	}{
		{"CA first, leaf expires in 2 days", func(t *testing.T) []byte {
			leaf := newCertFixture(t, "system:node:n1", now.Add(48*time.Hour), false, &ca)
			return append(ca.certPEM(), leaf.certPEM()...)
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem (system:node:n1) expires on 2026-12-04T12:00:00Z: not renewed within 168h0m0s of expiry",
			"CN=system:node:n1"},
		{"key, CA, then the leaf", func(t *testing.T) []byte {
			leaf := newCertFixture(t, "system:node:n1", now.Add(48*time.Hour), false, &ca)
			return append(append(leaf.keyPEM(t), ca.certPEM()...), leaf.certPEM()...)
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem (system:node:n1) expires on 2026-12-04T12:00:00Z: not renewed within 168h0m0s of expiry",
			"CN=system:node:n1"},
		{"leaf fine, intermediate expired", func(t *testing.T) []byte {
			inter := newCertFixture(t, "intermediate", now.Add(-time.Hour), true, &ca)
			leaf := newCertFixture(t, "system:node:n1", now.Add(300*24*time.Hour), false, &inter)
			return append(append(leaf.keyPEM(t), leaf.certPEM()...), inter.certPEM()...)
		}, "/var/lib/kubelet/pki/kubelet-client-current.pem (intermediate, in the chain of system:node:n1) expired on 2026-12-02T11:00:00Z: not renewed within 168h0m0s of expiry",
			"CN=intermediate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeCertFile(t, root+kubeletClientPEM, tc.file(t))
			env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
			env.Now = func() time.Time { return now }
			c, _ := newCertCheck(env)
			r, err := c.Probe(context.Background())
			if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonCertificateExpiringSoon || r.Message != tc.wantMsg {
				t.Errorf("got %s/%s %q, error %v\nwant True/CertificateExpiringSoon %q", r.Status, r.Reason, r.Message, err, tc.wantMsg)
			}
			if infos, _ := r.Details[0].Value.([]CertInfo); len(infos) != 2 || infos[0].Subject != tc.wantSub {
				t.Errorf("certs domain: %+v, want subject %q", r.Details, tc.wantSub)
			}
		})
	}
}

// The leaf of a file is the certificate of its key, else the first that is
// not a CA: the node name is read from it (system:node:<name>).
func TestLeafCertificate(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ca := newCertFixture(t, "kubernetes-ca", now.Add(3650*24*time.Hour), true, nil)
	leaf := newCertFixture(t, "system:node:n1", now.Add(300*24*time.Hour), false, &ca)
	other := newCertFixture(t, "system:node:other", now.Add(300*24*time.Hour), false, &ca)
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		parts [][]byte
		want  string
	}{
		{"key and certificate", [][]byte{leaf.keyPEM(t), leaf.certPEM()}, "system:node:n1"},
		{"CA first", [][]byte{ca.certPEM(), leaf.certPEM()}, "system:node:n1"},
		{"the key's certificate, not the first that is not a CA", [][]byte{other.certPEM(), ca.certPEM(), leaf.certPEM(), leaf.keyPEM(t)}, "system:node:n1"},
		{"only a CA", [][]byte{ca.certPEM()}, "kubernetes-ca"},
	} {
		p := filepath.Join(dir, "c.pem")
		writeCertFile(t, p, tc.parts...)
		c, err := LeafCertificate("/", p)
		if err != nil || c.Subject.CommonName != tc.want {
			t.Errorf("%s: got %v, %v; want CN %q", tc.name, c, err, tc.want)
		}
	}
}

// A certificate path that names a FIFO (or a device) is refused at once:
// before, its read waited for a writer that never came, the run was
// abandoned at its timeout and every later run found it still running.
func TestCertFIFOIsRefusedAtOnce(t *testing.T) {
	root := t.TempDir()
	mkdir(t, root+"/var/lib/kubelet/pki")
	if err := syscall.Mkfifo(root+kubeletClientPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	c, _ := newCertCheck(env)
	want := "/var/lib/kubelet/pki/kubelet-client-current.pem: not a regular file"
	if err := probeFIFO(t, c, root+kubeletClientPEM); err == nil || err.Error() != want {
		t.Errorf("a FIFO: %v; want %q", err, want)
	}
}

// FuzzParseCertPEM: whatever a certificate file holds, parsing it is an
// error or at least one certificate (a leaf to judge), never a panic; and
// it is differential against encoding/pem and crypto/x509 read plainly:
// every block pem.Decode finds in turn, each CERTIFICATE block parsed by
// x509.ParseCertificate. Where parseCertPEM accepts, the plain reading
// accepts the same certificates in the same order, and the NotAfter that
// the check reads (the earliest, judgeCerts' first) is x509's earliest;
// where the plain reading accepts (one certificate at least, each parsing)
// parseCertPEM accepts too, but for its two deliberate refusals: a BEGIN
// line pem.Decode skipped on the way to a block (a garbled block, maybe
// the certificate that expires first), and a BEGIN line after the last
// block (a truncated file).
func FuzzParseCertPEM(f *testing.F) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ca := newCertFixture(f, "kubernetes-ca", now.Add(3650*24*time.Hour), true, nil)
	leaf := newCertFixture(f, "system:node:n1", now.Add(200*24*time.Hour), false, &ca)
	f.Add(append(leaf.keyPEM(f), leaf.certPEM()...))
	f.Add(append(ca.certPEM(), leaf.certPEM()...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMIIB"))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"))
	f.Add(append(append([]byte("-----BEGIN CERTIFICATE-----\n!!\n"), leaf.certPEM()...), ca.certPEM()...))
	f.Add(append(append(leaf.certPEM(), "junk\n"...), ca.certPEM()[:40]...))
	f.Add(append(leaf.certPEM(), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, pub, err := parseCertPEM(b)
		if err == nil {
			if len(certs) == 0 {
				t.Fatal("no error and no certificate")
			}
			if pickLeaf(certs, pub) == nil {
				t.Fatal("no leaf")
			}
		}
		// The plain reading.
		var plain []*x509.Certificate
		var plainErr error
		skipped := false
		rest := b
		for {
			blk, r := pem.Decode(rest)
			if blk == nil {
				break
			}
			if bytes.Count(rest[:len(rest)-len(r)], []byte("-----BEGIN")) > 1 {
				skipped = true
			}
			rest = r
			if blk.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil && plainErr == nil {
				plainErr = err
			}
			plain = append(plain, c)
		}
		truncated := bytes.Contains(rest, []byte("-----BEGIN"))
		plainOK := plainErr == nil && len(plain) > 0
		switch {
		case err == nil && !plainOK:
			t.Fatalf("accepted %d certificates; pem and x509 read %d, %v", len(certs), len(plain), plainErr)
		case err == nil:
			if len(certs) != len(plain) {
				t.Fatalf("read %d certificates; pem and x509 read %d", len(certs), len(plain))
			}
			first, earliest := certs[0], plain[0]
			for i := range certs {
				if !bytes.Equal(certs[i].Raw, plain[i].Raw) {
					t.Fatalf("certificate %d differs from x509's", i+1)
				}
				if certs[i].NotAfter.Before(first.NotAfter) {
					first = certs[i]
				}
				if plain[i].NotAfter.Before(earliest.NotAfter) {
					earliest = plain[i]
				}
			}
			if !first.NotAfter.Equal(earliest.NotAfter) {
				t.Fatalf("NotAfter %v; x509's earliest %v", first.NotAfter, earliest.NotAfter)
			}
		case plainOK && !skipped && !truncated:
			t.Fatalf("refused (%v) what pem and x509 read as %d certificates", err, len(plain))
		}
	})
}

// The certs domain gives daysLeft only for a certificate it read: a file
// that is absent or cannot be read has its error and no daysLeft, where a
// 0 read as "expires today" (`jq '.certs[] | select(.daysLeft < 7)'`
// picked the absent kubelet-server-current.pem of every node without
// serverTLSBootstrap). A certificate that expires within the day still has
// its 0.
func TestCertDomainHasNoDaysLeftForAFileNotRead(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	root := t.TempDir()
	leaf := newCertFixture(t, "system:node:n1", now.Add(10*time.Hour), false, nil)
	writeCertFile(t, root+kubeletClientPEM, leaf.keyPEM(t), leaf.certPEM())
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		c.Checks.CertRenewalFailing.Certificates = []string{kubeletClientPEM, kubeletServerPEM, "/etc/garbage.pem"}
	})
	writeCertFile(t, root+"/etc/garbage.pem", []byte("not pem"))
	env.Now = func() time.Time { return now }
	c, _ := newCertCheck(env)
	r, _ := c.Probe(context.Background())
	got, err := json.Marshal(r.Details[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"path":"/var/lib/kubelet/pki/kubelet-client-current.pem","subject":"CN=system:node:n1","notAfter":"2026-12-02T22:00:00Z","daysLeft":0,"renewWithin":"168h0m0s"},` +
		`{"path":"/var/lib/kubelet/pki/kubelet-server-current.pem","error":"not present"},` +
		`{"path":"/etc/garbage.pem","error":"no PEM certificate"}]`
	if string(got) != want {
		t.Errorf("certs domain:\n%s\nwant\n%s", got, want)
	}
}

// A certificate's daysLeft is the days to its notAfter, however far: RFC
// 5280 gives 99991231235959Z to a certificate "with no well-defined
// expiration date", and a time.Duration stops at about 292 years, so a
// count made of one would say 106751 days of a notAfter 7973 years away
// (and of one as far past). The report's notAfter and daysLeft agree.
func TestCertDaysLeftOfAFarDate(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		notAfter time.Time
		want     int
	}{
		// 2026-12-02 to 9999-12-02: 7973 years, 1933 of them leap years
		// (every 4th of 2028..9996, less the 60 centuries not a 400th).
		{"no well-defined expiration", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), 7973*365 + 1933 + 29},
		{"a year ahead", now.Add(365 * 24 * time.Hour), 365},
		{"expired 400 years ago", time.Date(1626, 12, 2, 12, 0, 0, 0, time.UTC), -(400*365 + 97)},
		// Less than a day either side: 0 days left before notAfter, -1 once
		// past (jq's select(.daysLeft < 0) finds the expired ones).
		{"12 hours left", now.Add(12 * time.Hour), 0},
		{"expired 12 hours ago", now.Add(-12 * time.Hour), -1},
		{"expired a second ago", now.Add(-time.Second), -1},
		{"expired 36 hours ago", now.Add(-36 * time.Hour), -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			leaf := newCertFixture(t, "ca", tc.notAfter, true, nil)
			writeCertFile(t, root+kubeletClientPEM, leaf.certPEM())
			r, _ := probeKubeletCert(t, root, now)
			infos, _ := r.Details[0].Value.([]CertInfo)
			if len(infos) != 1 || !infos[0].NotAfter.Equal(tc.notAfter) || infos[0].DaysLeft != tc.want {
				t.Errorf("certs domain: %+v, want notAfter %s, daysLeft %d", infos, tc.notAfter.Format(time.RFC3339), tc.want)
			}
		})
	}
}

// A node with no certificate configured (certificates = []) has a certs
// document that says so: "certs":[], not null, which jq and a Go client
// read as the absent field of a check that has not run yet.
func TestCertDomainOfNoCertificatesIsAnEmptyList(t *testing.T) {
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = t.TempDir()
		c.Checks.CertRenewalFailing.Certificates = nil
	})
	c, _ := newCertCheck(env)
	r, err := c.Probe(context.Background())
	if err != nil || r.Reason != report.ReasonNothingToCheck {
		t.Fatalf("got %s/%s %q, error %v; want Unknown/NothingToCheck", r.Status, r.Reason, r.Message, err)
	}
	d := report.NewDetails()
	d.Replace("CertRenewalFailing", r.Details)
	docs, err := d.Documents(time.Now(), report.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(docs[report.AnnotationPrefix+"certs"]), &doc); err != nil {
		t.Fatal(err)
	}
	if string(doc["certs"]) != "[]" {
		t.Errorf("certs document %s, want \"certs\":[]", docs[report.AnnotationPrefix+"certs"])
	}
}

// kubelet's certificate store points kubelet-client-current.pem at the
// dated file with an absolute target
// (/var/lib/kubelet/pki/kubelet-client-<date>.pem). Under a host_root
// other than / that target is the host's file under the root, not one
// under the daemon's own /: before, the check found "a dangling symlink
// (a certificate rotation that broke?)" where the host's certificate was
// valid, and a certificate by that name under the daemon's own / would
// have been judged in its place. A link that leaves the root by ".." stays
// in it, as the host would resolve it.
func TestCertKubeletsAbsoluteSymlinkUnderHostRoot(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	const dated = "/var/lib/kubelet/pki/kubelet-client-2026-06-01-00-00-00.pem"
	for _, tc := range []struct {
		name, target string
		wantStatus   report.Status
		wantMsg      string
	}{
		{"absolute, as kubelet writes it", dated, report.StatusTrue,
			"/var/lib/kubelet/pki/kubelet-client-current.pem (system:node:n1) expires on 2026-12-05T12:00:00Z: not renewed within 168h0m0s of expiry"},
		{"up and out of the root", "../../../../../../../.." + dated, report.StatusTrue,
			"/var/lib/kubelet/pki/kubelet-client-current.pem (system:node:n1) expires on 2026-12-05T12:00:00Z: not renewed within 168h0m0s of expiry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			leaf := newCertFixture(t, "system:node:n1", now.Add(72*time.Hour), false, nil)
			writeCertFile(t, root+dated, leaf.certPEM(), leaf.keyPEM(t))
			if err := os.Symlink(tc.target, root+kubeletClientPEM); err != nil {
				t.Fatal(err)
			}
			r, err := probeKubeletCert(t, root, now)
			if err != nil || r.Status != tc.wantStatus || r.Message != tc.wantMsg {
				t.Errorf("got %s/%s %q, %v\nwant %s %q", r.Status, r.Reason, r.Message, err, tc.wantStatus, tc.wantMsg)
			}
		})
	}

	// Gone from the root, it is the dangling link it is.
	root := t.TempDir()
	mkdir(t, root+"/var/lib/kubelet/pki")
	if err := os.Symlink(dated, root+kubeletClientPEM); err != nil {
		t.Fatal(err)
	}
	_, err := probeKubeletCert(t, root, time.Time{})
	if want := "/var/lib/kubelet/pki/kubelet-client-current.pem: dangling symlink to " + dated + " (a certificate rotation that broke?)"; err == nil || err.Error() != want {
		t.Errorf("a link to nothing under the root: %v\nwant %q", err, want)
	}
}

// kubelet's directory moved to a larger disk and left as an absolute
// symbolic link (/var/lib/kubelet -> /data/kubelet), under a host_root
// other than /: the certificate through it resolves under the root, and so
// must the link left to nothing by a rotation that broke. Before, the
// dangling link was looked up from the daemon's own / (os.Readlink of the
// joined path follows /var/lib/kubelet out of the root), not found, and
// taken for an absent certificate: Unknown, NothingToCheck, "none of the 1
// configured certificates exists", where the host has a broken rotation
// (CheckFailed, naming it).
func TestCertDanglingSymlinkUnderALinkedDirectoryUnderHostRoot(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	const dated = "/var/lib/kubelet/pki/kubelet-client-2026-06-01-00-00-00.pem"
	root := t.TempDir()
	mkdir(t, root+"/var/lib")
	mkdir(t, root+"/data/kubelet/pki")
	if err := os.Symlink("/data/kubelet", root+"/var/lib/kubelet"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dated, root+"/data/kubelet/pki/kubelet-client-current.pem"); err != nil {
		t.Fatal(err)
	}
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		c.Checks.CertRenewalFailing.Certificates = []string{kubeletClientPEM}
	})
	env.Now = func() time.Time { return now }
	c, _ := newCertCheck(env)
	r, err := c.Probe(context.Background())
	if want := kubeletClientPEM + ": dangling symlink to " + dated + " (a certificate rotation that broke?)"; err == nil || err.Error() != want {
		t.Errorf("a link to nothing through a linked directory: %s/%s %q, %v\nwant the error %q", r.Status, r.Reason, r.Message, err, want)
	}

	// The rotation writes the dated file: it is read through both links.
	leaf := newCertFixture(t, "system:node:n1", now.Add(72*time.Hour), false, nil)
	writeCertFile(t, root+"/data/kubelet/pki/kubelet-client-2026-06-01-00-00-00.pem", leaf.certPEM(), leaf.keyPEM(t))
	r, err = c.Probe(context.Background())
	if want := kubeletClientPEM + " (system:node:n1) expires on 2026-12-05T12:00:00Z: not renewed within 168h0m0s of expiry"; err != nil || r.Status != report.StatusTrue || r.Message != want {
		t.Errorf("the dated file written: %s/%s %q, %v\nwant True %q", r.Status, r.Reason, r.Message, err, want)
	}
}
