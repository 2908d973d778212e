package smallfile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// What is not a regular file is named from the open descriptor, a FIFO
// with no writer without blocking; a device only where DeviceWait lets it
// be read; a file of Max bytes is read whole, one of Max+1 refused with
// its size.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	atMax := filepath.Join(dir, "at-max")
	os.WriteFile(atMax, []byte(strings.Repeat("x", 10)), 0o600)
	over := filepath.Join(dir, "over")
	os.WriteFile(over, []byte(strings.Repeat("x", 11)), 0o600)
	device := Limits{Max: 10, DeviceWait: time.Second}
	for _, tc := range []struct {
		path string
		l    Limits
		want string // the error; "" read, len(read) == 10 or 0
	}{
		{fifo, Limits{Max: 10}, "not a regular file (a FIFO)"},
		{fifo, device, "not a regular file (a FIFO)"},
		{dir, Limits{Max: 10}, "not a regular file (a directory)"},
		{sock, device, "not a regular file (a socket)"},
		{"/dev/null", Limits{Max: 10}, "not a regular file (a device)"},
		{"/dev/null", device, ""},
		{"/dev/zero", device, "larger than 10 bytes"},
		{atMax, Limits{Max: 10}, ""},
		{over, Limits{Max: 10}, "larger than 10 bytes"},
	} {
		done := make(chan struct{})
		var b []byte
		var err error
		go func() {
			defer close(done)
			b, err = Read(tc.path, tc.l)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Read(%s) blocked", tc.path)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Read(%s, %+v): %v; want read", tc.path, tc.l, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want || b != nil):
			t.Errorf("Read(%s, %+v) = %d bytes, %v; want nothing, %q", tc.path, tc.l, len(b), err, tc.want)
		}
	}
	var tl *TooLargeError
	if _, err := Read(over, Limits{Max: 10}); !errors.As(err, &tl) || tl.Size != 11 {
		t.Errorf("over the bound: %#v; want its size, 11", err)
	}
	if _, err := Read("/dev/zero", device); !errors.As(err, &tl) || tl.Size != -1 {
		t.Errorf("a device over the bound: %#v; want no size, -1", err)
	}
	// A regular file whose stat says less than it holds (as /proc's
	// files say 0 bytes; a file that grew while read): its size is not
	// known, not the stat's (the configuration said "larger than 1 MiB,
	// the most read (0 bytes)").
	if _, err := Read("/proc/self/status", Limits{Max: 16}); !errors.As(err, &tl) || tl.Size != -1 || tl.Device {
		t.Errorf("/proc/self/status over the bound: %#v; want no size, -1, not a device", err)
	}
	if _, err := Read("/dev/zero", device); !errors.As(err, &tl) || !tl.Device {
		t.Errorf("a device over the bound: %#v; want Device", err)
	}
	if _, err := Read(filepath.Join(dir, "absent"), device); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("absent: %v; want fs.ErrNotExist", err)
	}
}
