//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
)

// BenchmarkNativeJournalReadLarge is KubeletHeartbeatFailed's steady-state
// read (kubelet's last 10 entries, after the cursor before them) on a large
// journal a real journald (systemd 252) wrote: one persistent
// system.journal of 500,000 entries of another unit and 20,000 of kubelet's,
// interleaved (journald's own limits lifted so it is one file). It reports
// the reads (preads) of journal files per read and the allocations; with
// -v it logs the file's size. The read's cost must not grow with the file:
// the hash bucket, kubelet's entry-array chain by its last items, the last
// array, the new entries.
func BenchmarkNativeJournalReadLarge(b *testing.B) {
	s, journalctl := journalSystemd(b, "jbench")
	ctx := context.Background()
	conf := "[Journal]\nStorage=persistent\nSystemMaxFileSize=1G\nSystemMaxUse=4G\nSystemKeepFree=0\nRateLimitIntervalSec=0\n"
	if err := os.WriteFile(s.Root("/etc/systemd/journald.conf"), []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(s.Root("/var/log/journal"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := s.StartUnit(ctx, "systemd-journald.service"); err != nil {
		b.Fatalf("starting journald: %v", err)
	}
	// journald writes to /var once told to flush (systemd-journal-flush.service).
	if err := s.KillMain(ctx, "systemd-journald.service", int32(syscall.SIGUSR1)); err != nil {
		b.Fatal(err)
	}
	eventually(b, 30*time.Second, "the flush", func() (bool, string) {
		m, _ := filepath.Glob(s.Root("/var/log/journal/*/system.journal"))
		return len(m) == 1, fmt.Sprint(m)
	})
	const other = "other.service"
	scripts := map[string]string{
		other:             "seq 1 500000 | sed 's/^/GET \\/api\\/v1\\/namespaces\\/default\\/pods 200 OK request /'\necho other-done\nexec sleep infinity\n",
		"kubelet.service": "b=0\nwhile [ $b -lt 50 ]; do seq $((b*400+1)) $((b*400+400)) | sed 's/^/I1205 kubelet.go:2441] SyncLoop (PLEG): event for pod line /'; b=$((b+1)); sleep 0.2; done\necho kubelet-done\nexec sleep infinity\n",
	}
	for u, sh := range scripts {
		name := strings.TrimSuffix(u, ".service") + ".sh"
		if err := os.WriteFile(filepath.Join(s.Units, name), []byte(sh), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := s.AddUnit(ctx, u, "[Unit]\nDefaultDependencies=no\n\n[Service]\nLogRateLimitIntervalSec=0\nExecStart=/bin/sh /etc/systemd/system/"+name+"\n"); err != nil {
			b.Fatal(err)
		}
	}
	for _, u := range []string{other, "kubelet.service"} {
		if err := s.StartUnit(ctx, u); err != nil {
			b.Fatal(err)
		}
		defer s.StopUnit(ctx, u)
	}
	root := s.Root("/")
	last := func(unit string) string {
		out, _ := exec.Command(journalctl, "-D", s.Root("/var/log/journal"), "--no-pager", "-o", "cat", "-n", "1", "_SYSTEMD_UNIT="+unit).Output()
		return strings.TrimSpace(string(out))
	}
	start := time.Now()
	eventually(b, 5*time.Minute, "both units' last lines in /var/log/journal", func() (bool, string) {
		k, o := last("kubelet.service"), last(other)
		m, _ := filepath.Glob(s.Root("/var/log/journal/*/*"))
		return k == "kubelet-done" && o == "other-done", k + " | " + o + fmt.Sprint(m)
	})
	files, _ := filepath.Glob(s.Root("/var/log/journal/*/*.journal*"))
	var sizes []string
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			sizes = append(sizes, fmt.Sprintf("%s %.1f MiB", filepath.Base(f), float64(st.Size())/(1<<20)))
		}
	}
	all, err := checks.ReadJournalForTest(ctx, "", root, "kubelet.service", "", time.Unix(0, 0), 0)
	if err != nil || len(all) != 20001 {
		viaJctl, jerr := checks.ReadJournalForTest(ctx, journalctl, root, "kubelet.service", "", time.Unix(0, 0), 0)
		var first []string
		for _, e := range viaJctl[:min(3, len(viaJctl))] {
			first = append(first, fmt.Sprintf("%q", e.Messages))
		}
		b.Fatalf("kubelet's entries read natively: %d, %v; by journalctl %d (%v), the first %v; files %v", len(all), err, len(viaJctl), jerr, first, sizes)
	}
	b.Logf("written in %s: %v; kubelet's entries %d", time.Since(start).Round(time.Second), sizes, len(all))
	after := all[len(all)-11].Cursor

	for _, c := range []struct{ name, jctl string }{{"native", ""}, {"journalctl", journalctl}} {
		b.Run(c.name, func(b *testing.B) {
			var n atomic.Int64
			undo := checks.CountJournalReadsForTest(&n)
			defer undo()
			b.ReportAllocs()
			for b.Loop() {
				es, err := checks.ReadJournalForTest(ctx, c.jctl, root, "kubelet.service", after, time.Time{}, 0)
				if err != nil || len(es) != 10 {
					b.Fatal(len(es), err)
				}
			}
			b.ReportMetric(float64(n.Load())/float64(b.N), "preads/op")
		})
	}
}
