package systemd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

// The calls the daemon encodes are what godbus decodes: header fields and
// arguments, for each shape of call it makes.
func TestCallsDecodeAsGodbusReadsThem(t *testing.T) {
	for _, tc := range []struct {
		call busCall
		sig  string
		body []any
	}{
		{managerCall("ListUnitsByNames", true, "kubelet.service", "containerd.service", "a"), "as", []any{[]string{"kubelet.service", "containerd.service", "a"}}},
		{managerCall("ListUnitsByNames", true), "as", []any{[]string{}}},
		{busCall{dest: sdService, path: "/org/freedesktop/systemd1/unit/kubelet_2eservice", iface: "org.freedesktop.DBus.Properties", member: "Get",
			args: []string{sdService + ".Service", "NRestarts"}}, "ss", []any{sdService + ".Service", "NRestarts"}},
		{managerCall("ResetFailedUnit", false, "x.service"), "s", []any{"x.service"}},
		{busCall{dest: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", iface: "org.freedesktop.DBus", member: "Hello"}, "", nil},
	} {
		// After another message of an odd length: alignment is from
		// each message's start.
		prev, err := appendCall([]byte("BEGIN\r\n"), 6, tc.call)
		if err != nil {
			t.Fatal(err)
		}
		b, err := appendCall(prev, 7, tc.call)
		if err != nil {
			t.Fatal(err)
		}
		r := bytes.NewReader(b[len("BEGIN\r\n"):])
		for _, serial := range []uint32{6, 7} {
			m, err := godbus.DecodeMessage(r)
			if err != nil {
				t.Fatalf("%s: godbus: %v", tc.call.member, err)
			}
			if m.Type != godbus.TypeMethodCall || m.Serial() != serial {
				t.Errorf("%s: type %v serial %d", tc.call.member, m.Type, m.Serial())
			}
			want := map[godbus.HeaderField]any{
				godbus.FieldPath:        godbus.ObjectPath(tc.call.path),
				godbus.FieldInterface:   tc.call.iface,
				godbus.FieldMember:      tc.call.member,
				godbus.FieldDestination: tc.call.dest,
			}
			if tc.sig != "" {
				want[godbus.FieldSignature] = godbus.ParseSignatureMust(tc.sig)
			}
			got := map[godbus.HeaderField]any{}
			for k, v := range m.Headers {
				got[k] = v.Value()
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: headers %v, want %v", tc.call.member, got, want)
			}
			if len(m.Body) != len(tc.body) || (len(tc.body) > 0 && !reflect.DeepEqual(m.Body, tc.body)) {
				t.Errorf("%s: body %#v, want %#v", tc.call.member, m.Body, tc.body)
			}
		}
		if r.Len() != 0 {
			t.Errorf("%s: %d bytes left", tc.call.member, r.Len())
		}
	}
	if _, err := appendCall(nil, 1, managerCall("ResetFailedUnit", false, "a\x00b")); err == nil {
		t.Error("a NUL in an argument was encoded")
	}
	if _, err := appendCall(nil, 1, managerCall("ResetFailedUnit", false, "\xff")); err == nil {
		t.Error("an argument that is not UTF-8 was encoded")
	}
}

// encodeReply is an answer as the bus sends it, encoded by godbus, with
// header fields the daemon does not read (sender, destination) among those
// it does.
func encodeReply(t testing.TB, order binary.ByteOrder, typ godbus.Type, serial, replyTo uint32, errName string, body ...any) []byte {
	t.Helper()
	m := &godbus.Message{Type: typ, Headers: map[godbus.HeaderField]godbus.Variant{
		godbus.FieldSender:      godbus.MakeVariant("org.freedesktop.systemd1"),
		godbus.FieldDestination: godbus.MakeVariant(":1.42"),
	}, Body: body}
	switch typ {
	case godbus.TypeSignal:
		m.Headers[godbus.FieldPath] = godbus.MakeVariant(godbus.ObjectPath("/org/freedesktop/DBus"))
		m.Headers[godbus.FieldInterface] = godbus.MakeVariant("org.freedesktop.DBus")
		m.Headers[godbus.FieldMember] = godbus.MakeVariant("NameAcquired")
	default:
		m.Headers[godbus.FieldReplySerial] = godbus.MakeVariant(replyTo)
	}
	if errName != "" {
		m.Headers[godbus.FieldErrorName] = godbus.MakeVariant(errName)
	}
	if len(body) > 0 {
		m.Headers[godbus.FieldSignature] = godbus.MakeVariant(godbus.SignatureOf(body...))
	}
	var buf bytes.Buffer
	if err := m.EncodeTo(&buf, order); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	order.PutUint32(b[8:], serial) // godbus sets it only for messages it sends itself
	return b
}

// godbusUnitStatus is ListUnitsByNames' entry as godbus encodes it.
type godbusUnitStatus struct {
	Name, Description, LoadState, ActiveState, SubState, Following string
	Path                                                           godbus.ObjectPath
	JobID                                                          uint32
	JobType                                                        string
	JobPath                                                        godbus.ObjectPath
}

// The answers godbus encodes, in either byte order, are what the daemon
// decodes: ListUnitsByNames' states, the property types it reads, errors,
// and a signal passed over.
func TestAnswersDecodeAsGodbusWritesThem(t *testing.T) {
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		st := []godbusUnitStatus{
			{"kubelet.service", "kubelet", "loaded", "active", "running", "", "/org/freedesktop/systemd1/unit/kubelet_2eservice", 0, "", "/"},
			{"x.service", "", "not-found", "inactive", "dead", "", "/org/freedesktop/systemd1/unit/x_2eservice", 7, "start", "/org/freedesktop/systemd1/job/7"},
		}
		m := parse(t, encodeReply(t, order, godbus.TypeMethodReply, 3, 2, "", st))
		if m.typ != msgReturn || m.serial != 3 || m.replySerial != 2 {
			t.Fatalf("%v: %+v", order, m)
		}
		got, err := parseUnitStatuses(m)
		if err != nil {
			t.Fatal(err)
		}
		want := []unitStatus{
			{"kubelet.service", "kubelet", "loaded", "active", "running", "", "/org/freedesktop/systemd1/unit/kubelet_2eservice", 0, "", "/"},
			{"x.service", "", "not-found", "inactive", "dead", "", "/org/freedesktop/systemd1/unit/x_2eservice", 7, "start", "/org/freedesktop/systemd1/job/7"},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v: %+v", order, got)
		}
		if got, err := parseUnitStatuses(parse(t, encodeReply(t, order, godbus.TypeMethodReply, 3, 2, "", []godbusUnitStatus{}))); err != nil || len(got) != 0 {
			t.Errorf("%v: empty list: %v, %v", order, got, err)
		}

		for _, tc := range []struct {
			v    any
			want variant
		}{
			{"success", variant{sig: "s", str: "success"}},
			{uint32(4), variant{sig: "u", num: 4}},
			{uint64(1764763200123456), variant{sig: "t", num: 1764763200123456}},
			{[]byte{0xde, 0xad, 0, 1}, variant{sig: "ay", bytes: []byte{0xde, 0xad, 0, 1}}},
			{[]byte{}, variant{sig: "ay", bytes: []byte{}}},
			{true, variant{sig: "b", num: 1}},
			{[]string{"containerd.service", "b"}, variant{sig: "as", strs: []string{"containerd.service", "b"}}},
			{[]string{}, variant{sig: "as"}},
			{map[string]godbus.Variant{"k": godbus.MakeVariant(int16(-3))}, variant{sig: "a{sv}"}},
			{struct {
				A uint64
				B string
			}{1, "x"}, variant{sig: "(ts)"}},
		} {
			m := parse(t, encodeReply(t, order, godbus.TypeMethodReply, 9, 8, "", godbus.MakeVariant(tc.v)))
			got, err := parseVariant(m)
			if err != nil {
				t.Errorf("%v: %#v: %v", order, tc.v, err)
				continue
			}
			if got.sig != tc.want.sig || got.str != tc.want.str || got.num != tc.want.num || !bytes.Equal(got.bytes, tc.want.bytes) || !slices.Equal(got.strs, tc.want.strs) {
				t.Errorf("%v: %#v: %+v, want %+v", order, tc.v, got, tc.want)
			}
		}

		e := parse(t, encodeReply(t, order, godbus.TypeError, 4, 3, "org.freedesktop.systemd1.NoSuchUnit", "Unit x.service not loaded."))
		var be *BusError
		if err := errorOf(e); e.typ != msgError || !errors.As(err, &be) || be.Name != "org.freedesktop.systemd1.NoSuchUnit" || err.Error() != "Unit x.service not loaded." {
			t.Errorf("%v: error %+v: %v", order, e, err)
		}
		if err := errorOf(parse(t, encodeReply(t, order, godbus.TypeError, 4, 3, "org.example.Bare"))); err.Error() != "org.example.Bare" {
			t.Errorf("%v: a bare error: %v", order, err)
		}
		s := parse(t, encodeReply(t, order, godbus.TypeSignal, 5, 0, "", ":1.42"))
		if s.typ != msgSignal || s.replySerial != 0 {
			t.Errorf("%v: signal %+v", order, s)
		}
		if name, err := parseString(s); err != nil || name != ":1.42" {
			t.Errorf("%v: %q, %v", order, name, err)
		}
	}
}

// parse frames and decodes one message as busConn.next does.
func parse(t testing.TB, b []byte) message {
	t.Helper()
	n, err := messageLen(b)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(b) {
		t.Fatalf("messageLen %d of %d bytes", n, len(b))
	}
	m, err := parseMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Malformed messages are errors, never a panic or a value read past the
// message.
func TestMalformedMessages(t *testing.T) {
	good := encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, 3, 2, "", godbus.MakeVariant("x"))
	set := func(off int, b ...byte) []byte {
		c := bytes.Clone(good)
		copy(c[off:], b)
		return c
	}
	for name, b := range map[string][]byte{
		"short":            good[:15],
		"truncated":        good[:len(good)-1],
		"byte order":       set(0, 'x'),
		"version":          set(3, 2),
		"body too long":    set(4, 0xff),
		"fields too long":  set(12, 0xff, 0xff),
		"serial 0":         set(8, 0, 0, 0, 0),
		"trailing garbage": append(bytes.Clone(good), 0, 0, 0, 0, 0, 0, 0, 0),
	} {
		if _, err := parseMessage(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if n, err := messageLen(set(4, 0, 0, 0x20, 0)); err != nil || n < 2<<20 {
		t.Errorf("a 2 MiB message (the connection passes over it): %d, %v", n, err)
	}
	if _, err := messageLen(set(4, 0, 0, 0, 0x10)); err == nil {
		t.Error("a 256 MiB message was framed: the protocol's largest is 128 MiB")
	}
	// A variant of a variant ... deeper than maxDepth.
	v := godbus.MakeVariant("x")
	for range maxDepth + 2 {
		v = godbus.MakeVariant(v)
	}
	deep := encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, 3, 2, "", v)
	if m, err := parseMessage(deep); err == nil {
		if _, err := parseVariant(m); err == nil {
			t.Error("a variant nested past maxDepth was read")
		}
	}
	// Answers of another signature than the call's.
	if _, err := parseUnitStatuses(parse(t, good)); err == nil {
		t.Error("a variant read as ListUnitsByNames' answer")
	}
	if _, err := parseVariant(parse(t, encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, 3, 2, "", "x"))); err == nil {
		t.Error("a string read as a variant")
	}
}

func TestSignatures(t *testing.T) {
	for sig, want := range map[string]string{"a(ssssssouso)": "a(ssssssouso)", "a{sv}u": "a{sv}", "v": "v", "aay": "aay", "(i(ii))s": "(i(ii))"} {
		if got, _, err := nextType(sig); err != nil || got != want {
			t.Errorf("%q: %q, %v", sig, got, err)
		}
	}
	for _, sig := range []string{"", "a", "(", "()", "(ii", "{s}", "{sss}", "z", strings.Repeat("a", maxDepth+2) + "y"} {
		if got, _, err := nextType(sig); err == nil {
			t.Errorf("%q: %q accepted", sig, got)
		}
	}
}

// FuzzParseMessage: whatever the bus sends, the decoder returns an error
// or values within the message, never a panic.
func FuzzParseMessage(f *testing.F) {
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		f.Add(encodeReply(f, order, godbus.TypeMethodReply, 3, 2, "", []godbusUnitStatus{{Name: "a", Path: "/a", JobPath: "/"}}))
		f.Add(encodeReply(f, order, godbus.TypeMethodReply, 3, 2, "", godbus.MakeVariant([]byte{1, 2})))
		f.Add(encodeReply(f, order, godbus.TypeMethodReply, 3, 2, "", godbus.MakeVariant([]string{"containerd.service", "b"})))
		f.Add(encodeReply(f, order, godbus.TypeMethodReply, 3, 2, "", godbus.MakeVariant(map[string]godbus.Variant{"k": godbus.MakeVariant(uint64(1))})))
		f.Add(encodeReply(f, order, godbus.TypeError, 4, 3, "org.example.E", "m"))
		f.Add(encodeReply(f, order, godbus.TypeSignal, 5, 0, "", ":1.1"))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 16 {
			return
		}
		n, err := messageLen(b)
		if err != nil || n > len(b) {
			return
		}
		m, err := parseMessage(b[:n])
		if err != nil {
			return
		}
		parseUnitStatuses(m)
		parseVariant(m)
		parseString(m)
		errorOf(m)
	})
}

// fakeBus is a bus on a unix socket that authenticates anyone, answers
// Hello (and sends NameAcquired after it), and hands every other call to
// answer with the calls not answered yet: answer returns the messages to
// send, or nil to wait for more calls.
type fakeBus struct {
	sock   string
	answer func(conn int, pending []*godbus.Message) [][]byte
	conns  int
}

func startFakeBus(t *testing.T, answer func(conn int, pending []*godbus.Message) [][]byte) *fakeBus {
	t.Helper()
	fb := &fakeBus{sock: filepath.Join(t.TempDir(), "bus"), answer: answer}
	ln, err := net.Listen("unix", fb.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fb.conns++
			go fb.serve(t, fb.conns, c)
		}
	}()
	return fb
}

func (fb *fakeBus) serve(t *testing.T, conn int, c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "\x00AUTH EXTERNAL ") {
		return
	}
	c.Write([]byte("OK 0123456789abcdef0123456789abcdef\r\n"))
	if line, err = r.ReadString('\n'); err != nil || line != "BEGIN\r\n" {
		return
	}
	var pending []*godbus.Message
	serial := uint32(100)
	for {
		m, err := godbus.DecodeMessage(r)
		if err != nil {
			return
		}
		if m.Headers[godbus.FieldMember].Value() == "Hello" {
			serial += 2
			c.Write(append(encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, serial, m.Serial(), "", ":1.7"),
				encodeReply(t, binary.LittleEndian, godbus.TypeSignal, serial+1, 0, "", ":1.7")...))
			continue
		}
		pending = append(pending, m)
		if out := fb.answer(conn, pending); out != nil {
			pending = nil
			c.Write(bytes.Join(out, nil))
		}
	}
}

// Units over a bus that answers the property reads in the reverse order,
// with a signal among them; then a bus that sends garbage, which closes the
// connection and the read is made again on a new one; an error answer
// leaves the connection up.
func TestUnitsOverAFakeBus(t *testing.T) {
	reply := func(m *godbus.Message, body ...any) []byte {
		return encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+1000, m.Serial(), "", body...)
	}
	garbage := true
	fb := startFakeBus(t, func(conn int, pending []*godbus.Message) [][]byte {
		m := pending[len(pending)-1]
		switch m.Headers[godbus.FieldMember].Value() {
		case "ListUnitsByNames":
			if conn == 1 && !garbage {
				return [][]byte{[]byte("Xgarbage, not a message.")}
			}
			return [][]byte{reply(m, []godbusUnitStatus{{"a.service", "", "loaded", "active", "running", "", "/u/a", 0, "", "/"}})}
		case "ResetFailedUnit":
			return [][]byte{encodeReply(t, binary.LittleEndian, godbus.TypeError, m.Serial()+1000, m.Serial(), "org.freedesktop.systemd1.NoSuchUnit", "Unit a.service not loaded.")}
		}
		if len(pending) < 5 {
			return nil
		}
		values := map[string]any{"InvocationID": []byte{0xab, 0xcd}, "Result": "success", "NRestarts": uint32(5), "ExecMainStartTimestamp": uint64(1_700_000_000_000_000),
			"ExecMainStartTimestampMonotonic": uint64(42_000_123)}
		var out [][]byte
		for i := len(pending) - 1; i >= 0; i-- {
			out = append(out, reply(pending[i], godbus.MakeVariant(values[pending[i].Body[1].(string)])))
			if i == 2 {
				out = append(out, encodeReply(t, binary.LittleEndian, godbus.TypeSignal, 999, 0, "", ":1.9"))
			}
		}
		return out
	})
	bus := NewDBusAt(fb.sock)
	defer bus.Close()
	ctx := context.Background()
	want := Unit{Name: "a.service", LoadState: "loaded", ActiveState: "active", SubState: "running", Result: "success", NRestarts: 5,
		Invocation: "abcd", MainStart: time.UnixMicro(1_700_000_000_000_000), MainStartMono: 42_000_123 * time.Microsecond}
	if u, err := bus.Unit(ctx, "a.service"); err != nil || u != want {
		t.Fatalf("%+v, %v", u, err)
	}
	garbage = false
	if u, err := bus.Unit(ctx, "a.service"); err != nil || u != want {
		t.Fatalf("after garbage: %+v, %v", u, err)
	}
	if bus.Reconnects != 1 || fb.conns != 2 {
		t.Errorf("%d reconnects, %d connections: want the garbage to close the first", bus.Reconnects, fb.conns)
	}
	var be *BusError
	if err := bus.ResetFailed(ctx, "a.service"); !errors.As(err, &be) || be.Name != "org.freedesktop.systemd1.NoSuchUnit" {
		t.Errorf("ResetFailed: %v", err)
	}
	if u, err := bus.Unit(ctx, "a.service"); err != nil || u != want || bus.Reconnects != 1 {
		t.Errorf("after an error answer: %+v, %v, %d reconnects", u, err, bus.Reconnects)
	}
}

func TestSystemBusSocket(t *testing.T) {
	for addr, want := range map[string]string{
		"": "/run/dbus/system_bus_socket",
		"unix:path=/var/run/dbus/system_bus_socket":                 "/var/run/dbus/system_bus_socket",
		"unix:path=/run/a%20b,guid=0123":                            "/run/a b",
		"tcp:host=localhost,port=1;unix:abstract=/tmp/dbus-x":       "@/tmp/dbus-x",
		"unixexec:path=/bin/x;unix:guid=1,path=/run/dbus/other_bus": "/run/dbus/other_bus",
	} {
		t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
		if got, err := systemBusSocket(); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", addr, got, err, want)
		}
	}
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", "tcp:host=localhost,port=1")
	if got, err := systemBusSocket(); err == nil {
		t.Errorf("a TCP address alone: %q", got)
	}
}

// SystemState is a Properties.Get of the manager's SystemState, on the
// connection the reads share; the stop job of a unit comes with its
// ListUnitsByNames entry. A value of another type is an error.
func TestSystemStateOverAFakeBus(t *testing.T) {
	reply := func(m *godbus.Message, body ...any) []byte {
		return encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+1000, m.Serial(), "", body...)
	}
	state := any("stopping")
	fb := startFakeBus(t, func(conn int, pending []*godbus.Message) [][]byte {
		m := pending[len(pending)-1]
		switch m.Headers[godbus.FieldMember].Value() {
		case "ListUnitsByNames":
			return [][]byte{reply(m, []godbusUnitStatus{{"k.service", "", "loaded", "deactivating", "stop-sigterm", "", "/u/k", 9, "stop", "/org/freedesktop/systemd1/job/9"}})}
		case "Get":
			if m.Headers[godbus.FieldPath].Value() != godbus.ObjectPath("/org/freedesktop/systemd1") || m.Body[0] != "org.freedesktop.systemd1.Manager" || m.Body[1] != "SystemState" {
				return [][]byte{reply(m, godbus.MakeVariant(""))} // a unit's property: not read here
			}
			return [][]byte{reply(m, godbus.MakeVariant(state))}
		}
		return nil
	})
	bus := NewDBusAt(fb.sock)
	defer bus.Close()
	ctx := context.Background()
	if st, err := bus.SystemState(ctx); err != nil || st != "stopping" {
		t.Fatalf("SystemState: %q, %v", st, err)
	}
	if stopping, err := Stopping(ctx, bus); err != nil || !stopping {
		t.Errorf("Stopping: %v, %v", stopping, err)
	}
	u, err := bus.Unit(ctx, "k.service")
	if err != nil || u.Job != 9 || u.JobType != "stop" {
		t.Errorf("a unit with a stop job: %+v, %v", u, err)
	}
	state = uint32(3)
	if st, err := bus.SystemState(ctx); !errors.Is(err, errBadMessage) {
		t.Errorf("SystemState of type u: %q, %v", st, err)
	}
	if fb.conns != 1 {
		t.Errorf("%d connections: the reads share one", fb.conns)
	}
}

// systemd re-executing (`systemctl daemon-reexec`, run by every upgrade of
// its package) leaves the bus without answering what it had been sent, and
// dbus-daemon answers each such call with NoReply ("Message recipient
// disconnected from message bus without replying"); calls sent after it
// wait for systemd to be back. The connection stays up: the call is made
// once more on it, and the check that read does not fail. A second NoReply
// is the error.
func TestReadRetriedAfterSystemdDisconnectedWithoutReplying(t *testing.T) {
	reply := func(m *godbus.Message, body ...any) []byte {
		return encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+1000, m.Serial(), "", body...)
	}
	noReply := func(m *godbus.Message) []byte {
		return encodeReply(t, binary.LittleEndian, godbus.TypeError, m.Serial()+1000, m.Serial(), "org.freedesktop.DBus.Error.NoReply",
			"Message recipient disconnected from message bus without replying")
	}
	noReplies := 1
	lists := 0
	fb := startFakeBus(t, func(conn int, pending []*godbus.Message) [][]byte {
		m := pending[len(pending)-1]
		switch m.Headers[godbus.FieldMember].Value() {
		case "ListUnitsByNames":
			lists++
			if noReplies > 0 {
				noReplies--
				return [][]byte{noReply(m)}
			}
			return [][]byte{reply(m, []godbusUnitStatus{{"a.socket", "", "loaded", "active", "listening", "", "/u/a", 0, "", "/"}})}
		case "Get":
			if m.Body[1] == "SystemState" {
				if noReplies > 0 {
					noReplies--
					return [][]byte{noReply(m)}
				}
				return [][]byte{reply(m, godbus.MakeVariant("running"))}
			}
			return [][]byte{reply(m, godbus.MakeVariant([]byte{0xab}))}
		case "ResetFailedUnit":
			if noReplies > 0 {
				noReplies--
				return [][]byte{noReply(m)}
			}
			return [][]byte{reply(m)}
		}
		return nil
	})
	bus := NewDBusAt(fb.sock)
	defer bus.Close()
	ctx := context.Background()
	if u, err := bus.Unit(ctx, "a.socket"); err != nil || u.ActiveState != "active" || u.Invocation != "ab" {
		t.Fatalf("a read that systemd's re-exec left unanswered: %+v, %v", u, err)
	}
	if lists != 2 {
		t.Errorf("ListUnitsByNames sent %d times, want 2", lists)
	}
	noReplies = 1
	if st, err := bus.SystemState(ctx); err != nil || st != "running" {
		t.Errorf("SystemState: %q, %v", st, err)
	}
	noReplies = 1
	if err := bus.ResetFailed(ctx, "a.socket"); err != nil {
		t.Errorf("ResetFailed: %v", err)
	}
	noReplies = 2
	var be *BusError
	if _, err := bus.Unit(ctx, "a.socket"); !errors.As(err, &be) || be.Name != "org.freedesktop.DBus.Error.NoReply" {
		t.Errorf("NoReply twice: %v, want the NoReply", err)
	}
	if fb.conns != 1 || bus.Reconnects != 0 {
		t.Errorf("%d connections, %d reconnects: the connection stays up", fb.conns, bus.Reconnects)
	}
}

// An "as" (a unit's BindsTo) whose array length does not end where its
// strings do is malformed: refused, not decoded as the strings read past
// (or short of) its end. One of many entries decodes as godbus wrote it.
func TestArrayOfStringsEndsAtItsLength(t *testing.T) {
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		many := []string{"containerd.service", "dev-disk-by\\x2duuid-1.device", "getty@tty1.service", "", "x.mount"}
		m := parse(t, encodeReply(t, order, godbus.TypeMethodReply, 3, 2, "", godbus.MakeVariant(many)))
		if v, err := parseVariant(m); err != nil || !slices.Equal(v.strs, many) {
			t.Errorf("%v: %d entries: %+v, %v", order, len(many), v, err)
		}
		one := parse(t, encodeReply(t, order, godbus.TypeMethodReply, 3, 2, "", godbus.MakeVariant([]string{"containerd.service"})))
		// The body: the signature (1, "as", NUL), then the array's length
		// at offset 4, then its one string (4 + 18 + 1 bytes).
		if got := order.Uint32(one.body[4:]); got != 23 {
			t.Fatalf("%v: the array's length %d, want 23", order, got)
		}
		for _, n := range []uint32{4, 22} {
			b := append([]byte(nil), one.body...)
			order.PutUint32(b[4:], n)
			bad := one
			bad.body = b
			if v, err := parseVariant(bad); !errors.Is(err, errBadMessage) {
				t.Errorf("%v: an array of %d bytes holding a string of 23: %+v, %v, want %v", order, n, v, err, errBadMessage)
			}
		}
	}
}
