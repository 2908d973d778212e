package harness

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// repoRoot finds the repository root from this source file.
func repoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(f), "..", ".."))
}

var buildOnce sync.Once
var buildErr error

// K8sBinaries builds (once per machine; cached under tests/.cache/bin and
// rebuilt only when the tools module changes) and returns the paths of
// kube-apiserver and etcd.
func K8sBinaries() (kas, etcd string, err error) {
	root := repoRoot()
	bin := filepath.Join(root, "tests", ".cache", "bin")
	buildOnce.Do(func() {
		cmd := exec.Command("bash", filepath.Join(root, "tests", "tools", "k8s", "build.sh"), bin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building kube-apiserver and etcd (tests/tools/k8s/build.sh): %v\n%s", err, out)
		}
	})
	return filepath.Join(bin, "kube-apiserver"), filepath.Join(bin, "etcd"), buildErr
}

// APIServer is a real kube-apiserver with etcd on loopback, with the Node
// authorizer and the NodeRestriction admission plugin on.
type APIServer struct {
	Dir   string
	URL   string
	CA    *CA
	Admin kubernetes.Interface
	// AuditLog is the audit log's path (--audit-log-path) when
	// APIOptions.AuditPolicy is set.
	AuditLog string
	opts     APIOptions
	kasBin   string
	etcdBin  string
	kasPort  int
	etcdURL  string
	etcd     *proc
	kas      *proc
}

// proc is a started process and a channel closed when it exits.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(c *exec.Cmd) (*proc, error) {
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: c, done: make(chan struct{})}
	go func() { c.Wait(); close(p.done) }()
	return p, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// APIOptions are optional settings of kube-apiserver.
type APIOptions struct {
	// AuditPolicy, when set, is an audit.k8s.io/v1 Policy (YAML): it is
	// written to <dir>/audit-policy.yaml (--audit-policy-file), and the log
	// backend writes JSON lines to <dir>/audit/audit.log (--audit-log-path).
	AuditPolicy string
	// AuditLogMaxSizeMB is --audit-log-maxsize, the size in MiB at which
	// kube-apiserver rotates the log (0: its default, 100).
	AuditLogMaxSizeMB int
	// AuditLogMaxBackups is --audit-log-maxbackup (0: its default, 100).
	AuditLogMaxBackups int
}

// StartAPIServer builds the binaries if needed, generates a PKI, and starts
// etcd and kube-apiserver in dir. Stop with Stop.
func StartAPIServer(dir string) (*APIServer, error) { return StartAPIServerWith(dir, APIOptions{}) }

// StartAPIServerWith is StartAPIServer with options.
func StartAPIServerWith(dir string, opts APIOptions) (*APIServer, error) {
	kas, etcd, err := K8sBinaries()
	if err != nil {
		return nil, err
	}
	s := &APIServer{Dir: dir, kasBin: kas, etcdBin: etcd, opts: opts}
	if opts.AuditPolicy != "" {
		if err := os.WriteFile(filepath.Join(dir, "audit-policy.yaml"), []byte(opts.AuditPolicy), 0o600); err != nil {
			return nil, err
		}
		s.AuditLog = filepath.Join(dir, "audit", "audit.log")
	}
	if s.CA, err = NewCA(); err != nil {
		return nil, err
	}
	pki := filepath.Join(dir, "pki")
	os.MkdirAll(pki, 0o700)
	write := func(name string, b []byte) error { return os.WriteFile(filepath.Join(pki, name), b, 0o600) }
	if err := write("ca.crt", s.CA.CertPEM); err != nil {
		return nil, err
	}
	sc, sk, err := s.CA.Issue("kube-apiserver", nil, true, time.Now().Add(24*time.Hour))
	if err != nil {
		return nil, err
	}
	write("apiserver.crt", sc)
	write("apiserver.key", sk)
	if err := writeServiceAccountKeys(pki); err != nil {
		return nil, err
	}
	if err := s.startEtcd(); err != nil {
		s.Stop()
		return nil, err
	}
	// Stopped and started again on this port (StopKubeAPIServerFor):
	// below the ephemeral range, where no bind to port 0 of another test
	// or process takes it meanwhile.
	if s.kasPort, err = FreeLoopbackPort(); err != nil {
		s.Stop()
		return nil, err
	}
	s.URL = "https://127.0.0.1:" + strconv.Itoa(s.kasPort)
	if err := s.StartKubeAPIServer(); err != nil {
		s.Stop()
		return nil, err
	}
	adminCfg, err := s.Kubeconfig("admin", "admin", []string{"system:masters"}, time.Now().Add(24*time.Hour))
	if err != nil {
		s.Stop()
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", adminCfg)
	if err != nil {
		s.Stop()
		return nil, err
	}
	// One client for every test of the process, the harness.Parallel ones
	// at once (client-go's default: 5 requests a second, a burst of 10,
	// shared by them all); their polls of a Node every 20 ms would wait on
	// each other's turns past their windows of 5-10 s.
	cfg.QPS, cfg.Burst = 50, 100
	if s.Admin, err = kubernetes.NewForConfig(cfg); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *APIServer) logFile(name string) *os.File {
	f, _ := os.OpenFile(filepath.Join(s.Dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	return f
}

func (s *APIServer) startEtcd() error {
	cp, err := freePort()
	if err != nil {
		return err
	}
	pp, err := freePort()
	if err != nil {
		return err
	}
	s.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", cp)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
	cmd := exec.Command(s.etcdBin, "--name=test", "--data-dir="+filepath.Join(s.Dir, "etcd-data"),
		"--listen-client-urls="+s.etcdURL, "--advertise-client-urls="+s.etcdURL,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=test="+peer,
		"--unsafe-no-fsync", "--quota-backend-bytes=2147483648")
	cmd.Stdout = s.logFile("etcd.log")
	cmd.Stderr = cmd.Stdout
	if s.etcd, err = startProc(cmd); err != nil {
		return err
	}
	return waitHTTP(http.DefaultClient, s.etcdURL+"/health", s.etcd, 30*time.Second)
}

// StartKubeAPIServer (re)starts kube-apiserver on the same port and etcd.
func (s *APIServer) StartKubeAPIServer() error {
	pki := filepath.Join(s.Dir, "pki")
	cmd := exec.Command(s.kasBin,
		"--advertise-address=127.0.0.1", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(s.kasPort),
		"--etcd-servers="+s.etcdURL, "--cert-dir="+filepath.Join(s.Dir, "kas-certs"),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+filepath.Join(pki, "ca.crt"),
		"--service-account-issuer="+s.URL, "--service-account-key-file="+filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--endpoint-reconciler-type=none")
	if s.opts.AuditPolicy != "" {
		cmd.Args = append(cmd.Args, "--audit-policy-file="+filepath.Join(s.Dir, "audit-policy.yaml"),
			"--audit-log-path="+s.AuditLog, "--audit-log-format=json")
		if s.opts.AuditLogMaxSizeMB > 0 {
			cmd.Args = append(cmd.Args, "--audit-log-maxsize="+strconv.Itoa(s.opts.AuditLogMaxSizeMB))
		}
		if s.opts.AuditLogMaxBackups > 0 {
			cmd.Args = append(cmd.Args, "--audit-log-maxbackup="+strconv.Itoa(s.opts.AuditLogMaxBackups))
		}
	}
	cmd.Stdout = s.logFile("apiserver.log")
	cmd.Stderr = cmd.Stdout
	var err error
	if s.kas, err = startProc(cmd); err != nil {
		return err
	}
	cert, key, err := s.CA.Issue("admin", []string{"system:masters"}, false, time.Now().Add(time.Hour))
	if err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.CA.Cert)
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	if err := waitHTTP(c, s.URL+"/readyz", s.kas, 90*time.Second); err != nil {
		s.StopKubeAPIServer() // not started: StopKubeAPIServerFor's end starts it again
		return err
	}
	return nil
}

// StopKubeAPIServer stops kube-apiserver, leaving etcd running.
func (s *APIServer) StopKubeAPIServer() {
	stop(s.kas)
	s.kas = nil
}

// StopKubeAPIServerFor stops kube-apiserver, as StopKubeAPIServer does,
// and starts it again when t ends unless t has (or it would not start):
// the package's tests share it, and one that failed during its outage
// (a t.Fatal before its StartKubeAPIServer) left it stopped for every
// test after it, each failing on a refused port.
func (s *APIServer) StopKubeAPIServerFor(t testing.TB) {
	t.Helper()
	s.StopKubeAPIServer()
	t.Cleanup(func() {
		if s.kas != nil {
			return
		}
		if err := s.StartKubeAPIServer(); err != nil {
			t.Errorf("starting kube-apiserver again, for the tests after this one: %v", err)
		}
	})
}

// Stop stops everything.
func (s *APIServer) Stop() {
	stop(s.kas)
	stop(s.etcd)
}

func stop(p *proc) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func waitHTTP(c *http.Client, url string, p *proc, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered (see its log)", filepath.Base(p.cmd.Path), url)
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer within %s", url, limit)
		case <-tick.C:
		}
	}
}

// Kubeconfig issues a client certificate for user (in groups) valid until
// notAfter and writes a kubeconfig that names the certificate and key by
// path, as kubelet.conf does. It returns the kubeconfig's path.
func (s *APIServer) Kubeconfig(name, user string, groups []string, notAfter time.Time) (string, error) {
	dir := filepath.Join(s.Dir, "clients", name)
	os.MkdirAll(dir, 0o700)
	if err := s.WriteClientCert(filepath.Join(dir, "client.pem"), user, groups, notAfter); err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kubeconfig")
	return p, s.WriteKubeconfig(p, name, filepath.Join(dir, "client.pem"))
}

// WriteKubeconfig writes at path a kubeconfig for the API server whose user
// name authenticates with the certificate and key both in the PEM file
// certAndKey, named by path, as kubelet.conf names
// kubelet-client-current.pem.
func (s *APIServer) WriteKubeconfig(path, name, certAndKey string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, s.URL, filepath.Join(s.Dir, "pki", "ca.crt"), name, certAndKey, certAndKey, name)
	return os.WriteFile(path, []byte(kc), 0o600)
}

// HTTPClient returns an HTTP client that authenticates to the API server
// with a client certificate for user (in groups), for requests that set
// their own headers.
func (s *APIServer) HTTPClient(user string, groups []string) (*http.Client, error) {
	cert, key, err := s.CA.Issue(user, groups, false, time.Now().Add(time.Hour))
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.CA.Cert)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}, nil
}

// NodeKubeconfig is Kubeconfig for system:node:<node> in group system:nodes.
func (s *APIServer) NodeKubeconfig(node string, notAfter time.Time) (string, error) {
	return s.Kubeconfig(node, "system:node:"+node, []string{"system:nodes"}, notAfter)
}

// WriteClientCert writes certificate and key into one PEM file, atomically
// (as the kubelet's kubelet-client-current.pem holds both).
func (s *APIServer) WriteClientCert(path, user string, groups []string, notAfter time.Time) error {
	cert, key, err := s.CA.Issue(user, groups, false, notAfter)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(cert, key...), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
