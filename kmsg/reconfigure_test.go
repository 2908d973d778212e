package kmsg

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// eventMessages records the messages of the events emitted.
type eventMessages struct {
	mu   sync.Mutex
	msgs []string
}

func (e *eventMessages) ConditionChanged(*report.Condition, report.Condition) {}
func (e *eventMessages) ConditionRestored(report.Condition)                   {}
func (e *eventMessages) EventEmitted(ev report.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.msgs = append(e.msgs, ev.Message)
}

func ruleSet(t *testing.T, rules ...Rule) *RuleSet {
	t.Helper()
	rs, err := Compile(rules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// The rules swapped while the reader reads: the records before the swap
// are matched by the old rules, every record from the swap on by the new
// ones; every record is read once (none lost, none read again: the cursor
// stays), and the match counters follow the rules.
func TestReconfigureSwapsRulesWithoutLosingRecords(t *testing.T) {
	const n, swapAt = 200, 120
	alpha := Rule{Name: "Alpha", Kind: Temp, Reason: "IOError", Pattern: `^alpha \d+`}
	beta := Rule{Name: "Beta", Kind: Temp, Reason: "IOError", Pattern: `^beta \d+`}
	gamma := Rule{Name: "Gamma", Kind: Temp, Reason: "IOError", Pattern: `^gamma \d+`}
	gamma2 := gamma
	gamma2.Pattern = `^gamma 1\d*$`
	store := report.NewStore("b")
	ev := &eventMessages{}
	store.Observe(ev)
	reg := prometheus.NewRegistry()
	o := Options{Rules: ruleSet(t, alpha, gamma), Store: store, IOErrorThreshold: 5, IOErrorWindow: time.Minute, Registerer: reg}
	mon := NewMonitor(o)
	mon.Start(time.Now(), time.Now())
	recs := make([][]byte, n)
	for i := range recs {
		word := []string{"alpha", "beta", "gamma"}[i%3]
		recs[i] = fmt.Appendf(nil, "6,%d,%d,-;%s %d\n", i+1, (i+1)*1000, word, i)
	}
	var ch RuleChanges
	dev := &fakeDevice{recs: recs, onRead: func(i int) {
		if i == swapAt { // before record swapAt is returned
			o.Rules = ruleSet(t, beta, gamma2)
			ch = mon.Reconfigure(o)
		}
	}}
	rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
		ReadTimeout: 20 * time.Millisecond, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for mon.Metrics().Records() < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // until every record is handled
	}
	cancel()
	<-done

	if got := mon.Metrics().Records(); got != n {
		t.Fatalf("%v records handled, want %d", got, n)
	}
	if seq, _, _, _ := mon.LastRecord(); seq != n {
		t.Errorf("last record %d, want %d", seq, n)
	}
	var want []string
	for i := range n {
		switch {
		case i < swapAt && i%3 == 0, i < swapAt && i%3 == 2: // alpha, gamma
			want = append(want, string(recs[i][strings.IndexByte(string(recs[i]), ';')+1:len(recs[i])-1]))
		case i >= swapAt && i%3 == 1: // beta
			want = append(want, fmt.Sprintf("beta %d", i))
		case i >= swapAt && i%3 == 2 && strings.HasPrefix(fmt.Sprint(i), "1"): // gamma 1..
			want = append(want, fmt.Sprintf("gamma %d", i))
		}
	}
	if !slices.Equal(ev.msgs, want) {
		t.Errorf("matched:\n%v\nwant:\n%v", ev.msgs, want)
	}
	if !slices.Equal(ch.Added, []string{"Beta"}) || !slices.Equal(ch.Removed, []string{"Alpha"}) || !slices.Equal(ch.Changed, []string{"Gamma"}) {
		t.Errorf("changes %+v", ch)
	}
	// Alpha's series is gone, Beta's counts the new matches, Gamma's kept
	// its count across the swap.
	var gammas, betas int
	for _, m := range want {
		if strings.HasPrefix(m, "gamma") {
			gammas++
		}
		if strings.HasPrefix(m, "beta") {
			betas++
		}
	}
	exp := fmt.Sprintf(`
# HELP autopilot_health_kmsg_matches_total Kernel log records matched, by rule.
# TYPE autopilot_health_kmsg_matches_total counter
autopilot_health_kmsg_matches_total{rule="Beta"} %d
autopilot_health_kmsg_matches_total{rule="Gamma"} %d
`, betas, gammas)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "autopilot_health_kmsg_matches_total"); err != nil {
		t.Error(err)
	}
}

// A lower I/O error threshold applies at the next tick to the errors the
// window already holds (all of them counted); KernelOnly and the ignored
// devices follow too.
func TestReconfigureThresholdAndFilters(t *testing.T) {
	store := report.NewStore("b")
	o := opts(t, store)
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	sec := uint64(time.Second / time.Microsecond)
	for i, dev := range []string{"sda", "sdb", "sdc"} {
		mon.Handle(rec(uint64(10+i)*sec, fmt.Sprintf("I/O error, dev %s, sector 2048", dev)), t0)
	}
	status := func() report.Condition { c, _ := store.Get("DisksFailure"); return c }
	if c := status(); c.Status != report.StatusFalse {
		t.Fatalf("3 errors, threshold 5: %+v", c)
	}
	o.IOErrorThreshold, o.IOErrorWindow = 2, 5*time.Minute
	o.IgnoreDevices = []string{"sdz"}
	o.KernelOnly = true
	mon.Reconfigure(o)
	mon.Tick(20*sec, t0)
	c := status()
	if c.Status != report.StatusTrue || c.Message != "the kernel logged 3 disk I/O errors in the last 5m0s (threshold 2) on sda, sdb, sdc" {
		t.Errorf("threshold 2 after the reload: %+v", c)
	}
	user := rec(30*sec, "I/O error, dev sdd, sector 1")
	user.Facility = 1
	mon.Handle(user, t0)
	mon.Handle(rec(31*sec, "I/O error, dev sdz, sector 1"), t0)
	if c := status(); !strings.HasSuffix(c.Message, "on sda, sdb, sdc") {
		t.Errorf("a user-space line or an ignored device counted: %+v", c)
	}
	mon.Handle(rec(32*sec, "I/O error, dev loop0, sector 1"), t0) // loop is no longer ignored
	if c := status(); !strings.HasSuffix(c.Message, "logged 4 disk I/O errors in the last 5m0s (threshold 2) on loop0, sda, sdb, sdc") {
		t.Errorf("loop0 after the reload: %+v", c)
	}
}
