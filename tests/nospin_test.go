//go:build integration

package tests

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/syself/autopilot-health/internal/daemon"
)

// fdsOpen is how many descriptors process pid has open.
func fdsOpen(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// cpuTime is the time process pid's threads have run on a CPU, summed
// from /proc/PID/task/*/schedstat (its first field, in ns).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var sum time.Duration
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
		if err != nil {
			continue // a thread gone since the listing
		}
		ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// logMessages counts the daemon's log lines in logs by their message
// (msg=, as the text handler writes it; the whole line otherwise).
func logMessages(logs string) map[string]int {
	msgRE := regexp.MustCompile(`msg=("(?:[^"\\]|\\.)*"|\S+)`)
	digits := regexp.MustCompile(`[0-9]+`)
	n := map[string]int{}
	for _, l := range strings.Split(logs, "\n") {
		if l == "" {
			continue
		}
		if m := msgRE.FindStringSubmatch(l); m != nil {
			l = m[1]
		} else {
			// Not the daemon's logger (net/http's, Go's log package):
			// its time and figures ("retrying in 20ms") differ by line.
			l = digits.ReplaceAllString(l, "#")
		}
		n[l]++
	}
	return n
}

// The guide's "a failing input backs off and is counted; nothing spins",
// held against the shipped binary out of descriptors: its soft
// RLIMIT_NOFILE lowered (prlimit) to a few above what it holds once up,
// then connections to its status socket, its control socket and its
// metrics port until every accept fails with EMFILE, held for 30 s
// (the connections the daemon cannot accept wait in the backlogs, so it
// stays at its limit while the ones it did accept time out). Over those
// 30 s it runs at most 5% of a CPU (/proc/PID/task/*/schedstat) and says
// no one thing more than 5 times (one line per kind of error, not one per
// failed accept or try); released (the connections closed, the limit
// restored), it recovers: the status socket answers, the control socket
// answers a reload, and a kernel line reaches the Node as its condition.
func TestNothingSpinsOutOfDescriptors(t *testing.T) {
	n := newKernelNode(t)
	n.start()
	n.statusDoc()
	n.caughtUp()
	pid := n.cmd.Process.Pid
	cfg, err := os.ReadFile(n.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	control := regexp.MustCompile(`(?m)^control_socket = "(.*)"$`).FindStringSubmatch(string(cfg))[1]

	held := fdsOpen(t, pid)
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	limit := uint64(held + 12)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: old.Max}, nil); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
				t.Error(err)
			}
		}
	}
	defer restore()
	var conns []net.Conn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
		conns = nil
	}
	defer closeAll()
	dial := func(network, addr string, k int) {
		for range k {
			c, err := net.Dial(network, addr)
			if err != nil {
				t.Fatalf("connecting to %s: %v", addr, err)
			}
			conns = append(conns, c)
		}
	}
	// More than the daemon can accept in 30 s as the ones it did time out
	// (the status socket's after 10 s, the control socket's after 40 s).
	dial("unix", n.status, 100)
	dial("unix", control, 100)
	dial("tcp", n.metrics, 20)
	eventually(t, 30*time.Second, "the daemon at its descriptor limit", func() (bool, string) {
		k := fdsOpen(t, pid)
		return uint64(k) >= limit, fmt.Sprintf("%d open, limit %d (%d at the start)", k, limit, held)
	})

	logsFrom := len(n.logs.String())
	cpu0, t0 := cpuTime(t, pid), time.Now()
	time.Sleep(30 * time.Second) // the window the daemon's CPU and log lines are measured over
	cpu, window := cpuTime(t, pid)-cpu0, time.Since(t0)
	logs := n.logs.String()[logsFrom:]
	t.Logf("out of descriptors (limit %d, %d open at the start) for %v: %v on a CPU (%.1f%%), %d log lines",
		limit, held, window.Round(time.Millisecond), cpu.Round(time.Millisecond), 100*cpu.Seconds()/window.Seconds(), strings.Count(logs, "\n"))
	if cpu > window/20 {
		t.Errorf("the daemon ran %v on a CPU in %v out of descriptors; want at most 5%%", cpu, window)
	}
	msgs := logMessages(logs)
	keys := make([]string, 0, len(msgs))
	for m := range msgs {
		keys = append(keys, m)
	}
	sort.Slice(keys, func(i, j int) bool { return msgs[keys[i]] > msgs[keys[j]] })
	for _, m := range keys {
		t.Logf("%5d× %s", msgs[m], m)
		if msgs[m] > 5 {
			t.Errorf("logged %d times in %v out of descriptors (want one line per kind of error): %s", msgs[m], window, m)
		}
	}

	// Released: it recovers.
	closeAll()
	restore()
	eventually(t, 30*time.Second, "the status socket answers", func() (bool, string) {
		_, _, err := n.askStatus()
		return err == nil, fmt.Sprint(err)
	})
	eventually(t, 60*time.Second, "the control socket answers a reload", func() (bool, string) {
		out, err := daemon.RequestReload(control)
		return err == nil, fmt.Sprintf("%s %v", out, err)
	})
	n.line("EXT4-fs (TOKEN): Remounting filesystem read-only")
	waitNode(t, n.api, n.name, "ReadonlyFilesystem True", func(node *corev1.Node) bool {
		c := cond(node, "ReadonlyFilesystem")
		return c != nil && c.Status == corev1.ConditionTrue
	})
}
