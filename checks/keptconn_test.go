package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/report"
)

// restartListener counts the connections it accepts; after restart(),
// those accepted so far are closed by the server as soon as the client
// sends a new request on them, without an answer: what a kept connection to
// a service that restarted looks like to a client that has not yet seen it
// close. With h2 (the CRI's HTTP/2), a new request is a HEADERS frame: the
// frames a client sends after an answer (a PING's ack, a WINDOW_UPDATE) do
// not close it, or the client would see the close before its next call.
type restartListener struct {
	net.Listener
	h2       bool
	accepted atomic.Int32
	mu       sync.Mutex
	conns    []*restartConn
}

type restartConn struct {
	net.Conn
	gone atomic.Bool
	h2   bool
	// The HTTP/2 framing read so far (Read is called by one goroutine).
	preface int    // bytes of the client's preface still to come
	hdr     []byte // a frame header read in part
	skip    int    // bytes of the current frame's payload still to come
}

func (c *restartConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	request := n > 0
	if c.h2 {
		request = c.headers(p[:n])
	}
	if request && c.gone.Load() {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return n, err
}

// headers follows the HTTP/2 frames in b and reports whether a HEADERS
// frame (a new request) starts in it.
func (c *restartConn) headers(b []byte) (headers bool) {
	for len(b) > 0 {
		switch {
		case c.preface > 0:
			k := min(c.preface, len(b))
			c.preface, b = c.preface-k, b[k:]
		case c.skip > 0:
			k := min(c.skip, len(b))
			c.skip, b = c.skip-k, b[k:]
		default:
			k := min(9-len(c.hdr), len(b))
			c.hdr, b = append(c.hdr, b[:k]...), b[k:]
			if len(c.hdr) == 9 {
				c.skip = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
				headers = headers || c.hdr[3] == 0x1 // HEADERS
				c.hdr = c.hdr[:0]
			}
		}
	}
	return headers
}

func (l *restartListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	rc := &restartConn{Conn: c, h2: l.h2}
	if l.h2 {
		rc.preface = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	}
	l.mu.Lock()
	l.conns = append(l.conns, rc)
	l.mu.Unlock()
	return rc, nil
}

func (l *restartListener) restart() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.gone.Store(true)
	}
}

// prober makes one probe with f that must succeed.
func prober(t *testing.T, f func(context.Context) error) func(what string) {
	return func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// probeRestarted probes three times on one kept connection, then once
// after the service restarted.
func probeRestarted(t *testing.T, rl *restartListener, probe func(what string)) {
	t.Helper()
	for range 3 {
		probe("healthy")
	}
	if n := rl.accepted.Load(); n != 1 {
		t.Errorf("%d connections for 3 probes, want 1 kept", n)
	}
	rl.restart()
	probe("after the service restarted")
}

// The CRI probe keeps its connection between probes (one connection for
// three probes), and a connection the runtime dropped by restarting is not
// an outage: the call is made once more on a new connection.
func TestCRIProbeKeepsItsConnection(t *testing.T) {
	sock := t.TempDir() + "/cri.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rl := &restartListener{Listener: ln, h2: true}
	s := grpc.NewServer()
	ready := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
		return conditions(ready), nil
	}})
	go s.Serve(rl)
	defer s.Stop()
	c := newCRIClient(sock)
	defer c.close()
	probe := prober(t, c.status)
	probeRestarted(t, rl, probe)
	if n := rl.accepted.Load(); n != 2 || c.retried != 1 {
		t.Errorf("after the restart: %d connections, %d calls made again; want 2 and 1", n, c.retried)
	}
	probe("on the new connection")
	if n := rl.accepted.Load(); n != 2 || c.retried != 1 {
		t.Errorf("then: %d connections, %d calls made again; want 2 and 1", n, c.retried)
	}
	if ctx, raw := rawTrace(t); c.status(ctx) != nil || !raw() {
		t.Errorf("the kept connection is not a rawsys one")
	}
	// The socket removed while the runtime runs on: the probe fails as a
	// new client would (kubelet restarted now could not connect), though
	// the kept connection still works.
	if err := os.Rename(sock, sock+".away"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.status(ctx); err == nil || !strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("socket removed: %v, want the dial's error", err)
	}
	if err := os.Rename(sock+".away", sock); err != nil {
		t.Fatal(err)
	}
	probe("socket back")
	probe("socket back, again")
	if n := rl.accepted.Load(); n != 3 {
		t.Errorf("socket back: %d connections, want 3 (one new, kept)", n)
	}
	// The socket replaced (a new runtime listening at the path while the
	// old one still answers on its connection): the probe asks the new one.
	if err := os.Rename(sock, sock+".old"); err != nil {
		t.Fatal(err)
	}
	ln2, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rl2 := &restartListener{Listener: ln2, h2: true}
	s2 := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s2, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
		return conditions(ready), nil
	}})
	go s2.Serve(rl2)
	defer s2.Stop()
	probe("socket replaced")
	if n, n2 := rl.accepted.Load(), rl2.accepted.Load(); n != 3 || n2 != 1 {
		t.Errorf("socket replaced: %d connections to the old runtime, %d to the new; want 3 and 1", n, n2)
	}
	// The check closed (removed by a reload): its connection is let go
	// (see the kubelet's test below).
	closeLetsGo(t, &rl2.accepted, (&containerdCheck{cri: c}).Close, probe)
}

// The kubelet probe keeps its connection too, and kubelet's restart
// between two probes is not an outage (net/http makes the GET again on a
// new connection).
func TestKubeletProbeKeepsItsConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &restartListener{Listener: ln}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })}
	go srv.Serve(rl)
	defer srv.Close()
	env := testEnv(t, func(c *config.Config) {
		c.Checks.KubeletUnhealthy.HealthzURL = "http://" + ln.Addr().String() + "/healthz"
	})
	ch, err := newKubeletCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	k := ch.(*kubeletCheck)
	probe := prober(t, k.probe)
	probeRestarted(t, rl, probe)
	if n := rl.accepted.Load(); n != 2 {
		t.Errorf("after the restart: %d connections, want 2", n)
	}
	if ctx, raw := rawTrace(t); k.probe(ctx) != nil || !raw() {
		t.Errorf("the kept connection is not a rawsys one")
	}
	// Closed (the check removed by a reload): the connection is let go,
	// and a probe still running then may make a new one.
	closeLetsGo(t, &rl.accepted, k.Close, probe)
}

// rawTrace is a context whose GotConn hook records whether the connection
// a probe got is a rawsys one (its reads and writes do not wake the
// runtime's sysmon), and the function that says so once one was got:
// rawsys.Wrap refuses silently what it cannot wrap, so a change to a
// probe's dial would otherwise go unnoticed.
func rawTrace(t *testing.T) (context.Context, func() bool) {
	var raw, seen atomic.Bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		_, ok := i.Conn.(*rawsys.Conn)
		raw.Store(ok)
		seen.Store(true)
	}})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	t.Cleanup(cancel)
	return ctx, func() bool { return seen.Load() && raw.Load() }
}

// healthyProbe is a probe of ch that fails unless ch finds the service
// healthy (False).
func healthyProbe(ch Check) func(context.Context) error {
	return func(ctx context.Context) error {
		r, err := ch.Probe(ctx)
		if err == nil && r.Status != report.StatusFalse {
			err = fmt.Errorf("%s %s: %s", r.Status, r.Reason, r.Message)
		}
		return err
	}
}

// keepsAndSurvivesARestart probes ch three times on one kept connection to
// rl's service, then once after the service restarted (a new connection,
// no outage), and checks that the connection is a rawsys one. It returns
// the probe.
func keepsAndSurvivesARestart(t *testing.T, rl *restartListener, ch Check) func(string) {
	t.Helper()
	healthy := healthyProbe(ch)
	probe := prober(t, healthy)
	probeRestarted(t, rl, probe)
	if n := rl.accepted.Load(); n != 2 {
		t.Errorf("after the restart: %d connections, want 2", n)
	}
	if ctx, raw := rawTrace(t); healthy(ctx) != nil || !raw() {
		t.Errorf("the kept connection is not a rawsys one")
	}
	return probe
}

// closeLetsGo closes a check's kept connection (the check removed by a
// reload) until a probe after it needs a new one: the transport puts a
// connection back among the idle ones just after the probe returned, so a
// Close right after a probe may find none to close.
func closeLetsGo(t *testing.T, accepted *atomic.Int32, close func(), probe func(string)) {
	t.Helper()
	n := accepted.Load()
	for i := 0; accepted.Load() == n; i++ {
		if i == 50 {
			t.Fatal("Close did not let the kept connection go")
		}
		close()
		probe("after Close")
	}
}

// ciliumAgent serves cilium-agent's /v1/healthz on a unix socket at sock,
// through a restartListener.
func ciliumAgent(t *testing.T, sock string) *restartListener {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rl := &restartListener{Listener: ln}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"cilium":{"state":"Ok"}}`))
	})}
	go srv.Serve(rl)
	t.Cleanup(func() { srv.Close() })
	return rl
}

// The CNI probe keeps its connection to cilium-agent's socket as the CRI
// call does: one for three probes, an agent's restart is not an outage,
// the connection is a raw one, an agent that made its socket anew is asked
// on a new connection, and Close lets it go.
func TestCNIProbeKeepsItsConnection(t *testing.T) {
	sock := t.TempDir() + "/cilium.sock"
	rl := ciliumAgent(t, sock)
	ch, err := newCNICheck(testEnv(t, func(c *config.Config) { c.Checks.CNIUnhealthy.Socket = sock }))
	if err != nil {
		t.Fatal(err)
	}
	c := ch.(*cniCheck)
	probe := keepsAndSurvivesARestart(t, rl, c)
	if err := os.Rename(sock, sock+".old"); err != nil {
		t.Fatal(err)
	}
	rl2 := ciliumAgent(t, sock)
	probe("socket made anew")
	if n, n2 := rl.accepted.Load(), rl2.accepted.Load(); n != 2 || n2 != 1 {
		t.Errorf("socket made anew: %d connections to the old agent, %d to the new; want 2 and 1", n, n2)
	}
	closeLetsGo(t, &rl2.accepted, c.Close, probe)
}

// ProxyNotServing and TunnelDisconnected keep their connection to the page
// they scrape: one for three runs, the endpoint's restart is not an
// outage, the connection is a raw one, and Close lets it go.
func TestScrapeProbesKeepTheirConnection(t *testing.T) {
	for _, name := range []string{"ProxyNotServing", "TunnelDisconnected"} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			rl := &restartListener{Listener: ln}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, "# TYPE ready gauge\nready 1\n# TYPE konnectivity_network_proxy_agent_open_server_connections gauge\nkonnectivity_network_proxy_agent_open_server_connections 2\n")
			})}
			go srv.Serve(rl)
			defer srv.Close()
			url := "http://" + ln.Addr().String() + "/metrics"
			env := testEnv(t, func(c *config.Config) {
				c.Checks.ProxyNotServing.MetricsURL, c.Checks.ProxyNotServing.ReadyMetric = url, "ready"
				c.Checks.TunnelDisconnected.MetricsURL, c.Checks.TunnelDisconnected.AgentUnit = url, ""
			})
			ch, err := registry[name](env)
			if err != nil {
				t.Fatal(err)
			}
			probe := keepsAndSurvivesARestart(t, rl, ch)
			closer, ok := ch.(interface{ Close() })
			if !ok {
				t.Fatalf("%s keeps a connection it cannot close", name)
			}
			closeLetsGo(t, &rl.accepted, closer.Close, probe)
		})
	}
}

// A socket reached through a symbolic link (cilium's default
// /var/run/cilium/cilium.sock, /var/run a link to /run) is stat'ed the usual
// way, following the link at each probe: a link pointed at another socket,
// the old one still there and answering, is noticed.
func TestKeptSocketThroughALink(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", filepath.Join(dir, d, "agent.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "a"), link); err != nil {
		t.Fatal(err)
	}
	k := &keptSocket{path: filepath.Join(link, "agent.sock")}
	c, err := k.dial(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if k.raw || !k.same() {
		t.Errorf("through the link: raw %v, same %v; want the usual stat, the same socket", k.raw, k.same())
	}
	tmp := filepath.Join(dir, "link.new")
	if err := os.Symlink(filepath.Join(dir, "b"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
	if k.same() {
		t.Error("the link pointed at another socket: taken for the one dialed")
	}
}
