package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A socket path that holds something other than a socket (a file, a
// directory: status.socket or control_socket set to a path in use) is not
// removed to make room: the bind fails, naming it, and what was there is
// kept. A socket file left by a daemon that is gone is still replaced.
// What a connect fails on with another error than ECONNREFUSED (a symlink
// that loops, ELOOP; one through a regular file, ENOTDIR; a file the
// daemon, root without capabilities, may not write, EACCES; one on a
// read-only mount, EROFS) is named for what it is too, not as a socket
// another daemon may hold (daemonAnswers).
func TestSocketPathThatIsNotASocketIsKept(t *testing.T) {
	for _, l := range []struct {
		name   string
		listen func(string) (net.Listener, error)
	}{{"status", listenStatus}, {"control", func(p string) (net.Listener, error) { return listenControl(p, quietLog()) }}} {
		for _, kind := range []string{"file", "directory", "symlink loop", "symlink through a file", "symlink to a live socket"} {
			t.Run(l.name+" "+kind, func(t *testing.T) {
				p := filepath.Join(t.TempDir(), "x.sock")
				if kind == "file" {
					if err := os.WriteFile(p, []byte("keep me\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				} else if kind == "directory" {
					if err := os.Mkdir(p, 0o755); err != nil {
						t.Fatal(err)
					}
				} else {
					target := p // connect: ELOOP
					if kind == "symlink to a live socket" {
						// connect: answered, by another socket
						// than the one at the path.
						live := filepath.Join(filepath.Dir(p), "live.sock")
						other, err := net.Listen("unix", live)
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { other.Close() })
						target = live
					}
					if kind == "symlink through a file" {
						f := filepath.Join(filepath.Dir(p), "f")
						if err := os.WriteFile(f, nil, 0o644); err != nil {
							t.Fatal(err)
						}
						target = filepath.Join(f, "x.sock") // connect: ENOTDIR
					}
					if err := os.Symlink(target, p); err != nil {
						t.Fatal(err)
					}
				}
				ln, err := l.listen(p)
				if err == nil {
					ln.Close()
				}
				if err == nil || !strings.Contains(err.Error(), p+": not a socket") {
					t.Errorf("listen on a %s: %v, want an error naming it as not a socket", kind, err)
				}
				fi, serr := os.Lstat(p)
				switch {
				case serr != nil:
					t.Errorf("the %s at the socket path is gone: %v", kind, serr)
				case kind == "file" && !fi.Mode().IsRegular(), kind == "directory" && !fi.IsDir(),
					strings.HasPrefix(kind, "symlink") && fi.Mode()&os.ModeSymlink == 0:
					t.Errorf("the %s at the socket path was replaced: %v", kind, fi.Mode())
				case kind == "file":
					if b, _ := os.ReadFile(p); string(b) != "keep me\n" {
						t.Errorf("the file at the socket path holds %q", b)
					}
				}
			})
		}
		t.Run(l.name+" stale socket", func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "x.sock")
			stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			stale.SetUnlinkOnClose(false)
			stale.Close() // the file stays, nothing answers
			ln, err := l.listen(p)
			if err != nil {
				t.Fatalf("a stale socket is not replaced: %v", err)
			}
			ln.Close()
		})
	}
}
