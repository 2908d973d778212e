package kube

import (
	"bufio"
	"context"
	"crypto/x509"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
)

// localhostProxyChildEnv marks the child
// TestAPIServerAtLocalhostIsNotProxied runs itself as, with HTTPS_PROXY in
// its environment (Go reads the proxy variables once per process).
const localhostProxyChildEnv = "AUTOPILOT_HEALTH_TEST_KUBE_LOCALHOST_PROXY_CHILD"

// An HTTPS_PROXY in the daemon's environment (systemd's
// DefaultEnvironment=, a drop-in) is honoured for the API server, as
// kubelet honours it (client-go's http.ProxyFromEnvironment), but never for
// a localhost name: Go leaves out "localhost" alone, and sent
// https://localhost.:PORT (a final dot), https://LOCALHOST:PORT and
// https://api.localhost:PORT to the proxy, which resolves the name on its
// own host, not this node's, where rawsys.DialLocal dials them as loopback
// (RFC 6761 §6.3). The premise: a name not local goes through the proxy.
func TestAPIServerAtLocalhostIsNotProxied(t *testing.T) {
	const name = "TestAPIServerAtLocalhostIsNotProxied"
	if os.Getenv(localhostProxyChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v")
		cmd.Env = append(os.Environ(), localhostProxyChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
			t.Fatalf("with HTTPS_PROXY set: %v\n%s", err, out)
		}
		t.Logf("child:\n%s", out)
		return
	}

	// The proxy: counts the CONNECTs it gets, by host, and refuses each.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var connects atomic.Int32
	hosts := make(chan string, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				connects.Add(1)
				hosts <- strings.TrimSpace(line)
				c.Write([]byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
			}()
		}
	}()
	for _, k := range []string{"NO_PROXY", "no_proxy", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		os.Unsetenv(k)
	}
	os.Setenv("HTTPS_PROXY", "http://"+ln.Addr().String())

	// The premise: the environment's proxy is taken for a name not local.
	srv := localhostServer(t, &x509.Certificate{DNSNames: []string{"localhost", "api.localhost", "kube.invalid"}})
	if _, err := localhostClient(t, srv, "kube.invalid").GetNode(context.Background(), "n1"); err == nil || connects.Load() == 0 {
		t.Fatalf("https://kube.invalid with HTTPS_PROXY set: %v, %d CONNECTs at the proxy: the proxy is not taken, and this test proves nothing", err, connects.Load())
	}
	t.Logf("https://kube.invalid went through the proxy: %s", <-hosts)
	connects.Store(0)

	for _, host := range []string{"localhost", "localhost.", "LOCALHOST", "api.localhost", "api.localhost."} {
		if _, err := localhostClient(t, srv, host).GetNode(context.Background(), "n1"); err != nil {
			t.Errorf("https://%s with HTTPS_PROXY set: %v", host, err)
		}
	}
	if n := connects.Load(); n != 0 {
		var got []string
		for range n {
			got = append(got, <-hosts)
		}
		t.Errorf("%d requests for a localhost name went to the proxy: %q", n, got)
	}
}
