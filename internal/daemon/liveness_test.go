package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report/kube/kubefake"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/kmsg"
)

func TestLiveness(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLiveness(func() time.Time { return now })
	l.Expect("a", 10*time.Second)
	l.Beat("b", 5*time.Second)
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	// Every loop gets its period plus the same slack.
	now = now.Add(5*time.Second + loopSlack + time.Second)
	if err := l.Check(); err == nil || err.Error() != "stuck loops: b (no progress for 36s, allowed 35s)" {
		t.Errorf("err = %v", err)
	}
	l.Beat("b", 5*time.Second)
	now = now.Add(5 * time.Second)
	if err := l.Check(); err == nil || err.Error() != "stuck loops: a (no progress for 41s, allowed 40s)" {
		t.Errorf("err = %v", err)
	}
	l.Forget("a")
	if err := l.Check(); err != nil {
		t.Error(err)
	}
}

// How long each kind of loop may stay silent before /healthz calls it
// stuck, as README's "Under systemd" promises: its own period plus 30 s.
// Each loop is the real one, observed after it made progress.
func TestAllowedSilencePerLoop(t *testing.T) {
	const slack = 30 * time.Second
	if loopSlack != slack {
		t.Fatalf("loopSlack = %s; README says 30 s", loopSlack)
	}
	cfg := testConfig(t)
	cfg.Runner.FirstRunSpread = config.Duration{Duration: 300 * time.Millisecond}
	cfg.GPU = "auto" // re-detection runs
	cfg.Detect.Interval = config.Duration{Duration: 20 * time.Millisecond}
	cfg.Kmsg.Enabled = true
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Kube: kubefake.New(client), KmsgOpen: func(context.Context, string) (kmsg.Device, error) { return &quietKmsg{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	checkPeriod := func(c string) time.Duration {
		com, _ := cfg.Checks.Common(c)
		return com.Interval.Duration + com.Timeout.Duration
	}
	spread := cfg.Runner.FirstRunSpread.Duration
	// Before its first run a check may also wait for its place in the spread.
	for _, c := range d.runner.Checks() {
		if got, _ := d.live.Allowed("check/" + c); got != spread+checkPeriod(c)+slack {
			t.Errorf("check/%s before its first run: allowed %s, want first_run_spread + interval + timeout + 30 s = %s", c, got, spread+checkPeriod(c)+slack)
		}
	}

	hb := cfg.Kubernetes.HeartbeatPeriod.Duration
	want := map[string]time.Duration{
		"kmsg":             10*time.Second + slack,
		"state":            time.Minute + slack,
		"detect":           cfg.Detect.Interval.Duration + slack,
		"kube/status":      hb + hb/10 + 10*time.Second + slack, // jittered, then onto the 10 s grid
		"kube/events":      time.Minute + slack,                 // idle: no write due
		"kube/annotations": cfg.Kubernetes.ReportInterval.Duration + slack,
	}
	for _, c := range d.runner.Checks() {
		want["check/"+c] = checkPeriod(c) + slack
	}
	b := trackBeats(d.live)
	runDaemon(t, d)
	awaitAllowed(t, d.live, b, want)

	// A daemon waiting for its kubeconfig polls for it.
	cfg = testConfig(t)
	cfg.Kubernetes.Kubeconfig = "/etc/kubernetes/kubelet.conf" // absent
	ln, _ = net.Listen("tcp", "127.0.0.1:0")
	d2, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, KubeconfigPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b2 := trackBeats(d2.live)
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- d2.Run(ctx2) }()
	defer func() { cancel2(); <-done2 }()
	awaitAllowed(t, d2.live, b2, map[string]time.Duration{"kube/kubeconfig": 50*time.Millisecond + slack})
}

// quietKmsg is a kernel log with no records: every read waits for one
// until its deadline (20 ms at most).
type quietKmsg struct {
	mu       sync.Mutex
	deadline time.Time
}

func (k *quietKmsg) Read([]byte) (int, error) {
	k.mu.Lock()
	wait := min(time.Until(k.deadline), 20*time.Millisecond)
	k.mu.Unlock()
	time.Sleep(wait)
	return 0, os.ErrDeadlineExceeded
}

func (k *quietKmsg) SetReadDeadline(t time.Time) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.deadline = t
	return nil
}

func (*quietKmsg) Seek(int64, int) (int64, error) { return 0, nil }
func (*quietKmsg) Close() error                   { return nil }

// beats records which loops made progress; install it before Run.
type beats struct {
	mu   sync.Mutex
	seen map[string]bool
}

func trackBeats(l *Liveness) *beats {
	b := &beats{seen: map[string]bool{}}
	prev := l.OnBeat
	l.OnBeat = func(loop string, at time.Time) {
		b.mu.Lock()
		b.seen[loop] = true
		b.mu.Unlock()
		if prev != nil {
			prev(loop, at)
		}
	}
	return b
}

func (b *beats) beaten(loop string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[loop]
}

// awaitAllowed waits until every loop in want has made progress and is
// allowed exactly its silence, for at most 10 s.
func awaitAllowed(t *testing.T, l *Liveness, b *beats, want map[string]time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var wrong []string
		for loop, w := range want {
			got, ok := l.Allowed(loop)
			switch {
			case !b.beaten(loop):
				wrong = append(wrong, fmt.Sprintf("%s: no progress yet (allowed %s, tracked %t)", loop, got, ok))
			case got != w:
				wrong = append(wrong, fmt.Sprintf("%s: allowed %s, want %s", loop, got, w))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			slices.Sort(wrong)
			t.Fatalf("allowed silences:\n%s", strings.Join(wrong, "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
