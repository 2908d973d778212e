package systemd

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

// cutWrite is a connection to the bus whose write of a message holding
// member is cut half-way: half of it is written, the socket is shut for
// writing (the bus reads the end of the stream in the middle of the
// message: a message cut short is no call, and is dropped with the
// connection), and the rest is written to it, which fails as a write to a
// bus gone mid-message does (EPIPE).
type cutWrite struct {
	*net.UnixConn
	member []byte
}

func (c cutWrite) Write(b []byte) (int, error) {
	if !bytes.Contains(b, c.member) {
		return c.UnixConn.Write(b)
	}
	n, err := c.UnixConn.Write(b[:len(b)/2])
	if err != nil {
		return n, err
	}
	if err := c.UnixConn.CloseWrite(); err != nil {
		return n, err
	}
	m, err := c.UnixConn.Write(b[len(b)/2:])
	return n + m, err
}

// The restart's RestartUnit call is cut half-way by its write (the bus's
// socket closed under it): no request reached systemd, and the restart
// says so (ErrNotRequested: the repairer counts it failed, not
// restarted), as it does for a job connection that could not be made.
// Before, the write's error read as a request whose fate is unknown, and
// was counted restarted. godbus ends the call with the write's error, or,
// where its reader read the bus's end of the stream and ended the waiting
// call with EOF first (the write's error then finds the call ended), with
// EOF: the job's connections count their failed writes (writeWatch), so
// both orders are ErrNotRequested (CI met the second once under -race,
// before the count).
func TestRestartWhoseCallsWriteIsCutIsNotRequested(t *testing.T) {
	fs, d, sock, _ := fakeSystemdBus(t)
	d.dial = func(ctx context.Context) (*godbus.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, err
		}
		return newBusConn(ctx, cutWrite{c.(*net.UnixConn), []byte("RestartUnit")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var took atomic.Bool
	done := make(chan error, 1)
	go func() { done <- d.Restart(WithTook(ctx, func() { took.Store(true) }), "kubelet.service") }()
	fs.answer(t, fs.expect(t, "ResetFailedUnit", "kubelet.service"))
	fs.read(t, "kubelet.service")
	err := <-done
	if !errors.Is(err, ErrNotRequested) || took.Load() {
		t.Fatalf("a restart whose call's write was cut: %v (took %v), want ErrNotRequested, not taken", err, took.Load())
	}
}

// Held: the restart's call reached systemd, and the bus went before its
// answer came: systemd may have made the job. That is no ErrNotRequested
// (the repairer counts it restarted, its fate unknown), nor a refusal.
func TestRestartWhoseAnswerIsLostIsNotNotRequested(t *testing.T) {
	fs, d, _, daemon := fakeSystemdBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := restartAsync(ctx, d, "kubelet.service")
	fs.answer(t, fs.expect(t, "ResetFailedUnit", "kubelet.service"))
	fs.read(t, "kubelet.service")
	fs.expect(t, "RestartUnit", "kubelet.service")
	if err := daemon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if err == nil || errors.Is(err, ErrNotRequested) || errors.Is(err, ErrJobRefused) {
		t.Fatalf("a restart whose call systemd got, its answer lost: %v; want an error neither ErrNotRequested nor ErrJobRefused", err)
	}
}

// Held: a reset-failed that systemd answers with an error (the bus is up)
// leaves the restart unasked: ErrNotRequested, and no RestartUnit.
func TestRestartWhoseResetFailedIsRefusedIsNotRequested(t *testing.T) {
	fs, d, _, _ := fakeSystemdBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := restartAsync(ctx, d, "kubelet.service")
	call := fs.expect(t, "ResetFailedUnit", "kubelet.service")
	reply := &godbus.Message{Type: godbus.TypeError, Headers: map[godbus.HeaderField]godbus.Variant{
		godbus.FieldDestination: call.Headers[godbus.FieldSender],
		godbus.FieldReplySerial: godbus.MakeVariant(call.Serial()),
		godbus.FieldErrorName:   godbus.MakeVariant("org.freedesktop.systemd1.NoSuchUnit"),
		godbus.FieldSignature:   godbus.MakeVariant(godbus.SignatureOf("")),
	}, Body: []any{"Unit kubelet.service not loaded."}}
	if err := fs.conn.Send(reply, nil).Err; err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrNotRequested) {
		t.Fatalf("a restart whose reset-failed systemd refused: %v, want ErrNotRequested", err)
	}
}
