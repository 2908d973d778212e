package checks

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/syself/autopilot-health/internal/testenv"
)

// BenchmarkProbeCost is what one probe of each 10 s check costs the
// daemon's process: kubelet's /healthz over the kept HTTP connection and
// the CRI call over the kept HTTP/2 connection, against a server in a
// process of its own (so the figure is the client's alone), the probes
// paced as on an idle node (PROBECOST_EVERY, 100ms: each probe a wake-up
// from an idle process, as at a point of the 10 s grid, not a hot loop).
// On one processor, as the daemon runs; "none" is the pacing alone (a
// timer's wake-up), the floor the probes stand on. It reports the
// process's CPU per probe (every thread's, from schedstat) and its
// threads' wake-ups per probe (voluntary switches).
//
//	go test ./checks -run '^$' -bench ProbeCost -benchtime 200x
//	PROBECOST_DIR=/dev/shm go test ./checks -run '^$' -bench ProbeCost/cri -benchtime 200x
func BenchmarkProbeCost(b *testing.B) {
	every := 100 * time.Millisecond
	if v := os.Getenv("PROBECOST_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		every = d
	}
	// The pacing alone (a timer's wake-up and nothing else): the floor
	// the probes' figures stand on.
	b.Run("none", func(b *testing.B) {
		probeCostLoop(b, every, func(context.Context) error { return nil })
	})
	b.Run("kubelet", func(b *testing.B) {
		addr := probeCostServer(b, "kubelet")
		c := &kubeletCheck{url: "http://" + addr + "/healthz", get: newHealthzGet("http://"+addr+"/healthz", 10*time.Second)}
		defer c.Close()
		probeCostLoop(b, every, func(ctx context.Context) error { return c.probe(ctx) })
	})
	b.Run("cri", func(b *testing.B) {
		sock := probeCostServer(b, "cri")
		c := newCRIClient(sock)
		defer c.close()
		probeCostLoop(b, every, c.status)
	})
}

func probeCostLoop(b *testing.B, every time.Duration, probe func(context.Context) error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	// One probe first: the connection is kept from then on, as in the
	// daemon after its first pass.
	ctx := context.Background()
	if err := probe(ctx); err != nil {
		b.Fatal(err)
	}
	cpu0, wakes0 := testenv.Threads(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(every)
		pctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		err := probe(pctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu1, wakes1 := testenv.Threads(b)
	b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(wakes1-wakes0)/float64(b.N), "wakes/op")
}

// probeCostServer starts this test binary again as the server of kind
// (TestProbeCostServer) and returns its address: a TCP address for kubelet,
// a socket path for the CRI.
func probeCostServer(b *testing.B, kind string) string {
	b.Helper()
	addr := "127.0.0.1:0"
	if kind == "cri" {
		// PROBECOST_DIR: the socket's directory. The test's temporary one
		// is on disk here, and the probe's stat of a socket there (the kept
		// connection's check) is an os.Stat, whose syscall wakes the
		// runtime's monitor thread; on a node the runtime's socket is under
		// /run, a tmpfs, and that stat raw (rawsys.InMemory):
		// PROBECOST_DIR=/dev/shm is that case.
		dir := b.TempDir()
		if d := os.Getenv("PROBECOST_DIR"); d != "" {
			var err error
			if dir, err = os.MkdirTemp(d, "probecost"); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(dir) })
		}
		addr = filepath.Join(dir, "cri.sock")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestProbeCostServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PROBECOST_SERVE="+kind, "PROBECOST_ADDR="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "LISTENING "); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return a
		}
	}
	b.Fatalf("the %s server did not start", kind)
	return ""
}

// TestProbeCostServer is BenchmarkProbeCost's server, run in a process of
// its own (PROBECOST_SERVE); skipped otherwise.
func TestProbeCostServer(t *testing.T) {
	kind := os.Getenv("PROBECOST_SERVE")
	if kind == "" {
		t.Skip("run by BenchmarkProbeCost as its server")
	}
	network := "tcp"
	if kind == "cri" {
		network = "unix"
	}
	ln, err := net.Listen(network, os.Getenv("PROBECOST_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("LISTENING " + ln.Addr().String() + "\n")
	switch kind {
	case "kubelet":
		http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	case "cri":
		s := grpc.NewServer()
		runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
			return conditions(&runtimeapi.RuntimeCondition{Type: criRuntimeReady, Status: true},
				&runtimeapi.RuntimeCondition{Type: "NetworkReady", Status: true}), nil
		}})
		s.Serve(ln)
	}
}
