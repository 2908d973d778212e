package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// A storm of SIGHUPs (`kill -HUP` in a loop, a configuration tool's
// handler fired once per file) while the file toggles a check on and off,
// with scrapes and `status` asked all the while: the daemon coalesces the
// signals as the kernel does (one pending), never refuses a whole file,
// and ends on the file last written: the check it disables has no series
// left in the metrics (its runs, progress, problem_gauge and
// condition_status), no condition in the store or in status, and the
// daemon is healthy; every scrape and status answered meanwhile.
func TestReloadStormEndsOnTheLastFile(t *testing.T) {
	sock := notifySocket(t)
	hup := make(chan os.Signal, 1) // as cmd's signal.Notify channel
	var opts Options
	opts.Reload = hup
	control := ""
	if os.Getuid() == 0 {
		// `systemctl reload` too, beside the signals (the control socket
		// answers root only: TestControlRefusesANonRootPeer).
		control = filepath.Join(t.TempDir(), "control.sock")
		opts.ControlSocket = control
	}
	f := newFileDaemon(t, "", opts)
	d := f.Daemon
	f.start(t)
	next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	metricsURL := "http://" + f.listen + "/metrics"

	// systemd reads every notification: RELOADING=1 and READY=1 in pairs.
	var notes []string
	var notesMu sync.Mutex
	notesDone := make(chan struct{})
	go func() {
		defer close(notesDone)
		buf := make([]byte, 4096)
		for {
			n, err := sock.Read(buf)
			if err != nil {
				return
			}
			notesMu.Lock()
			notes = append(notes, string(buf[:n]))
			notesMu.Unlock()
		}
	}()
	t.Cleanup(func() { sock.Close(); <-notesDone })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var scrapes, statuses int
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if code, page := get(t, metricsURL); code != 200 || !strings.Contains(page, "autopilot_health_config_reloads_total") {
				t.Errorf("scrape during the storm: %d\n%s", code, page)
				return
			}
			scrapes++
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if st := d.Status(time.Now()); st.Node != "test-node" || len(st.Conditions) == 0 {
				t.Errorf("status during the storm: %+v", st)
				return
			}
			statuses++
		}
	})
	// As the kernel delivers them to signal.Notify: one pending at most.
	signal := func() {
		select {
		case hup <- syscall.SIGHUP:
		default:
		}
	}
	// Each file whole (written aside and renamed, as editors and
	// configuration tools do): none is refused.
	write := func(extra string) {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, []byte(reloadTOML(f.base, f.listen, extra)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			t.Fatal(err)
		}
	}
	var asked sync.WaitGroup
	if control != "" {
		for range 4 {
			asked.Go(func() {
				for range 5 {
					if what, err := RequestReload(control); err != nil {
						t.Errorf("systemctl reload during the storm: %q, %v", what, err)
						return
					}
				}
			})
		}
	}
	for i := range 40 {
		write(fmt.Sprintf("[checks.DiskUsageHigh]\nspace_percent = %d\n[checks.NodeInfoStale]\nenabled = %t\n", 50+i, i%2 == 1))
		signal()
		if i%8 == 0 {
			// Now and then the storm lets the reloads catch up with it,
			// the re-enabled check running its first run meanwhile.
			time.Sleep(5 * time.Millisecond)
		}
	}
	asked.Wait()
	const last = "[checks.DiskUsageHigh]\nspace_percent = 33\n[checks.NodeInfoStale]\nenabled = false\n"
	write(last)
	signal()

	// The last file applied, and no reload in flight or pending.
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.reloadMu.Lock()
		pct := d.currentEnv().Config.Checks.DiskUsageHigh.SpacePercent
		pending := len(hup)
		d.reloadMu.Unlock()
		if pct == 33 && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last file never applied: space_percent %v, %d signals pending\n%s", pct, pending, f.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if scrapes == 0 || statuses == 0 {
		t.Errorf("during the storm: %d scrapes, %d statuses answered", scrapes, statuses)
	}
	if strings.Contains(f.logs.String(), "configuration reload refused") {
		t.Errorf("a whole file was refused during the storm:\n%s", f.logs)
	}
	_, page := get(t, metricsURL)
	var left []string
	for line := range strings.SplitSeq(page, "\n") {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, "NodeInfoStale") {
			left = append(left, line)
		}
	}
	if len(left) > 0 {
		t.Errorf("NodeInfoStale, disabled by the last file, still has series:\n%s", strings.Join(left, "\n"))
	}
	if _, ok := d.Store().Get("NodeInfoStale"); ok {
		t.Error("NodeInfoStale, disabled by the last file, is still in the store")
	}
	for _, c := range d.Status(time.Now()).Conditions {
		if c.Type == "NodeInfoStale" {
			t.Errorf("status still shows NodeInfoStale: %+v", c)
		}
	}
	if !strings.Contains(page, `problem_gauge{reason="FilesystemSpaceHigh",type="DiskUsageHigh"}`) || !strings.Contains(page, `loop="check/DiskUsageHigh"`) {
		t.Errorf("the conditions the storm kept lost their series:\n%s", page)
	}
	if c, ok := d.Store().Get("DiskUsageHigh"); !ok || c.Status == report.StatusUnknown {
		t.Errorf("DiskUsageHigh after the storm: %+v", c)
	}
	if err := d.Healthy(); err != nil {
		t.Errorf("after the storm: %v", err)
	}
	// Each reload's RELOADING=1 is answered by its READY=1 before the
	// next one's: systemd leaves a unit `reloading` until it comes.
	balanced := func() (open bool, reloads int) {
		notesMu.Lock()
		defer notesMu.Unlock()
		for _, m := range notes {
			switch {
			case strings.HasPrefix(m, "RELOADING=1"):
				if open {
					t.Errorf("RELOADING=1 while the last one is not answered: %q", m)
				}
				open = true
				reloads++
			case strings.HasPrefix(m, "READY=1"):
				if !open {
					t.Errorf("READY=1 with no reload open: %q", m)
				}
				open = false
			}
		}
		return open, reloads
	}
	// The last READY=1 may still be on its way.
	open, reloads := balanced()
	for deadline := time.Now().Add(10 * time.Second); open && time.Now().Before(deadline); open, reloads = balanced() {
		time.Sleep(5 * time.Millisecond)
	}
	if open || reloads == 0 {
		t.Errorf("after the storm: %d reloads notified, the last one answered: %t", reloads, !open)
	}
	// Any refusal, not one alone: "... 1" was also the start of 10-19,
	// and two refusals passed.
	if regexp.MustCompile(`(?m)^autopilot_health_config_reloads_total\{result="error"\} [1-9]`).MatchString(page) {
		t.Errorf("a reload was refused:\n%s", grepLines(page, "config_reloads"))
	}
}
