package systemd

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

// reexecSystemd is a fake systemd on a private bus (a real dbus-daemon)
// that re-executes when it is sent the restart: it leaves the bus without
// answering it, so dbus-daemon answers the restart NoReply, as it does at
// `systemctl daemon-reexec`; the systemd that comes back (a connection
// queued for the name, its owner at once) answers what follows. Every
// call it answers is recorded by its member, in order.
type reexecSystemd struct {
	t     *testing.T
	sock  string
	unit  godbusUnitStatus
	inv   []byte
	mu    sync.Mutex
	calls []string
	// jobAfter is the job the unit has once systemd is back (0: none):
	// the restart was taken before the re-exec, and is still on its way.
	jobAfter uint32
}

// own connects and asks for systemd's name: at once, or queued for it (a
// connection that failed is an error of the test, and nil).
func (fs *reexecSystemd) own(queue bool) (*godbus.Conn, chan *godbus.Message) {
	t := fs.t
	c, err := DialBus(t.Context(), fs.sock)
	if err != nil {
		t.Error(err)
		return nil, nil
	}
	flags := godbus.NameFlagDoNotQueue
	want := godbus.RequestNameReplyPrimaryOwner
	if queue {
		flags, want = 0, godbus.RequestNameReplyInQueue
	}
	if r, err := c.RequestName(sdService, flags); err != nil || r != want {
		t.Errorf("RequestName %s: %v, %v", sdService, r, err)
		c.Close()
		return nil, nil
	}
	in := make(chan *godbus.Message, 100)
	c.Eavesdrop(in)
	return c, in
}

func (fs *reexecSystemd) record(member string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.calls = append(fs.calls, member)
}

func (fs *reexecSystemd) called() []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.calls)
}

func count(calls []string, member string) int {
	n := 0
	for _, c := range calls {
		if c == member {
			n++
		}
	}
	return n
}

// start owns systemd's name and answers calls until the restart's
// JobRemoved is sent (the channel returned is closed then) or the test
// ends.
func (fs *reexecSystemd) start() <-chan struct{} {
	conn, in := fs.own(false)
	if conn == nil {
		fs.t.FailNow()
	}
	done := make(chan struct{})
	go fs.serve(conn, in, done)
	return done
}

func (fs *reexecSystemd) serve(conn *godbus.Conn, in chan *godbus.Message, done chan<- struct{}) {
	t := fs.t
	restarts := 0
	answer := func(call *godbus.Message, body ...any) {
		reply := &godbus.Message{Type: godbus.TypeMethodReply, Headers: map[godbus.HeaderField]godbus.Variant{
			godbus.FieldDestination: call.Headers[godbus.FieldSender],
			godbus.FieldReplySerial: godbus.MakeVariant(call.Serial()),
		}, Body: body}
		if len(body) > 0 {
			reply.Headers[godbus.FieldSignature] = godbus.MakeVariant(godbus.SignatureOf(body...))
		}
		if err := conn.Send(reply, nil).Err; err != nil {
			t.Error(err)
		}
	}
	for {
		var m *godbus.Message
		select {
		case m = <-in:
		case <-t.Context().Done():
			return
		}
		if m == nil || m.Type != godbus.TypeMethodCall {
			continue
		}
		member, _ := m.Headers[godbus.FieldMember].Value().(string)
		switch member {
		case "ListUnitsByNames":
			fs.record(member)
			answer(m, []godbusUnitStatus{fs.unit})
		case "Get":
			props := map[string]any{"InvocationID": fs.inv, "Result": "success", "NRestarts": uint32(0)}
			v, ok := props[m.Body[1].(string)]
			if !ok {
				v = uint64(1)
			}
			answer(m, godbus.MakeVariant(v))
		case "ResetFailedUnit":
			fs.record(member)
			answer(m)
		case "RestartUnit":
			fs.record(member)
			restarts++
			if restarts == 1 {
				// Re-executes: the one that comes back is queued for
				// the name, and owns it once this one left.
				next, nextIn := fs.own(true)
				if next == nil {
					return
				}
				if fs.jobAfter != 0 {
					fs.unit.JobID, fs.unit.JobType = fs.jobAfter, "restart"
					fs.unit.JobPath = "/org/freedesktop/systemd1/job/41"
				}
				conn.Close()
				conn, in = next, nextIn
				continue
			}
			job := godbus.ObjectPath("/org/freedesktop/systemd1/job/42")
			answer(m, job)
			fs.inv = []byte{0xcd}
			if err := conn.Emit("/org/freedesktop/systemd1", sdService+".Manager.JobRemoved", uint32(42), job, m.Body[0], "done"); err != nil {
				t.Error(err)
			}
			close(done)
			return
		}
	}
}

// systemd re-executes (`systemctl daemon-reexec`, run by every upgrade of
// its package) while the repairer's restart of a hung kubelet is on its way
// to it: it leaves the bus without answering, and dbus-daemon answers the
// restart NoReply. systemd did not take it (the unit, read once systemd is
// back, is as it was, with no job): the restart is sent once more, and the
// unit is restarted now, not a cooldown later (1 min for kubelet, 2 for
// containerd, with the unit still down). Before, the restart failed with the
// NoReply.
func TestRestartRetriedAfterSystemdDisconnectedWithoutReplying(t *testing.T) {
	sock, _ := privateBus(t)
	fs := &reexecSystemd{t: t, sock: sock, inv: []byte{0xab},
		unit: godbusUnitStatus{"kubelet.service", "", "loaded", "active", "running", "", "/org/freedesktop/systemd1/unit/kubelet_2eservice", 0, "", "/"}}
	done := fs.start()
	d := NewDBusAt(sock)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Restart(ctx, "kubelet.service"); err != nil {
		t.Fatalf("a restart systemd's re-exec left unanswered, not taken: %v", err)
	}
	<-done
	if calls := fs.called(); count(calls, "RestartUnit") != 2 {
		t.Errorf("calls %v: want the restart sent twice", calls)
	}
}

// The restart systemd's re-exec left unanswered was taken before it: once
// systemd is back the unit has a restart job. It is not sent again (a
// second RestartUnit would run the restart again, merged into the running
// job): the restart ends with an error that says the result is unknown, and
// the repairer reads the unit again, as after a lost connection.
func TestRestartTakenBeforeSystemdReexecIsNotSentAgain(t *testing.T) {
	sock, _ := privateBus(t)
	fs := &reexecSystemd{t: t, sock: sock, inv: []byte{0xab}, jobAfter: 41,
		unit: godbusUnitStatus{"kubelet.service", "", "loaded", "active", "running", "", "/org/freedesktop/systemd1/unit/kubelet_2eservice", 0, "", "/"}}
	fs.start()
	d := NewDBusAt(sock)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := d.Restart(ctx, "kubelet.service")
	if !errors.Is(err, ErrJobReplyLost) {
		t.Fatalf("a restart systemd took before its re-exec: %v, want ErrJobReplyLost", err)
	}
	if calls := fs.called(); count(calls, "RestartUnit") != 1 {
		t.Errorf("calls %v: want the restart sent once", calls)
	}
}
