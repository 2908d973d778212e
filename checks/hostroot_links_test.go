package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// cilium's socket is /var/run/cilium/cilium.sock, and on Debian, Ubuntu
// and Fedora /var/run is an absolute link to /run: under a host_root other
// than /, the socket is the host's <root>/run/cilium/cilium.sock, not the
// daemon's own /run/cilium/cilium.sock, which the plain join
// <root>/var/run/cilium/cilium.sock led to (CNIUnhealthy True,
// CiliumUnreachable, with cilium-agent healthy on the host). The socket is
// made after the check is built, as cilium-agent makes it after the
// daemon's start.
func TestCNISocketThroughAnAbsoluteLinkUnderHostRoot(t *testing.T) {
	root := t.TempDir()
	mkdir(t, filepath.Join(root, "var"))
	mkdir(t, filepath.Join(root, "run"))
	if err := os.Symlink("/run", filepath.Join(root, "var/run")); err != nil {
		t.Fatal(err)
	}
	c, _ := newCNICheck(testEnv(t, func(c *config.Config) { c.HostRoot = root }))
	defer c.(*cniCheck).Close()

	sock := filepath.Join(root, "run/cilium/cilium.sock")
	mkdir(t, filepath.Dir(sock))
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"cilium":{"state":"Ok","msg":""}}`)
	})}
	go srv.Serve(l)
	defer srv.Close()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusFalse {
		t.Fatalf("cilium-agent Ok at the host's /run/cilium/cilium.sock: %s %s %q (err %v); want False", r.Status, r.Reason, r.Message, err)
	}
}

// The files a check reads by Env.Path resolve their links as the host
// does: the node-info file under /var/lib/syself, which the host links to
// /data/syself, is the host's <root>/data/syself/nodes.json (before, the
// daemon's own /data/syself/nodes.json: absent, NodeInfoStale Unknown).
func TestEnvPathThroughAnAbsoluteLinkUnderHostRoot(t *testing.T) {
	root := t.TempDir()
	mkdir(t, filepath.Join(root, "var/lib"))
	mkdir(t, filepath.Join(root, "data/syself"))
	if err := os.Symlink("/data/syself", filepath.Join(root, "var/lib/syself")); err != nil {
		t.Fatal(err)
	}
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	if got, want := env.Path("/var/lib/syself/nodes.json"), filepath.Join(root, "data/syself/nodes.json"); got != want {
		t.Fatalf("Env.Path(/var/lib/syself/nodes.json) = %q; want %q", got, want)
	}
}

// The native journal reader finds the journal directories as journalctl
// --root=<host_root> does (it resolves links under the root): a host whose
// /var/log is a link to a data disk (/var/log -> /data/log) has its
// persistent journal at <root>/data/log/journal. Before, the reader looked
// in the daemon's own /data/log/journal, found no journal file there and
// read nothing.
func TestNativeJournalThroughAnAbsoluteLinkUnderHostRoot(t *testing.T) {
	root, want := nativeJournalRoot(t)
	mkdir(t, filepath.Join(root, "data/log"))
	if err := os.Rename(filepath.Join(root, "run/log/journal"), filepath.Join(root, "data/log/journal")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(root, "var"))
	if err := os.Symlink("/data/log", filepath.Join(root, "var/log")); err != nil {
		t.Fatal(err)
	}
	got, _, err := readNative(t, root, journalQuery{Root: root, Since: time.Unix(0, 0)})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("the journal at /var/log/journal through /var/log -> /data/log: %d entries (%v), want %d", len(got), err, len(want))
	}
}

// A socket under a deep host_root has a path longer than a socket address
// holds (108 bytes): it is connected through an O_PATH descriptor of it.
// Before, the connect failed with EINVAL and cilium-agent, healthy, was
// CiliumUnreachable ("connect: invalid argument").
func TestCNISocketPathLongerThanASocketAddress(t *testing.T) {
	root := filepath.Join(t.TempDir(), strings.Repeat("r", 100))
	dir := filepath.Join(root, "var/run/cilium")
	mkdir(t, dir)
	sock := filepath.Join(dir, "cilium.sock")
	if len(sock) < sunPathMax {
		t.Fatalf("%s: %d bytes, not longer than a socket address", sock, len(sock))
	}
	// bind(2) takes no longer path either: the socket is made through
	// a descriptor of its directory.
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/cilium.sock", d.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"cilium":{"state":"Ok","msg":""}}`)
	})}
	go srv.Serve(l)
	defer srv.Close()
	c, _ := newCNICheck(testEnv(t, func(c *config.Config) { c.HostRoot = root }))
	defer c.(*cniCheck).Close()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusFalse {
		t.Fatalf("cilium-agent Ok at a %d-byte socket path: %s %s %q (err %v); want False", len(sock), r.Status, r.Reason, r.Message, err)
	}
	// Gone: unreachable, naming the socket's path, not the descriptor's.
	srv.Close()
	os.Remove(sock)
	r, _ = c.Probe(context.Background())
	if r.Reason != report.ReasonCiliumUnreachable || strings.Contains(r.Message, "/proc/self/fd") || !strings.Contains(r.Message, "no such file") {
		t.Fatalf("socket gone: %s %s %q; want CiliumUnreachable naming the socket", r.Status, r.Reason, r.Message)
	}
}
