package privileged

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
)

// A call whose context is done before it starts returns the context's
// error (errors.Is: the dial's "operation was canceled" is it) and no
// descriptor, as OpenKmsg's doc says.
func TestOpenKmsgCanceledBeforeTheCall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "helper.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fd, err := (&Client{Path: path}).OpenKmsg(ctx)
	if fd != -1 || !errors.Is(err, context.Canceled) {
		t.Errorf("OpenKmsg with a canceled context: %d, %v; want -1, context.Canceled", fd, err)
	}
}
