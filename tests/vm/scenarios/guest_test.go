package scenarios

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
)

// A daemon that never writes its state fails every scenario at its first
// wait: the guest's deadline must cover that for a whole boot, and the
// host's timeout must leave the guest time to print the daemon's log after
// it (found by review: with a fixed 3 min timeout, QEMU was killed before
// the log of a broken daemon came out).
func TestDeadlineCoversABrokenDaemon(t *testing.T) {
	perScenario := max(awaitCheck, awaitKmsg)
	boots := map[Machine]int{}
	for _, s := range All {
		boots[s.Machine]++
	}
	for _, n := range append([]int{1, len(All)}, func() (ns []int) {
		for _, n := range boots {
			ns = append(ns, n)
		}
		return ns
	}()...) {
		guest, host := Deadline(n)
		// 10.5 s measured to the first scenario at load 3.5: at least
		// four times that under load.
		if need := 42*time.Second + time.Duration(n)*perScenario; guest < need {
			t.Errorf("Deadline(%d): the guest's deadline %v is shorter than boot and %d failed waits of %v (%v)", n, guest, n, perScenario, need)
		}
		// QEMU starts 8.4 s before the kernel's clock at load 11.6,
		// stopping the daemon takes up to 5 s, and its log must come out.
		if host < guest+30*time.Second {
			t.Errorf("Deadline(%d): the host's timeout %v leaves the guest less than 30 s after its deadline %v", n, host, guest)
		}
	}
}

// The limits the README gives: 60 s + 45 s per scenario, and 60 s more on
// the host.
func TestDeadlineValues(t *testing.T) {
	for n, want := range map[int][2]time.Duration{1: {105 * time.Second, 165 * time.Second}, 2: {150 * time.Second, 210 * time.Second}, 6: {330 * time.Second, 390 * time.Second}} {
		if g, h := Deadline(n); g != want[0] || h != want[1] {
			t.Errorf("Deadline(%d) = %v, %v; want %v, %v", n, g, h, want[0], want[1])
		}
	}
}

func TestParseCmdline(t *testing.T) {
	names, d, err := ParseCmdline("console=ttyS0 panic=-1 quiet vmtest.run=dm_verity,hung_task vmtest.deadline=150\n")
	if err != nil || strings.Join(names, ",") != "dm_verity,hung_task" || d != 150*time.Second {
		t.Errorf("ParseCmdline = %v, %v, %v", names, d, err)
	}
	names, d, err = ParseCmdline("quiet vmtest.run=a,b,c")
	if want, _ := Deadline(3); err != nil || len(names) != 3 || d != want {
		t.Errorf("without vmtest.deadline: %v, %v, %v; want Deadline(3) = %v", names, d, err, want)
	}
	for _, bad := range []string{"vmtest.deadline=soon", "vmtest.deadline=-5", "vmtest.deadline=0", "vmtest.deadline="} {
		if _, _, err := ParseCmdline("vmtest.run=a " + bad); err == nil || !strings.Contains(err.Error(), "not a positive number of seconds") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// At the deadline the scenario still running fails, the ones after it fail
// without starting, and runAll returns (the guest then prints the daemon's
// log); the scenarios before it keep their own results.
func TestRunAllStopsAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		// ran is appended to by each scenario's goroutine; "hangs" is
		// abandoned at the deadline, so nothing orders its append before the
		// read below but the lock (make test-race).
		var ranMu sync.Mutex
		var ran []string
		did := func(name string) { ranMu.Lock(); ran = append(ran, name); ranMu.Unlock() }
		g := &Guest{
			openKmsg: func() (*Kmsg, error) { return nil, errors.New("no /dev/kmsg here") },
			scenarios: []Scenario{
				{Name: "fine", Run: func(*Guest) error { did("fine"); time.Sleep(3 * time.Second); return nil }},
				{Name: "broken", Run: func(*Guest) error {
					did("broken")
					time.Sleep(40 * time.Second)
					return errors.New("waiting 40s for DisksFailure=False DisksHealthy: the state file shows nothing")
				}},
				{Name: "hangs", Run: func(*Guest) error { did("hangs"); <-release; return nil }},
				{Name: "later", Run: func(*Guest) error { did("later"); return nil }},
			},
		}
		var out bytes.Buffer
		start := time.Now()
		passed, failed, abandoned := g.runAll(&out, []string{"fine", "nope", "broken", "hangs", "later"}, start.Add(100*time.Second), 130*time.Second)
		if took := time.Since(start); took != 100*time.Second {
			t.Errorf("runAll returned after %v, want at the deadline (100s)", took)
		}
		if passed != 1 || failed != 4 || !abandoned {
			t.Errorf("passed %d, failed %d, abandoned %v; want 1, 4, true", passed, failed, abandoned)
		}
		ranMu.Lock()
		got := strings.Join(ran, ",")
		ranMu.Unlock()
		if got != "fine,broken,hangs" {
			t.Errorf("ran %s, want fine,broken,hangs", got)
		}
		want := `VMTEST START fine
VMTEST RESULT fine PASS 3000ms
VMTEST RESULT nope FAIL 0ms no such scenario in this guest
VMTEST START broken
VMTEST RESULT broken FAIL 40000ms waiting 40s for DisksFailure=False DisksHealthy: the state file shows nothing
VMTEST START hangs
VMTEST RESULT hangs FAIL 57000ms still running at the guest's deadline (2m10s after boot); the scenarios after it are not run
VMTEST RESULT later FAIL 0ms not run: the guest's deadline (2m10s after boot) had passed
`
		if out.String() != want {
			t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
		}
		close(release)
	})
}

// A deadline already past when the scenarios start: none runs, each fails.
func TestRunAllPastDeadline(t *testing.T) {
	g := &Guest{scenarios: []Scenario{{Name: "a", Run: func(*Guest) error { t.Error("a ran"); return nil }}}}
	var out bytes.Buffer
	passed, failed, abandoned := g.runAll(&out, []string{"a"}, time.Now(), time.Minute)
	if passed != 0 || failed != 1 || abandoned || !strings.Contains(out.String(), "VMTEST RESULT a FAIL 0ms not run: the guest's deadline (1m0s after boot) had passed") {
		t.Errorf("%d, %d, %v: %s", passed, failed, abandoned, out.String())
	}
}

// The guest's configurations are ones the daemon starts on: a key the
// validation refuses (an lvm_timeout longer than a third of the check's
// timeout) would fail every boot at its first wait, far from the cause.
func TestGuestConfigsLoad(t *testing.T) {
	for name, c := range map[string]string{ConfigPath: DaemonConfig, CheckConfigPath: CheckConfig} {
		if _, err := config.Parse(name, []byte(c), config.Default()); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// A scenario's BeforeDaemon runs before the daemon (beforeDaemon, for the
// named scenarios only); its error fails the scenario in its turn, without
// its Run.
func TestBeforeDaemonErrorFailsTheScenario(t *testing.T) {
	var ran []string
	g := &Guest{
		openKmsg: func() (*Kmsg, error) { return nil, errors.New("no /dev/kmsg here") },
		scenarios: []Scenario{
			{Name: "early", BeforeDaemon: func(*Guest) error { ran = append(ran, "early before"); return errors.New("mke2fs: not found") },
				Run: func(*Guest) error { ran = append(ran, "early"); return nil }},
			{Name: "fine", BeforeDaemon: func(*Guest) error { ran = append(ran, "fine before"); return nil },
				Run: func(*Guest) error { ran = append(ran, "fine"); return nil }},
			{Name: "unnamed", BeforeDaemon: func(*Guest) error { ran = append(ran, "unnamed before"); return nil }},
		},
	}
	names := []string{"early", "fine"}
	g.beforeDaemon(names)
	var out bytes.Buffer
	passed, failed, _ := g.runAll(&out, names, time.Now().Add(time.Minute), time.Minute)
	if got := strings.Join(ran, ","); got != "early before,fine before,fine" {
		t.Errorf("ran %s, want early before,fine before,fine", got)
	}
	if passed != 1 || failed != 1 || !regexp.MustCompile(`VMTEST RESULT early FAIL [0-9]+ms before the daemon started: mke2fs: not found`).MatchString(out.String()) {
		t.Errorf("%d passed, %d failed:\n%s", passed, failed, out.String())
	}
}

// A BeforeDaemon that panics fails its scenario in its turn, as its error
// does, and not the guest's setup: before, beforeDaemon called it without
// a recover (Run's panic is recovered in runScenario), so the guest's init
// died before the daemon started, and every scenario of the boot with it.
func TestBeforeDaemonPanicFailsOnlyItsScenario(t *testing.T) {
	var ran []string
	g := &Guest{
		openKmsg: func() (*Kmsg, error) { return nil, errors.New("no /dev/kmsg here") },
		scenarios: []Scenario{
			{Name: "early", BeforeDaemon: func(*Guest) error { var m map[string]int; m["x"]++; return nil },
				Run: func(*Guest) error { ran = append(ran, "early"); return nil }},
			{Name: "fine", BeforeDaemon: func(*Guest) error { ran = append(ran, "fine before"); return nil },
				Run: func(*Guest) error { ran = append(ran, "fine"); return nil }},
		},
	}
	names := []string{"early", "fine"}
	g.beforeDaemon(names)
	var out bytes.Buffer
	passed, failed, _ := g.runAll(&out, names, time.Now().Add(time.Minute), time.Minute)
	if got := strings.Join(ran, ","); got != "fine before,fine" {
		t.Errorf("ran %s, want fine before,fine", got)
	}
	if passed != 1 || failed != 1 || !regexp.MustCompile(`VMTEST RESULT early FAIL [0-9]+ms before the daemon started: panic: assignment to entry in nil map`).MatchString(out.String()) {
		t.Errorf("%d passed, %d failed:\n%s", passed, failed, out.String())
	}
}
