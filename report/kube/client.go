// Package kube is the daemon's only Kubernetes edge: it writes the daemon's
// conditions to Node.status, its events to core/v1 Events, and the health
// report to the Node's annotations, with the node's own credentials.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrNoKubeconfig means the kubeconfig file does not exist: the daemon runs
// standalone.
var ErrNoKubeconfig = errors.New("no kubeconfig")

// NewClient builds a client from a node-scoped kubeconfig (the kubelet's
// /etc/kubernetes/kubelet.conf). When the kubeconfig names its client
// certificate by path (kubelet-client-current.pem, a symlink the kubelet
// moves on rotation), client-go reloads the file every
// transport.CertCallbackRefreshDuration (5 min) and reconnects with the new
// certificate: no restart needed.
func NewClient(path, userAgent string) (kubernetes.Interface, string, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: %s does not exist", ErrNoKubeconfig, path)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cfg.UserAgent = userAgent
	cfg.Timeout = 15 * time.Second
	// Our own write pacing (coalescing, heartbeats, event aggregation) keeps
	// the rate far below this; it only bounds a bug.
	cfg.QPS, cfg.Burst = 5, 10
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, cfg.Host, nil
}

// Dialer returns an Options.Dial for the API server at server (a
// kubeconfig's server URL): a TCP connection to its host and port (443 when
// the URL names none), closed at once. Nothing is sent: the API server
// does not see a request.
func Dialer(server string) (func(ctx context.Context) error, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, fmt.Errorf("server %q names no host", server)
	}
	addr := u.Host
	if u.Port() == "" {
		port := "443"
		if u.Scheme == "http" {
			port = "80"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	var d net.Dialer
	return func(ctx context.Context) error {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}, nil
}
