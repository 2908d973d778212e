package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// stopKmsg is a kernel log whose records the test hands in (push). A read
// that finds none waits for one until its deadline; a read woken by the
// stop's deadline (now) returns the record that came as SIGTERM came (last)
// once the Event writer's last send was made (sent), or after lastWait.
type stopKmsg struct {
	mu       sync.Mutex
	recs     [][]byte
	deadline time.Time
	wake     chan struct{}
	// reading gets a token at each read that found no record.
	reading chan struct{}
	last    []byte
	sent    chan struct{}
}

// lastWait bounds the wait of the read at the stop for the Event writer's
// last send: the reader stopped first, that send comes only after it.
const lastWait = 2 * time.Second

func (k *stopKmsg) push(rec []byte) {
	k.mu.Lock()
	k.recs = append(k.recs, rec)
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *stopKmsg) Read(p []byte) (int, error) {
	for {
		k.mu.Lock()
		if len(k.recs) > 0 {
			r := k.recs[0]
			k.recs = k.recs[1:]
			k.mu.Unlock()
			return copy(p, r), nil
		}
		wait := time.Until(k.deadline)
		k.mu.Unlock()
		select {
		case k.reading <- struct{}{}:
		default:
		}
		if wait <= 0 {
			if k.last == nil {
				return 0, os.ErrDeadlineExceeded
			}
			// The stop: a record comes with it.
			select {
			case <-k.sent:
			case <-time.After(lastWait):
			}
			r := k.last
			k.last = nil
			return copy(p, r), nil
		}
		select {
		case <-k.wake:
		case <-time.After(min(wait, 20*time.Millisecond)):
		}
	}
}

func (k *stopKmsg) SetReadDeadline(t time.Time) error {
	k.mu.Lock()
	k.deadline = t
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
	return nil
}

func (*stopKmsg) Seek(int64, int) (int64, error) { return 0, nil }
func (*stopKmsg) Close() error                   { return nil }

// A clean stop (SIGTERM) while a kernel record comes: the kernel log
// reader stops first, and the Event writer's last send and snapshot come
// after it, so the final save's cursor is past no record whose occurrence
// is not on the API server: its Event counts every record up to the
// cursor, and nothing waits in the state file to be counted at the next
// start. Stopped together, the reader handled the record after the
// writer's last send, and the cursor saved was past it: an occurrence in
// no Event (449 of 450 in TestKmsgBurstAcrossRestart's SIGTERM case).
func TestStopEndsTheKernelLogReaderBeforeTheEventWriter(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kmsg.Enabled = true
	cfg.Kmsg.FromBootStart = true
	line := func(seq int) []byte {
		return fmt.Appendf(nil, "4,%d,%d,-;EXT4-fs warning (device sda1): burst line\n", seq, kmsg.MonotonicNow())
	}
	dev := &stopKmsg{wake: make(chan struct{}, 1), reading: make(chan struct{}, 1), last: line(3), sent: make(chan struct{})}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	created := make(chan struct{}, 1)
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case created <- struct{}{}:
		default:
		}
		return false, nil, nil
	})
	var once sync.Once
	client.PrependReactor("patch", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(dev.sent) })
		return false, nil, nil
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Kube: kubefake.New(client),
		KmsgOpen: func(context.Context, string) (kmsg.Device, error) { return dev, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	dev.push(line(1))
	<-created         // the Event, count 1
	dev.push(line(2)) // folded: its count waits for the patch (10 s)
	// Handled: the reader waits for the next record.
	for {
		<-dev.reading
		var c struct {
			Seq uint64 `json:"seq"`
		}
		if d.store.Memo(kmsg.CursorKey, &c) && c.Seq == 2 {
			break
		}
	}
	cancel() // SIGTERM
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	b, err := os.ReadFile(filepath.Join(cfg.StateDir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Memos struct {
			Kmsg struct {
				Seq uint64 `json:"seq"`
			} `json:"kmsg"`
			Events struct {
				Queued []json.RawMessage `json:"queued"`
			} `json:"events"`
		} `json:"memos"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	evs, err := client.CoreV1().Events(kube.EventNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var count int32
	for _, e := range evs.Items {
		count += e.Count
	}
	if uint64(count) != f.Memos.Kmsg.Seq || len(f.Memos.Events.Queued) != 0 {
		t.Errorf("after SIGTERM: the cursor saved at record %d, the Events count %d, %d occurrence(s) left for the next start; want the Events to count every record up to the cursor, none left", f.Memos.Kmsg.Seq, count, len(f.Memos.Events.Queued))
	}
}

// A stop while the kernel log's open waits (the privileged helper not
// answering: its client waits up to 30 s, the unit's TimeoutStopSec) does
// not wait behind it: the reader's open is given the reader's context and
// returns at the stop, and the Event writer's last send (a count folded
// since the Event's create) and the final save follow at once. Before, the
// open had no context and Run awaited the reader first: the stop waited
// for the helper's answer, and systemd's SIGKILL could come first.
func TestStopDoesNotWaitBehindAHungKernelLogOpen(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kmsg.Enabled = true
	cfg.Kmsg.FromBootStart = true
	opening := make(chan struct{})
	release := make(chan struct{}) // an open that ignores its context is let go at the test's end
	t.Cleanup(func() { close(release) })
	var openOnce sync.Once
	open := func(ctx context.Context, _ string) (kmsg.Device, error) {
		openOnce.Do(func() { close(opening) })
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-release:
			return nil, os.ErrDeadlineExceeded
		}
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	created := make(chan struct{}, 1)
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case created <- struct{}{}:
		default:
		}
		return false, nil, nil
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Kube: kubefake.New(client), KmsgOpen: open})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-opening
	ev := report.Event{Reason: "IOError", Message: "I/O error, dev sda, sector 8", Time: time.Now()}
	d.store.Emit(ev)
	<-created        // the Event, count 1
	d.store.Emit(ev) // folded: its count waits for the patch (10 s), or the last send
	cancel()         // SIGTERM, the open still waiting
	// A bound on a hang, not a timing: the open waits for ever unless
	// the stop ends it.
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run has not returned 10 s after SIGTERM: the stop waits behind the kernel log's open")
	}
	evs, err := client.CoreV1().Events(kube.EventNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].Count != 2 {
		t.Errorf("after SIGTERM: %d Events (%v); want 1 of count 2 (the last send made)", len(evs.Items), evs.Items)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "state.json")); err != nil {
		t.Errorf("the final save: %v", err)
	}
}
