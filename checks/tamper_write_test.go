package checks

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// hungTamperDisk is the keeper's write (tamper.Keeper.SetWrite) on a disk
// whose writes block in the kernel (D state) until the test releases them;
// then they reach the real file.
type hungTamperDisk struct {
	mu      sync.Mutex
	calls   int
	release chan struct{}
	once    sync.Once
}

func (h *hungTamperDisk) write(path string, data []byte, perm os.FileMode) error {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	<-h.release
	return report.WriteFileAtomic(path, data, perm)
}

func (h *hungTamperDisk) unblock() { h.once.Do(func() { close(h.release) }) }

// A write of tamper.json that blocks in the kernel (a failing or hung disk
// under state_dir) holds neither tamper check: NodeTampered sets its
// finding within tamper.SaveWait (the finding is in memory and on the
// Node; the log says it is not saved yet), SealedOSTampered, which reads
// the same keeper, answers too, and once the write returns both findings
// are in tamper.json. Before, NodeTampered wrote under the keeper's lock
// and hung in the write until the runner abandoned it (Unknown,
// CheckTimeout, not naming the disk), and SealedOSTampered hung on the
// lock behind it.
func TestTamperChecksDoNotWaitForAHungTamperWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rec = "/var/lib/syself/sealed-os/root-hashes"
		h := newTamperHost(t)
		h.logs = &testenv.SyncBuffer{}
		h.write(rec, "root "+hashA+"\n")
		nc := h.start("boot-1", report.NewStore("boot-1"))
		dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
		sc := sealedEnv(t, h, "boot-1", dm).(*sealedOSCheck)
		sc.keeper = nc.keeper // the daemon's checks share one keeper
		h.probe(nc, report.StatusFalse, report.ReasonNodeIntact, "")
		h.probe(sc, report.StatusFalse, report.ReasonSealedOSIntact, "")

		disk := &hungTamperDisk{release: make(chan struct{})}
		defer func() { disk.unblock(); synctest.Wait() }() // a failed test ends with no write blocked
		nc.keeper.SetWrite(disk.write)
		h.write("/var/lib/kubelet/config.yaml", "evil\n")
		dm.targets = []tamper.VerityTarget{verity("root", hashB)}

		type answer struct {
			res Result
			err error
		}
		probe := func(c Check) chan answer {
			h.now = h.now.Add(time.Minute)
			out := make(chan answer, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the checks' timeout
				defer cancel()
				res, err := c.Probe(ctx)
				out <- answer{res, err}
			}()
			return out
		}
		got := func(out chan answer, name string) answer {
			t.Helper()
			select {
			case a := <-out:
				return a
			default:
				t.Fatalf("%s: no result %s into a hung write of tamper.json", name, tamper.SaveWait+time.Second)
				return answer{}
			}
		}
		nodeOut := probe(nc)
		time.Sleep(tamper.SaveWait + time.Second)
		synctest.Wait()
		a := got(nodeOut, "NodeTampered")
		if a.err != nil || a.res.Status != report.StatusTrue || a.res.Reason != report.ReasonProtectedFileChanged || !strings.Contains(a.res.Message, "/var/lib/kubelet/config.yaml modified") {
			t.Errorf("NodeTampered: %+v, %v; want True naming the change", a.res, a.err)
		}
		sealedOut := probe(sc)
		synctest.Wait()
		a = got(sealedOut, "SealedOSTampered")
		if a.err != nil || a.res.Status != report.StatusTrue || a.res.Reason != report.ReasonRootHashMismatch {
			t.Errorf("SealedOSTampered: %+v, %v; want True, RootHashMismatch", a.res, a.err)
		}
		if !strings.Contains(h.logs.String(), "not saved yet: the write of "+nc.keeper.Path()+" has not returned since") {
			t.Errorf("the log does not say the finding is not saved:\n%s", h.logs.String())
		}

		disk.unblock()
		synctest.Wait()
		s, err := tamper.LoadState(h.stateDir)
		if err != nil || s == nil || len(s.FindingsFor(tamper.CondNode)) != 1 || len(s.FindingsFor(tamper.CondSealed)) != 1 {
			t.Errorf("saved: %+v, %v; want both findings", s, err)
		}
		disk.mu.Lock()
		defer disk.mu.Unlock()
		if disk.calls != 2 {
			t.Errorf("%d writes; want the hung one and one with what changed meanwhile", disk.calls)
		}
	})
}
