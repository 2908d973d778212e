package daemon

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// idleListener is a metrics listener with no socket: Accept waits until
// Close (inside a synctest bubble that wait is durable, so the fake clock
// moves on).
type idleListener struct {
	once   sync.Once
	closed chan struct{}
}

func newIdleListener() *idleListener { return &idleListener{closed: make(chan struct{})} }

func (l *idleListener) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *idleListener) Close() error              { l.once.Do(func() { close(l.closed) }); return nil }
func (l *idleListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// quietKernelLog is a kernel log that logs nothing: a read waits until its
// deadline (on the fake clock inside a synctest bubble), or forever without
// one, and a new deadline wakes it.
type quietKernelLog struct {
	mu       sync.Mutex
	deadline time.Time
	moved    chan struct{} // closed when the deadline is set
}

func newQuietKernelLog() *quietKernelLog { return &quietKernelLog{moved: make(chan struct{})} }

func (k *quietKernelLog) Read([]byte) (int, error) {
	for {
		k.mu.Lock()
		d, moved := k.deadline, k.moved
		k.mu.Unlock()
		var at <-chan time.Time
		if !d.IsZero() {
			if !time.Now().Before(d) {
				return 0, os.ErrDeadlineExceeded
			}
			t := time.NewTimer(time.Until(d))
			defer t.Stop()
			at = t.C
		}
		select {
		case <-at:
		case <-moved:
		}
	}
}

func (k *quietKernelLog) SetReadDeadline(t time.Time) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.deadline = t
	close(k.moved)
	k.moved = make(chan struct{})
	return nil
}

func (*quietKernelLog) Seek(int64, int) (int64, error) { return 0, nil }
func (*quietKernelLog) Close() error                   { return nil }

// soakHours is how many simulated hours TestSoakSimulatedDay runs:
// SOAK_HOURS (make soak: 24), else 3.
func soakHours(t *testing.T) int {
	t.Helper()
	v := os.Getenv("SOAK_HOURS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("SOAK_HOURS=%q: want a positive number of hours", v)
	}
	return n
}

// Soak bounds, per node and hour: API writes, the 30 report refreshes at
// the 2-minute report_interval and nothing else: each condition heartbeat
// (every 5 to 5.5 minutes) rides on the report refresh before it falls due,
// one nodes/status write; a change's write restarts the heartbeat's wait,
// so a change an hour adds at most one write (none when it comes before a
// refresh carrying the heartbeat reads the conditions: that write carries
// it; one that comes while that write is on its way is written after it).
const (
	soakAPIWritesMin = 30.0
	soakAPIWritesMax = 30.0
)

// The daemon with its default configuration (checks on a fixture host, the
// kernel log monitor on a kernel log that logs nothing, the Kubernetes
// writers on client-go's fake clientset) for SOAK_HOURS
// simulated hours on testing/synctest's fake clock, after an hour to
// settle: a healthy node, and one whose condition changes once an hour (set
// into the store as a check sets it). Per hour: the API writes stay at the
// spec's 30 report refreshes, the heartbeats riding on them (at most one more write
// per change), each change is on the Node within a second, the state file
// is written only for a change, and the journal is quiet but for the
// change's line. No condition's
// lastHeartbeatTime on the Node is ever older than the heartbeat period
// (to its jitter and the 10 s grid): looked at just before every write
// (until a write it only grows older) and at the end.
func TestSoakSimulatedDay(t *testing.T) {
	hours := soakHours(t)
	for _, changing := range []bool{false, true} {
		name := "healthy"
		if changing {
			name = "one change an hour"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := testConfig(t)
				// The condition this test changes: no check competes.
				cfg.Checks.ClockNotSynchronized.Enabled = false
				// Its watcher blocks in a read of the kernel's file
				// events, which the fake clock cannot wait out; it
				// wakes only on a change under the watched paths, so a
				// quiet node's hours cost it nothing.
				cfg.Checks.NodeTampered.Enabled = false
				// The kernel log monitor on a quiet kernel log (testConfig
				// turns it off: the real /dev/kmsg is not on the fake clock).
				cfg.Kmsg.Enabled = true
				client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
				// The oldest lastHeartbeatTime of the daemon's conditions
				// on the Node, looked at before each write and at the end.
				var mu sync.Mutex
				var oldest time.Duration
				look := func() {
					o, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", cfg.NodeName)
					if err != nil {
						return
					}
					mu.Lock()
					defer mu.Unlock()
					for _, c := range o.(*corev1.Node).Status.Conditions {
						if _, ours := report.Lookup(string(c.Type)); ours && !c.LastHeartbeatTime.IsZero() {
							oldest = max(oldest, time.Since(c.LastHeartbeatTime.Time))
						}
					}
				}
				client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					look()
					return false, nil, nil
				})
				var logs testenv.SyncBuffer
				log, err := NewLogger(&logs, "text", cfg.Log.Level)
				if err != nil {
					t.Fatal(err)
				}
				d, err := New(cfg, log, Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client),
					KmsgOpen: func(context.Context, string) (kmsg.Device, error) { return newQuietKernelLog(), nil }})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- d.Run(ctx) }()
				time.Sleep(time.Hour) // settle: first pass, adoption, first report
				synctest.Wait()
				// The kernel log monitor read the (empty) log: its
				// conditions are decided.
				if c, ok := d.Store().Get("KernelDeadlock"); !ok || c.Status != report.StatusFalse {
					t.Fatalf("after the settling hour KernelDeadlock is %+v; want False from the kernel log monitor", c)
				}
				client.ClearActions()
				mu.Lock()
				oldest = 0
				mu.Unlock()
				lines0 := strings.Count(logs.String(), "\n")
				saves0 := testutil.ToFloat64(d.metrics.StateWritesFor("ok"))
				for h := range hours {
					if changing {
						c := report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: report.ReasonClockSynchronized}
						if h%2 == 0 {
							c.Status, c.Reason = report.StatusTrue, report.ReasonClockUnsynchronized
						}
						d.Store().Set(c, time.Now())
						// On the Node within the second, as any change:
						// also when it comes as a report refresh carrying
						// the heartbeat is written (the same instant here,
						// the hour being a multiple of the 2 min grid).
						time.Sleep(time.Second)
						synctest.Wait()
						o, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", cfg.NodeName)
						if err != nil {
							t.Fatal(err)
						}
						var on *corev1.NodeCondition
						for i, nc := range o.(*corev1.Node).Status.Conditions {
							if nc.Type == "ClockNotSynchronized" {
								on = &o.(*corev1.Node).Status.Conditions[i]
							}
						}
						if on == nil || string(on.Status) != string(c.Status) {
							t.Errorf("hour %d: ClockNotSynchronized %s in the store, 1 s later on the Node %+v", h, c.Status, on)
						}
						time.Sleep(time.Hour - time.Second)
						continue
					}
					time.Sleep(time.Hour)
				}
				synctest.Wait()
				per := func(n float64) float64 { return n / float64(hours) }
				acts := map[string]int{}
				for _, a := range client.Actions() {
					k := a.GetVerb() + " " + a.GetResource().Resource
					if a.GetSubresource() != "" {
						k += "/" + a.GetSubresource()
					}
					acts[k]++
				}
				status, ann := acts["patch nodes/status"], acts["patch nodes"]
				folded := 0 // status writes that are a report refresh too
				for _, a := range client.Actions() {
					if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && strings.Contains(string(p.GetPatch()), `"annotations"`) {
						folded++
					}
				}
				refreshes := per(float64(ann + folded))
				writes := per(float64(status + ann))
				saves := per(testutil.ToFloat64(d.metrics.StateWritesFor("ok")) - saves0)
				all := strings.Split(strings.TrimSpace(logs.String()), "\n")
				logged := all[min(lines0, len(all)):]
				lines := per(float64(len(logged)))
				look()
				mu.Lock()
				worst := oldest
				mu.Unlock()
				t.Logf("soak: %d simulated hours, %s: %.2f API writes per hour (%.2f condition writes, %.2f of them a report refresh too; %.2f report refreshes in all; all calls %v), the oldest heartbeat on the Node %s, %.2f state file writes per hour, %.2f log lines per hour",
					hours, name, writes, per(float64(status)), per(float64(folded)), refreshes, acts, worst, saves, lines)
				changes := 0.0
				if changing {
					changes = 1
				}
				if writes < soakAPIWritesMin || writes > soakAPIWritesMax+changes || refreshes != 30 || len(client.Actions()) != status+ann {
					t.Errorf("%.2f API writes per hour, want %.1f to %.1f with 30 report refreshes and nothing else: %v", writes, soakAPIWritesMin, soakAPIWritesMax+changes, acts)
				}
				// Every condition's heartbeat on the Node, at every
				// instant, within the heartbeat period, jittered by up to
				// 10 %, then on the 10 s grid (and a second: the time on
				// the Node is to the second).
				period := cfg.Kubernetes.HeartbeatPeriod.Duration
				if limit := period + period/10 + 10*time.Second + time.Second; worst > limit || worst == 0 {
					t.Errorf("the oldest heartbeat on the Node: %s; want within %s", worst, limit)
				}
				// The state file is written for a change, the journal
				// gets one line per change, and nothing else.
				if saves > changes || lines > changes {
					t.Errorf("per hour: %.2f state file writes, %.2f log lines; want at most %v of each:\n%s", saves, lines, changes, strings.Join(logged, "\n"))
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
