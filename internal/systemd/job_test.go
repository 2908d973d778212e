package systemd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/syself/autopilot-health/internal/testenv"
)

// privateBus starts a dbus-daemon of its own on a socket in a temporary
// directory (EXTERNAL authentication, every call allowed) and returns the
// socket and the daemon's process, killed at the end of the test. Without
// /usr/bin/dbus-daemon the test is skipped, but not in CI (CI=true), which
// installs it.
func privateBus(t *testing.T) (string, *exec.Cmd) {
	t.Helper()
	const daemon = "/usr/bin/dbus-daemon"
	if _, err := os.Stat(daemon); err != nil {
		testenv.Skip(t, fmt.Sprintf("no dbus-daemon (apt install dbus): %v", err))
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "bus")
	conf := filepath.Join(dir, "bus.conf")
	err := os.WriteFile(conf, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path=`+sock+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemon, "--nofork", "--print-address", "--config-file="+conf)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("dbus-daemon's stderr: %s", stderr.Bytes())
		}
	})
	// It prints its address once it listens.
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.Contains(line, sock) {
		t.Fatalf("dbus-daemon printed %q, %v; want its address", line, err)
	}
	return sock, cmd
}

// fakeSystemd is systemd's manager on a bus, as far as a restart needs it:
// it answers ResetFailedUnit and RestartUnit (with a job path), and sends
// JobRemoved only when told to. It reads and writes the messages itself
// (every message the connection receives comes to it), so that it knows
// when its answer is sent.
type fakeSystemd struct {
	conn *godbus.Conn
	in   chan *godbus.Message
}

func startFakeSystemd(t *testing.T, sock string) *fakeSystemd {
	t.Helper()
	// Its context is the connection's life (godbus closes it when done).
	c, err := DialBus(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if r, err := c.RequestName(sdService, godbus.NameFlagDoNotQueue); err != nil || r != godbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("RequestName %s: %v, %v", sdService, r, err)
	}
	fs := &fakeSystemd{conn: c, in: make(chan *godbus.Message, 100)}
	c.Eavesdrop(fs.in)
	return fs
}

// next returns the next message that is not a signal.
func (fs *fakeSystemd) next(t *testing.T) *godbus.Message {
	t.Helper()
	for m := range fs.in {
		if m.Type != godbus.TypeSignal {
			return m
		}
	}
	t.Fatal("the fake systemd's connection closed")
	return nil
}

// answer replies to a call (its body, if any, of the signature of body).
func (fs *fakeSystemd) answer(t *testing.T, call *godbus.Message, body ...any) {
	t.Helper()
	reply := &godbus.Message{Type: godbus.TypeMethodReply, Headers: map[godbus.HeaderField]godbus.Variant{
		godbus.FieldDestination: call.Headers[godbus.FieldSender],
		godbus.FieldReplySerial: godbus.MakeVariant(call.Serial()),
	}, Body: body}
	if len(body) > 0 {
		reply.Headers[godbus.FieldSignature] = godbus.MakeVariant(godbus.SignatureOf(body...))
	}
	if err := fs.conn.Send(reply, nil).Err; err != nil {
		t.Fatal(err)
	}
}

// expect reads the next call and checks it is member of the manager, with
// the unit as first argument.
func (fs *fakeSystemd) expect(t *testing.T, member, unit string) *godbus.Message {
	t.Helper()
	m := fs.next(t)
	if m.Type != godbus.TypeMethodCall || m.Headers[godbus.FieldMember].Value() != member ||
		m.Headers[godbus.FieldInterface].Value() != sdService+".Manager" || len(m.Body) == 0 || m.Body[0] != unit {
		t.Fatalf("got %v, want a call of %s(%s)", m, member, unit)
	}
	return m
}

// read answers a read of unit (ListUnitsByNames, then a Properties.Get of
// each property Units reads of a running service): running, at invocation
// ab.
func (fs *fakeSystemd) read(t *testing.T, unit string) {
	t.Helper()
	m := fs.next(t)
	if names, ok := m.Body[0].([]string); m.Headers[godbus.FieldMember].Value() != "ListUnitsByNames" || !ok || len(names) != 1 || names[0] != unit {
		t.Fatalf("got %v, want a ListUnitsByNames of %s", m, unit)
	}
	fs.answer(t, m, []godbusUnitStatus{{unit, "", "loaded", "active", "running", "", "/org/freedesktop/systemd1/unit/u", 0, "", "/"}})
	props := map[string]any{"InvocationID": []byte{0xab}, "Result": "success", "NRestarts": uint32(0), "ExecMainStartTimestamp": uint64(1), "ExecMainStartTimestampMonotonic": uint64(1)}
	for range props {
		m := fs.next(t)
		v, ok := props[m.Body[1].(string)]
		if m.Headers[godbus.FieldMember].Value() != "Get" || !ok {
			t.Fatalf("got %v, want a Properties.Get of one of %v", m, props)
		}
		fs.answer(t, m, godbus.MakeVariant(v))
	}
}

// restart answers the reset-failed, the read of the unit and the restart
// of unit (job 42), and
// returns once the client read the answer: its answer to a Ping sent after
// it came back (the bus keeps the order of one connection's messages, and
// the client reads its messages in order).
func (fs *fakeSystemd) restart(t *testing.T, unit string) godbus.ObjectPath {
	t.Helper()
	fs.answer(t, fs.expect(t, "ResetFailedUnit", unit))
	fs.read(t, unit)
	call := fs.expect(t, "RestartUnit", unit)
	job := godbus.ObjectPath("/org/freedesktop/systemd1/job/42")
	fs.answer(t, call, job)
	ping := &godbus.Message{Type: godbus.TypeMethodCall, Headers: map[godbus.HeaderField]godbus.Variant{
		godbus.FieldDestination: call.Headers[godbus.FieldSender],
		godbus.FieldPath:        godbus.MakeVariant(godbus.ObjectPath("/")),
		godbus.FieldInterface:   godbus.MakeVariant("org.freedesktop.DBus.Peer"),
		godbus.FieldMember:      godbus.MakeVariant("Ping"),
	}}
	// Its answer comes with the other messages (next), not to the Call,
	// which is left pending: its Err is not read.
	fs.conn.Send(ping, make(chan *godbus.Call, 1))
	if m := fs.next(t); m.Type != godbus.TypeMethodReply || m.Headers[godbus.FieldReplySerial].Value() != ping.Serial() {
		t.Fatalf("got %v, want the answer to the Ping", m)
	}
	return job
}

// restartAsync runs d.Restart of unit and returns its error on a channel.
// fakeSystemdBus starts a private bus (its dbus-daemon, daemon, at sock)
// with a fake systemd on it, and a client of it, closed at the test's end.
func fakeSystemdBus(t *testing.T) (fs *fakeSystemd, d *DBus, sock string, daemon *exec.Cmd) {
	t.Helper()
	sock, daemon = privateBus(t)
	fs = startFakeSystemd(t, sock)
	d = NewDBusAt(sock)
	t.Cleanup(func() { d.Close() })
	return fs, d, sock, daemon
}

func restartAsync(ctx context.Context, d *DBus, unit string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- d.Restart(ctx, unit) }()
	return done
}

// A restart whose JobRemoved the bus delivers succeeds; one that ends
// another way is a *JobError.
func TestRestartOverAPrivateBus(t *testing.T) {
	fs, d, _, _ := fakeSystemdBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, result := range []string{"done", "dependency"} {
		done := restartAsync(ctx, d, "kubelet.service")
		job := fs.restart(t, "kubelet.service")
		if err := fs.conn.Emit("/org/freedesktop/systemd1", sdService+".Manager.JobRemoved", uint32(42), job, "kubelet.service", result); err != nil {
			t.Fatal(err)
		}
		err := <-done
		if result == "done" && err != nil {
			t.Errorf("restart with JobRemoved %q: %v", result, err)
		}
		if result != "done" && !errors.Is(err, ErrJobFailed) {
			t.Errorf("restart with JobRemoved %q: %v, want ErrJobFailed", result, err)
		}
	}
}

// The bus goes away (dbus-daemon restarted) while the restart's job runs:
// its JobRemoved will never come, and the restart ends at once, with an
// error that says so, not at the end of its context (the repairer's 5
// minutes, in which it neither probes nor repairs the unit again).
func TestRestartEndsWhenTheBusGoesMidJob(t *testing.T) {
	fs, d, _, daemon := fakeSystemdBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	done := restartAsync(ctx, d, "kubelet.service")
	fs.restart(t, "kubelet.service")
	if err := daemon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrJobConnLost) {
			t.Fatalf("restart: %v, want ErrJobConnLost", err)
		}
		if want := "restart kubelet.service: D-Bus connection lost while waiting for the job's result (the job may still be running)"; err.Error() != want {
			t.Errorf("restart: %q, want %q", err, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the restart still waits 30 s after the bus went away")
	}
}

// RunJob ends when the job's connection is gone, and a result that came
// first is still read.
func TestRunJobEndsWhenItsConnectionIsGone(t *testing.T) {
	gone := make(chan struct{})
	close(gone)
	started := func(*sd.Conn, context.Context, string, string, chan<- string) (int, error) { return 42, nil }
	// Its context is the repairer's bound: ending there is the bug.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := RunJob(ctx, nil, gone, "kubelet.service", started)
	if !errors.Is(err, ErrJobConnLost) {
		t.Errorf("RunJob with its connection gone: %v, want ErrJobConnLost", err)
	}
	for _, result := range []string{"done", "failed"} {
		answered := func(_ *sd.Conn, _ context.Context, _, _ string, ch chan<- string) (int, error) {
			ch <- result
			return 42, nil
		}
		err := RunJob(context.Background(), nil, gone, "kubelet.service", answered)
		if got, want := fmt.Sprint(err), fmt.Sprint(map[string]error{"done": nil, "failed": &JobError{Unit: "kubelet.service", Result: "failed"}}[result]); got != want {
			t.Errorf("RunJob with result %q and then its connection gone: %v, want %v", result, got, want)
		}
	}
	// Without a connection to watch (nil), it waits for the result or ctx.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := RunJob(ctx, nil, nil, "kubelet.service", started); !errors.Is(err, context.Canceled) {
		t.Errorf("RunJob without a connection to watch: %v, want the context's end", err)
	}
}
