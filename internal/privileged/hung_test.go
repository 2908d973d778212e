package privileged

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/testenv"
)

// These tests run on real time: the hung calls are real blocking system
// calls (open of a FIFO) and the exchanges real sockets, which
// testing/synctest cannot fake. The helper's limit is a few hundred ms
// (Server.hungAfter), the client's a few seconds (Client.wait), so a helper
// that holds a hung call's slot or answer fails them fast.

// countLines returns how many lines of log hold all of subs.
func countLines(log *testenv.SyncBuffer, subs ...string) int {
	n := 0
	for _, line := range strings.Split(log.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

func awaitKey(t *testing.T, returned chan string, want string) {
	t.Helper()
	select {
	case k := <-returned:
		if k != want {
			t.Fatalf("returned %s, want %s", k, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the hung call on %s did not return", want)
	}
}

func awaitFDs(t *testing.T, s *Server, want int) {
	t.Helper()
	// At most as many as before, not exactly: a descriptor another part of
	// the test process held then (a runtime's or an earlier test's
	// connection closing late) may be gone since (a CI run at load 11: 11
	// open, 12 before); a leak is one more.
	for deadline := time.Now().Add(10 * time.Second); s.Open() != 0 || openFDs(t) > want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open (%d connections), want %d as before", openFDs(t), s.Open(), want)
		}
	}
}

// unblock opens the FIFO p for writing, which lets a blocked open for
// reading return (and later ones not block).
func unblock(t *testing.T, p string) int {
	t.Helper()
	w, err := unix.Open(p, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening %s for writing: %v", p, err)
	}
	return w
}

// An NVMe controller whose open never returns (a FIFO: open for reading
// blocks until a writer comes) costs one goroutine, not the work slots: the
// hung call gives its slot back at its limit and its client is told; the
// same controller is refused at once while the call hangs, holding no slot;
// the other requests are served; once the open returns, the controller is
// asked again. No descriptor is left behind.
func TestHungCallGivesBackItsSlot(t *testing.T) {
	dir := t.TempDir()
	nvme1, nvme2 := filepath.Join(dir, "nvme1"), filepath.Join(dir, "nvme2")
	for _, p := range []string{nvme1, nvme2} {
		if err := unix.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
		// A test that fails before it unblocks the open leaves no
		// goroutine blocked in it (ENXIO: no open waits).
		t.Cleanup(func() {
			if w, err := unix.Open(p, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
				unix.Close(w)
			}
		})
	}
	kmsgFile := filepath.Join(dir, "kmsg")
	os.WriteFile(kmsgFile, []byte("6,1,2,-;a line\n"), 0o600)
	var logs testenv.SyncBuffer
	returned := make(chan string, 8)
	s := &Server{
		Log:           slog.New(slog.NewTextHandler(&logs, nil)),
		DevDir:        dir,
		KmsgPath:      kmsgFile,
		MaxConcurrent: 2,
		// The NVMe calls (on FIFOs) hang; the kernel log's open and the
		// LVM report must not be taken for hung: a start of the lvm
		// script took over 300 ms on a CI run at load 11.
		hungAfter: func(r request) time.Duration {
			if r.Ctrl != "" {
				return 300 * time.Millisecond
			}
			return 4 * time.Second
		},
		returned: func(k string) { returned <- k },
	}
	var lvm string
	if os.Getuid() == 0 { // the helper runs an lvm that only root may change
		lvm = filepath.Join(t.TempDir(), "lvm")
		os.WriteFile(lvm, []byte("#!/bin/sh\necho '{\"report\":[]}'\n"), 0o755)
		s.LVM = lvm
	}
	c := serve(t, s)
	c.wait = func(request) time.Duration { return 5 * time.Second }
	before := openFDs(t)

	// Three asks of the same controller at once: one call, found hung and
	// its client told; the two others wait for it (no slot held) and are
	// refused when it is found hung (or, their own limit a hair earlier,
	// while it is still running), never called.
	errs := make(chan error, 3)
	for range 3 {
		go func() { _, err := c.SMART("nvme1"); errs <- err }()
	}
	var hung, refused int
	for range 3 {
		err := <-errs
		switch {
		case err != nil && strings.Contains(err.Error(), "nvme-smart on "+nvme1+": no answer within") && strings.Contains(err.Error(), "hung in the helper"):
			hung++
		case err != nil && strings.Contains(err.Error(), "nvme-smart on "+nvme1+": the previous call (nvme-smart"):
			refused++
		default:
			t.Errorf("SMART(nvme1), hung: %v", err)
		}
	}
	if hung != 1 || refused != 2 {
		t.Fatalf("three asks of a hung controller: %d told hung, %d refused; want 1 and 2", hung, refused)
	}
	// A second hung controller: with 2 slots, both hung calls would hold
	// them all.
	if _, err := c.Identify("nvme2"); err == nil || !strings.Contains(err.Error(), "hung in the helper") {
		t.Fatalf("Identify(nvme2), hung: %v", err)
	}
	for i := range 4 {
		if _, err := c.Identify("nvme1"); err == nil || !strings.Contains(err.Error(), "nvme-identify on "+nvme1+": the previous call (nvme-smart) has not returned since") || !strings.Contains(err.Error(), "not asked again until it does") {
			t.Errorf("round %d: Identify(nvme1) while its SMART hangs: %v", i, err)
		}
		if _, err := c.SMART("nvme2"); err == nil || !strings.Contains(err.Error(), "the previous call (nvme-identify) has not returned since") {
			t.Errorf("round %d: SMART(nvme2) while its Identify hangs: %v", i, err)
		}
		fd, err := c.OpenKmsg(context.Background())
		if err != nil {
			t.Fatalf("round %d: the kernel log with two hung NVMe calls and 2 slots: %v", i, err)
		}
		unix.Close(fd)
		if lvm != "" {
			if b, err := c.RunLVM(context.Background(), lvm, 20*time.Second, "vgs", hostio.LVMReportArgs["vgs"]...); err != nil || !strings.Contains(string(b), "report") {
				t.Fatalf("round %d: an LVM report with two hung NVMe calls: %q, %v", i, b, err)
			}
		}
	}
	// Logged once per hung call, not per refused request.
	if n, m := countLines(&logs, "a call is hung", "key="+nvme1, "op=nvme-smart"), countLines(&logs, "a call is hung", "key="+nvme2, "op=nvme-identify"); n != 1 || m != 1 {
		t.Errorf("hung calls logged %d and %d times, want once each:\n%s", n, m, logs.String())
	}

	// The first open returns: the controller is asked again (and fails as
	// a FIFO does, ENOTTY, the writer keeping later opens from blocking).
	w1 := unblock(t, nvme1)
	awaitKey(t, returned, nvme1)
	if _, err := c.SMART("nvme1"); err == nil || !strings.Contains(err.Error(), "NVMe admin command 0x02") {
		t.Errorf("SMART(nvme1) after its hung call returned: %v, want the ioctl's error", err)
	}
	if n := countLines(&logs, "a hung call returned", "key="+nvme1); n != 1 {
		t.Errorf("the return logged %d times, want once", n)
	}
	// nvme2 still hangs.
	if _, err := c.Identify("nvme2"); err == nil || !strings.Contains(err.Error(), "has not returned since") {
		t.Errorf("Identify(nvme2) while it still hangs: %v", err)
	}
	w2 := unblock(t, nvme2)
	awaitKey(t, returned, nvme2)
	if _, err := c.Identify("nvme2"); err == nil || !strings.Contains(err.Error(), "NVMe admin command 0x06") {
		t.Errorf("Identify(nvme2) after its hung call returned: %v, want the ioctl's error", err)
	}
	unix.Close(w1)
	unix.Close(w2)
	awaitFDs(t, s, before)
	if n := countLines(&logs, "a call is hung"); n != 2 {
		t.Errorf("%d hung calls logged, want 2", n)
	}
}

// A descriptor that a hung call opens after its client was told it hangs
// is closed when the call returns, never leaked; the kernel log is then
// opened again.
func TestLateDescriptorIsClosed(t *testing.T) {
	f := filepath.Join(t.TempDir(), "kmsg")
	os.WriteFile(f, []byte("6,1,2,-;a line\n"), 0o600)
	release := make(chan struct{})
	returned := make(chan string, 1)
	s := &Server{
		KmsgPath:  f,
		hungAfter: func(request) time.Duration { return 200 * time.Millisecond },
		returned:  func(k string) { returned <- k },
	}
	s.handler = func(ctx context.Context, req request) (response, int) {
		<-release // an open of the kernel log that hangs until released
		return s.handle(ctx, req)
	}
	c := serve(t, s)
	c.wait = func(request) time.Duration { return 5 * time.Second }
	before := openFDs(t)
	if _, err := c.OpenKmsg(context.Background()); err == nil || !strings.Contains(err.Error(), "kmsg on "+f+": no answer within") {
		t.Fatalf("OpenKmsg, hung: %v", err)
	}
	if _, err := c.OpenKmsg(context.Background()); err == nil || !strings.Contains(err.Error(), "has not returned since") {
		t.Fatalf("OpenKmsg while the first hangs: %v", err)
	}
	close(release)
	awaitKey(t, returned, f)
	awaitFDs(t, s, before)
	fd, err := c.OpenKmsg(context.Background())
	if err != nil {
		t.Fatalf("OpenKmsg after the hung one returned: %v", err)
	}
	if !sameFile(t, fd, f) {
		t.Error("the descriptor is not of the kernel log")
	}
	unix.Close(fd)
	awaitFDs(t, s, before)
}
