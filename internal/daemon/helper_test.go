package daemon

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/privileged"
)

// The helper reads the host's own root: a daemon given one and a fixture
// host root refuses to start, naming the key.
func TestHelperWithAnotherHostRootRefusesToStart(t *testing.T) {
	cfg := testConfig(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	_, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Helper: &privileged.Client{Path: "/nonexistent"}})
	if err == nil || !strings.Contains(err.Error(), "host_root") || !strings.Contains(err.Error(), "--privileged-helper") {
		t.Fatalf("New with a helper and host_root %s: %v", cfg.HostRoot, err)
	}
}

// A kernel log device other than /dev/kmsg is opened in process, and its
// error says why the helper was not asked; /dev/kmsg goes to the helper.
func TestHelperKmsgOpen(t *testing.T) {
	h := &privileged.Client{Path: filepath.Join(t.TempDir(), "none.sock")}
	open := helperKmsgOpen(h)
	if _, err := open(context.Background(), filepath.Join(t.TempDir(), "kmsg")); err == nil || !strings.Contains(err.Error(), "kmsg.device is not /dev/kmsg") {
		t.Errorf("another device: %v", err)
	}
	if _, err := open(context.Background(), "/dev/kmsg"); err == nil || !strings.Contains(err.Error(), "privileged helper") {
		t.Errorf("/dev/kmsg with no helper answering: %v", err)
	}
}
