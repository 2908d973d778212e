package systemd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

// The daemon's own manager, NewDBus (the system bus, as the daemon and its
// commands make it), dials its job connections so that their failed writes
// are counted (newBusConn), as NewDBusAt's are: the count is what tells a
// RestartUnit whose write the bus cut from one systemd may have taken
// (TestRestartWhoseCallsWriteIsCutIsNotRequested, over NewDBusAt). Before,
// NewDBus dialed with godbus.SystemBusPrivate, whose connections no watch
// counted, so on a node the restart godbus ended with EOF first was still
// counted restarted. A closed connection leaves the registry.
func TestSystemBusJobConnectionsCountTheirFailedWrites(t *testing.T) {
	sock, _ := privateBus(t)
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path="+sock)
	d := NewDBus()
	t.Cleanup(func() { d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := d.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := watches.Load(c); !ok {
		c.Close()
		t.Fatal("a job connection of NewDBus has no writeWatch: its failed writes are not counted")
	}
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, ok := watches.Load(c); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection's writeWatch is still registered after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A bus that ends its connection in the middle of a message, after the
// message's header fields and before their padding (the bus going while it
// sends a signal, or the job's end closing the connection while a signal
// is read): the job's connection ends, as a connection of godbus's own
// unix transport does. Before, godbus v5.1.0's generic transport, which
// newBusConn's connections read through, panicked there (dec.align(8) in
// DecodeMessageWithFDs, outside its decoder's recover), which ended the
// whole process: seen once in 50 runs of this package's
// TestSystemBusJobConnectionsCountTheirFailedWrites under -race, a close
// while the bus's NameAcquired was read.
func TestJobConnectionCutInAMessageEndsWithoutAPanic(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	client, bus := conn(fds[0]), conn(fds[1])
	defer bus.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bus.SetDeadline(time.Now().Add(time.Minute))
	// The bus's side of the auth, then a signal cut after its header
	// fields, whose length (not a multiple of 8) leaves padding unsent.
	busErr := make(chan error, 1)
	go func() {
		busErr <- func() error {
			in := bufio.NewReader(bus)
			if _, err := in.ReadString('\n'); err != nil { // \0AUTH
				return err
			}
			if _, err := io.WriteString(bus, "REJECTED EXTERNAL\r\n"); err != nil {
				return err
			}
			if _, err := in.ReadString('\n'); err != nil { // AUTH EXTERNAL <uid>
				return err
			}
			if _, err := io.WriteString(bus, "OK 0123456789abcdef0123456789abcdef\r\n"); err != nil {
				return err
			}
			if _, err := in.ReadString('\n'); err != nil { // BEGIN
				return err
			}
			return nil
		}()
	}()
	c, err := godbus.NewConn(&writeWatch{Conn: client}, godbus.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		t.Fatal(err)
	}
	if err := <-busErr; err != nil {
		t.Fatal(err)
	}
	msg := &godbus.Message{Type: godbus.TypeSignal, Headers: map[godbus.HeaderField]godbus.Variant{
		godbus.FieldPath:      godbus.MakeVariant(godbus.ObjectPath("/org/freedesktop/DBus")),
		godbus.FieldInterface: godbus.MakeVariant("org.freedesktop.DBus"),
		godbus.FieldMember:    godbus.MakeVariant("NameAcquired"),
		godbus.FieldSignature: godbus.MakeVariant(godbus.SignatureOf("")),
	}, Body: []any{":1.42"}}
	msg.Headers[godbus.FieldSignature] = godbus.MakeVariant(godbus.SignatureOf(":1.42"))
	var b bytes.Buffer
	if err := msg.EncodeTo(&b, binary.LittleEndian); err != nil {
		t.Fatal(err)
	}
	fields := binary.LittleEndian.Uint32(b.Bytes()[12:16])
	if fields%8 == 0 {
		t.Fatalf("header fields of %d bytes: no padding to cut before", fields)
	}
	if _, err := bus.Write(b.Bytes()[:16+fields]); err != nil {
		t.Fatal(err)
	}
	bus.Close()
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("the connection did not end with the bus's")
	}
}
