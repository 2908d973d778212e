package daemon

import (
	"context"
	"net"
	"os"
	"slices"
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

// Soak bounds, per node and hour: API writes (30 report refreshes at the
// 2-minute report_interval, and condition heartbeats every 5 to 5.5 minutes:
// 11 to 12; a change's write restarts the heartbeat's wait, so a change an
// hour adds at most one write).
const (
	soakAPIWritesMin = 40.5
	soakAPIWritesMax = 42.5
)

// The daemon with its default configuration (checks on a fixture host, the
// kernel log monitor on a kernel log that logs nothing, the Kubernetes
// writers on client-go's fake clientset) for SOAK_HOURS
// simulated hours on testing/synctest's fake clock, after an hour to
// settle: a healthy node, and one whose condition changes once an hour (set
// into the store as a check sets it). Per hour: the API writes stay at the
// spec's 30 report refreshes plus 11 to 12 heartbeats (one more write per
// change), the state file is written only for a change, and the journal is
// quiet but for the change's line. Each condition write is a heartbeat
// period (to its jitter and the 10 s grid) after the one before, or a
// change's: an extra write an hour restarts the heartbeat's wait and adds
// less than one write to the hour's count, which the bounds alone would
// let through.
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
				// When (on the fake clock) each write of the conditions was made.
				var mu sync.Mutex
				var statusAt []time.Time
				client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() == "status" {
						mu.Lock()
						statusAt = append(statusAt, time.Now())
						mu.Unlock()
					}
					return false, nil, nil
				})
				var logs testenv.SyncBuffer
				log, err := NewLogger(&logs, "text", cfg.Log.Level)
				if err != nil {
					t.Fatal(err)
				}
				d, err := New(cfg, log, Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client),
					KmsgOpen: func(string) (kmsg.Device, error) { return newQuietKernelLog(), nil }})
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
				writes0 := len(statusAt)
				mu.Unlock()
				var changedAt []time.Time
				lines0 := strings.Count(logs.String(), "\n")
				saves0 := testutil.ToFloat64(d.metrics.StateWritesFor("ok"))
				for h := range hours {
					if changing {
						c := report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: report.ReasonClockSynchronized}
						if h%2 == 0 {
							c.Status, c.Reason = report.StatusTrue, report.ReasonClockUnsynchronized
						}
						d.Store().Set(c, time.Now())
						changedAt = append(changedAt, time.Now())
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
				writes := per(float64(status + ann))
				saves := per(testutil.ToFloat64(d.metrics.StateWritesFor("ok")) - saves0)
				all := strings.Split(strings.TrimSpace(logs.String()), "\n")
				logged := all[min(lines0, len(all)):]
				lines := per(float64(len(logged)))
				t.Logf("soak: %d simulated hours, %s: %.2f API writes per hour (%.2f condition writes, %.2f report refreshes; all calls %v), %.2f state file writes per hour, %.2f log lines per hour",
					hours, name, writes, per(float64(status)), per(float64(ann)), acts, saves, lines)
				changes := 0.0
				if changing {
					changes = 1
				}
				if writes < soakAPIWritesMin || writes > soakAPIWritesMax+changes || per(float64(ann)) != 30 || len(client.Actions()) != status+ann {
					t.Errorf("%.2f API writes per hour, want %.1f to %.1f with 30 report refreshes and nothing else: %v", writes, soakAPIWritesMin, soakAPIWritesMax+changes, acts)
				}
				// Each condition write is a heartbeat, a heartbeat period
				// after the write before (jittered by up to 10 %, then on
				// the 10 s grid), or a change's, within a second of it.
				period := cfg.Kubernetes.HeartbeatPeriod.Duration
				mu.Lock()
				at := slices.Clone(statusAt)
				mu.Unlock()
				for i := max(writes0, 1); i < len(at); i++ {
					gap := at[i].Sub(at[i-1])
					change := slices.ContainsFunc(changedAt, func(c time.Time) bool { return !at[i].Before(c) && at[i].Sub(c) <= time.Second })
					if (gap < period && !change) || gap > period+period/10+10*time.Second {
						t.Errorf("condition write %d at %s, %s after the one before (a change's: %v); want a heartbeat %s to %s after it, or a change's",
							i-writes0+1, at[i].Sub(at[writes0]), gap, change, period, period+period/10+10*time.Second)
					}
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
