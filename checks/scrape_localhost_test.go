package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// The name localhost is loopback (RFC 6761 §6.3), and the probes reach it
// without a lookup. Go's resolver does not make it special: it reads
// /etc/hosts and, where the name is not there, asks the DNS servers of
// /etc/resolv.conf (net's goLookupIPCNAMEOrder; isLocalhost in conf.go only
// picks the cgo resolver for nss-myhostname, never in a CGO_ENABLED=0
// build). On a node whose /etc/hosts lacks localhost, a probe that followed
// the tunnel agent's redirect to localhost, or a URL configured with it,
// asked a question off the node at each new connection. The test binary
// re-executes itself under unshare(1) (needs root); the child mounts an
// /etc/hosts without localhost, counts the resolver's DNS connections, and
// shows first that a plain net.Dialer asks DNS for localhost (Go's
// behaviour, the premise), then that the three probes ask nothing.
func TestProbeReachesLocalhostWithoutALookup(t *testing.T) {
	if !testenv.InMountNamespace(t, "mounting a hosts file") {
		return
	}
	asked := testenv.HostsWithoutLocalhost(t)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.Redirect(w, r, "http://localhost:"+r.URL.Query().Get("port")+"/health", http.StatusFound)
			return
		}
		fmt.Fprint(w, "ready 1\nkonnectivity_network_proxy_agent_open_server_connections 2\n")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	// A redirect to localhost, and a URL configured with localhost (and a
	// name under .localhost): read, no DNS asked.
	for _, u := range []string{srv.URL + "/metrics?port=" + port, "http://localhost:" + port + "/health", "http://tunnel.LOCALHOST:" + port + "/health"} {
		env := testEnv(t, func(c *config.Config) {
			c.Checks.ProxyNotServing.MetricsURL = u
			c.Checks.TunnelDisconnected.MetricsURL = u
			c.Checks.TunnelDisconnected.AgentUnit = ""
			c.Checks.KubeletUnhealthy.HealthzURL = u
		})
		kubelet, _ := newKubeletCheck(env)
		proxy, _ := newProxyCheck(env)
		tunnel, _ := newTunnelCheck(env)
		for _, c := range []Check{kubelet, proxy, tunnel} {
			if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
				t.Errorf("%s from %T: %+v %v; want it read (False)", u, c, r, err)
			}
			c.(Closer).Close()
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the probes asked DNS %d times for a localhost name", n)
	}
}

// The names dialLocal takes for loopback, and the ::1 a service listening
// only there is reached at under localhost (127.0.0.1 refused first).
func TestDialLocalNames(t *testing.T) {
	for h, want := range map[string]bool{"localhost": true, "LocalHost.": true, "tunnel.localhost": true, "a.b.LOCALHOST.": true,
		".localhost": false, "xlocalhost": false, "localhost.example": false, "localhost.localdomain": false, "127.0.0.1": false, "": false} {
		if got := isLocalhostName(h); got != want {
			t.Errorf("isLocalhostName(%q) = %v, want %v", h, got, want)
		}
	}
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		testenv.Skip(t, "no ::1 here: "+err.Error())
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	c, err := dialLocal(context.Background(), "tcp", "localhost:"+port)
	if err != nil {
		t.Fatalf("localhost:%s, listened on at ::1 only: %v", port, err)
	}
	c.Close()
	if _, err := dialLocal(context.Background(), "tcp4", "localhost:"+port); err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+port) {
		t.Errorf("tcp4 localhost:%s: %v; want 127.0.0.1's refusal", port, err)
	}
}

// A 127.0.0.1 that takes no connection (its SYNs dropped: a full accept
// queue here, a firewall's DROP on a node) must not take the whole of the
// probe's time before ::1, where the service listens, is tried: the
// resolver's dial did not (net.Dialer's Happy Eyeballs, RFC 8305: the
// other family 300 ms after the first, both in flight). Before, dialLocal
// tried ::1 only after 127.0.0.1 failed, at the probe's deadline, and the
// probe failed although ::1 answered.
func TestDialLocalDoesNotWaitOutABlackholedLoopback(t *testing.T) {
	l6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		testenv.Skip(t, "no ::1 here: "+err.Error())
	}
	defer l6.Close()
	go func() {
		for {
			c, err := l6.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l6.Addr().(*net.TCPAddr).Port
	// 127.0.0.1 on the same port, listening with a backlog of 0 and never
	// accepting: once its queue holds a connection, the kernel drops the
	// next SYNs, and a connect hangs until its deadline.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		testenv.Skip(t, "127.0.0.1 port of the ::1 listener taken: "+err.Error())
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	addr4 := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var fill []net.Conn
	defer func() {
		for _, c := range fill {
			c.Close()
		}
	}()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", addr4)
		cancel()
		if err != nil {
			break // the queue is full: this connect hung to its deadline
		}
		if fill = append(fill, c); len(fill) > 64 {
			t.Fatal("127.0.0.1's queue never filled")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dialLocal(ctx, "tcp", "localhost:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("localhost:%d with 127.0.0.1 blackholed and ::1 listening: %v; want ::1 reached", port, err)
	}
	if got := c.RemoteAddr().(*net.TCPAddr).IP; !got.Equal(net.IPv6loopback) {
		t.Errorf("connected to %v, want ::1", got)
	}
	c.Close()
	// A context cancelled before or during the dial ends it, with
	// 127.0.0.1's error.
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if c, err := dialLocal(cancelled, "tcp", "localhost:"+strconv.Itoa(port)); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("a cancelled dial: %v, %v; want 127.0.0.1's error", c, err)
	}
}
