package privileged

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/hostio"
)

// serve starts a helper on a socket in a temporary directory and returns
// its client.
func serve(t *testing.T, s *Server) *Client {
	t.Helper()
	p := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &Client{Path: p}
}

func sameFile(t *testing.T, fd int, p string) bool {
	t.Helper()
	var a, b unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(p, &b); err != nil {
		t.Fatal(err)
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// The kernel log's descriptor comes over the socket: the daemon reads the
// file the helper opened.
func TestKmsgDescriptorIsPassed(t *testing.T) {
	f := filepath.Join(t.TempDir(), "kmsg")
	os.WriteFile(f, []byte("6,1,2,-;a line\n"), 0o600)
	s := &Server{KmsgPath: f}
	c := serve(t, s)
	fd, err := c.OpenKmsg()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if !sameFile(t, fd, f) {
		t.Fatal("the descriptor is not of the helper's kernel log")
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil || flags&unix.O_NONBLOCK == 0 || flags&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("descriptor flags %#o (%v): want read-only, non-blocking", flags, err)
	}
	buf := make([]byte, 64)
	if n, err := unix.Read(fd, buf); err != nil || !strings.Contains(string(buf[:n]), "a line") {
		t.Errorf("read %q, %v", buf[:n], err)
	}
	// A kernel log the helper cannot open: the error, with its errno.
	s.KmsgPath = filepath.Join(t.TempDir(), "missing")
	if _, err := c.OpenKmsg(); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("OpenKmsg of a missing file: %v", err)
	}
	if s.Served(OpKmsg) != 2 {
		t.Errorf("served %d kmsg requests, want 2", s.Served(OpKmsg))
	}
}

// The real /dev/kmsg through the helper (root: CAP_SYSLOG).
func TestRealKmsgThroughTheHelper(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/dev/kmsg"); err != nil {
		t.Skip(err)
	}
	fd, err := serve(t, &Server{}).OpenKmsg()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || unix.Major(st.Rdev) != 1 || unix.Minor(st.Rdev) != 11 {
		t.Fatalf("descriptor is %d:%d (%v), want /dev/kmsg 1:11", unix.Major(st.Rdev), unix.Minor(st.Rdev), err)
	}
	buf := make([]byte, 8192)
	if n, err := unix.Read(fd, buf); err != nil || n == 0 || !strings.Contains(string(buf[:n]), ";") {
		t.Errorf("first record %q, %v", buf[:n], err)
	}
}

// NVMe: only a controller name, and the device's error comes back with its
// errno.
func TestNVMeRequests(t *testing.T) {
	dir := t.TempDir()
	c := serve(t, &Server{DevDir: dir})
	for _, bad := range []string{"../kmsg", "nvme0n1", "sda", "", "nvme0/x"} {
		if _, err := c.SMART(bad); err == nil || !strings.Contains(err.Error(), "is not an NVMe controller") {
			t.Errorf("SMART(%q) = %v, want refused", bad, err)
		}
	}
	if _, err := c.Identify("nvme7"); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), filepath.Join(dir, "nvme7")) {
		t.Errorf("Identify(nvme7) with no device: %v", err)
	}
	// A file that is no NVMe controller: the ioctl fails, not the helper.
	os.WriteFile(filepath.Join(dir, "nvme0"), nil, 0o600)
	if _, err := c.SMART("nvme0"); err == nil || !strings.Contains(err.Error(), "NVMe admin command 0x02") {
		t.Errorf("SMART of a regular file: %v", err)
	}
}

// The device-mapper tables: the control node only; a missing one is
// ErrNoDeviceMapper on the daemon's side, as in process.
func TestDMRequests(t *testing.T) {
	dir := t.TempDir()
	s := &Server{}
	c := serve(t, s)
	if _, err := c.DM(filepath.Join(dir, "control")).VerityTargets(); !errors.Is(err, hostio.ErrNoDeviceMapper) {
		t.Errorf("missing control node: %v, want ErrNoDeviceMapper", err)
	}
	if _, err := c.DM("/dev/null").VerityTargets(); err == nil || !strings.Contains(err.Error(), "is not the device-mapper control node") {
		t.Errorf("/dev/null as control node: %v, want refused", err)
	}
	if os.Getuid() != 0 {
		return
	}
	if _, err := os.Stat("/dev/mapper/control"); err != nil {
		t.Log("no /dev/mapper/control here:", err)
		return
	}
	want, werr := hostio.DMControl{Path: "/dev/mapper/control"}.VerityTargets()
	got, gerr := c.DM("/dev/mapper/control").VerityTargets()
	if (werr == nil) != (gerr == nil) || !reflect.DeepEqual(want, got) {
		t.Errorf("through the helper: %+v, %v; in process: %+v, %v", got, gerr, want, werr)
	}
}

// LVM: only the disk check's reports, from an absolute lvm that only root
// may change; a report with a non-zero exit comes back with its error.
func TestLVMRequests(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the lvm binary must be root's")
	}
	dir := t.TempDir()
	lvm := filepath.Join(dir, "lvm")
	os.WriteFile(lvm, []byte("#!/bin/sh\necho '{\"report\":[]}'\n[ \"$1\" = lvs ] && { echo '  vgbad unreadable' >&2; exit 5; }\nexit 0\n"), 0o755)
	c := serve(t, &Server{})
	ctx := context.Background()
	b, err := c.RunLVM(ctx, lvm, 20*time.Second, "vgs", hostio.LVMReportArgs["vgs"]...)
	if err != nil || strings.TrimSpace(string(b)) != `{"report":[]}` {
		t.Errorf("vgs: %q, %v", b, err)
	}
	b, err = c.RunLVM(ctx, lvm, 20*time.Second, "lvs", hostio.LVMReportArgs["lvs"]...)
	if err == nil || !strings.Contains(err.Error(), "its report is used") || len(b) == 0 {
		t.Errorf("lvs exiting 5 with a report: %q, %v", b, err)
	}
	for name, call := range map[string]func() error{
		"other args": func() error { _, err := c.RunLVM(ctx, lvm, time.Second, "vgs", "-o", "vg_name"); return err },
		"other cmd": func() error {
			_, err := c.RunLVM(ctx, lvm, time.Second, "vgremove", hostio.LVMReportArgs["vgs"]...)
			return err
		},
		"relative": func() error {
			_, err := c.RunLVM(ctx, "lvm", time.Second, "vgs", hostio.LVMReportArgs["vgs"]...)
			return err
		},
		"not lvm": func() error {
			_, err := c.RunLVM(ctx, "/bin/sh", time.Second, "vgs", hostio.LVMReportArgs["vgs"]...)
			return err
		},
		"long timeout": func() error {
			_, err := c.RunLVM(ctx, lvm, time.Hour, "vgs", hostio.LVMReportArgs["vgs"]...)
			return err
		},
	} {
		if err := call(); err == nil || !strings.Contains(err.Error(), "the helper runs") && !strings.Contains(err.Error(), "out of range") {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
	os.Chmod(lvm, 0o775)
	if _, err := c.RunLVM(ctx, lvm, time.Second, "vgs", hostio.LVMReportArgs["vgs"]...); err == nil || !strings.Contains(err.Error(), "only root may change") {
		t.Errorf("group-writable lvm: %v, want refused", err)
	}
}

// The scan through the helper is the scan in process, cap included.
func TestScanRequests(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"etc/cni/net.d/a.conf", "etc/cni/net.d/b.conf", "etc/cni/net.d/sub/c.conf"} {
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(p), 0o640)
	}
	c := serve(t, &Server{})
	spec := hostio.Spec{Patterns: []string{filepath.Join(root, "etc/cni")}, Exclude: []string{filepath.Join(root, "etc/cni/net.d/b.conf")}}
	want, err := hostio.Scan("/", spec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Scan("/", spec)
	if err != nil || !reflect.DeepEqual(got, want) || len(got) != 5 {
		t.Errorf("scan through the helper: %+v, %v\nwant %+v", got, err, want)
	}
	spec.MaxEntries = 2
	got, err = c.Scan("/", spec)
	var le *hostio.LimitError
	if !errors.As(err, &le) || le.Limit != 2 || len(got) != 2 {
		t.Errorf("capped scan: %d entries, %v; want 2 and a LimitError", len(got), err)
	}
	if _, err := c.Scan(root, spec); err == nil {
		t.Error("a scan of another root went through")
	}
}

// What is not a request is answered with an error, and the helper goes on.
func TestMalformedRequests(t *testing.T) {
	c := serve(t, &Server{})
	for _, in := range []string{"not json", `{"op":"format-disk"}`, ""} {
		conn, err := net.Dial("unix", c.Path)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte(in))
		conn.(*net.UnixConn).CloseWrite()
		b, _ := io.ReadAll(conn)
		conn.Close()
		var r response
		if err := json.Unmarshal(b, &r); err != nil || r.Error == "" {
			t.Errorf("request %q: answer %q (%v), want an error", in, b, err)
		}
	}
	if _, err := c.Identify("nvme9"); err == nil || strings.Contains(err.Error(), "malformed") {
		t.Errorf("the helper after malformed requests: %v", err)
	}
	// No helper: the error names it.
	if _, err := (&Client{Path: filepath.Join(t.TempDir(), "none.sock")}).OpenKmsg(); err == nil || !strings.Contains(err.Error(), "privileged helper") {
		t.Errorf("no helper: %v", err)
	}
}
