package rawsys

import (
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// BenchmarkProbeGET is a probe's GET on a kept connection, paced as the
// daemon's probes are (a pause between GETs long enough for the runtime's
// monitor thread to fall asleep; 10 ms here, 10 s in the daemon), on one
// processor as the daemon runs: through net/http on a plain connection
// and on a Conn of this package; and, as dial, on a new plain connection
// for each GET (what CNIUnhealthy did before it kept one). It reports the process's CPU per GET
// (every thread's, from schedstat; the server is a process of its own) and its threads' wake-ups per GET (voluntary switches).
//
//	go test ./internal/rawsys -run '^$' -bench ProbeGET -benchtime 300x
func BenchmarkProbeGET(b *testing.B) {
	for _, name := range []string{"dial", "plain", "raw"} {
		b.Run(name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			addr := startServer(b)
			tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
			switch name {
			case "raw":
				tr.DialContext = Dial
			case "dial":
				tr.DisableKeepAlives = true
			}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			url := "http://" + addr + "/healthz"
			get := func() {
				resp, err := client.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			get() // the connection is kept from here on
			cpu0, wakes0 := testenv.Threads(b)
			b.ResetTimer()
			for range b.N {
				time.Sleep(10 * time.Millisecond) // the pace between probes
				get()
			}
			b.StopTimer()
			cpu1, wakes1 := testenv.Threads(b)
			b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(wakes1-wakes0)/float64(b.N), "wakes/op")
		})
	}
}

// serverEnv makes the test binary the benchmark's server (TestMain): in a
// process of its own, as kubelet is, so that its system calls do not wake
// this process's monitor thread.
const serverEnv = "RAWSYS_BENCH_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) != "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		os.Stdout.WriteString(ln.Addr().String() + "\n")
		http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// startServer starts the server process and returns its address.
func startServer(b *testing.B) string {
	b.Helper()
	return testenv.HelperProcess(b, serverEnv+"=1")
}

// BenchmarkPseudoRead is the once-a-minute read of
// kernel.hung_task_warnings (a sysctl: pollable, ready), paced as
// BenchmarkProbeGET's GETs (10 ms apart, on one processor): by os.ReadFile
// ("os") and by ReadPseudoFile ("raw"). It reports the process's CPU and
// its threads' wake-ups per read, and, where perf can count the reading
// thread's system calls (root), those per read and the epoll_ctl(2) among
// them (over 1,000 more reads, unpaced).
//
//	go test ./internal/rawsys -run '^$' -bench PseudoRead -benchtime 1000x
func BenchmarkPseudoRead(b *testing.B) {
	const path = "/proc/sys/kernel/hung_task_warnings"
	if _, err := os.Stat(path); err != nil {
		b.Skip(err)
	}
	for _, name := range []string{"os", "raw"} {
		b.Run(name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			read := func() {
				var err error
				if name == "raw" {
					_, err = ReadPseudoFile(path, 64)
				} else {
					_, err = os.ReadFile(path)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			read()
			cpu0, wakes0 := testenv.Threads(b)
			b.ResetTimer()
			for range b.N {
				time.Sleep(10 * time.Millisecond) // the pace between reads
				read()
			}
			b.StopTimer()
			cpu1, wakes1 := testenv.Threads(b)
			b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(wakes1-wakes0)/float64(b.N), "wakes/op")
			const n = 1000
			all, epoll, err := testenv.CountSyscalls(func() {
				for range n {
					read()
				}
			})
			if err == nil {
				b.ReportMetric(float64(all)/n, "syscalls/op")
				b.ReportMetric(float64(epoll)/n, "epoll_ctl/op")
			}
		})
	}
}
