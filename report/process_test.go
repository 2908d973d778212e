package report

import (
	"math"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

func gatherOne(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	r := prometheus.NewPedanticRegistry()
	r.MustRegister(c)
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func value(mf *dto.MetricFamily) float64 {
	m := mf.GetMetric()[0]
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// The daemon's process collector serves what client_golang's does: the same
// names, help and types, and the same values (those that move between two
// reads within a margin).
func TestProcessCollectorMatchesClientGolang(t *testing.T) {
	ours := gatherOne(t, newProcessCollector())
	theirs := gatherOne(t, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if len(ours) != len(theirs) || len(ours) != 9 {
		t.Fatalf("%d metrics, client_golang %d", len(ours), len(theirs))
	}
	// Under qemu-user (make test-arm64) /proc/self/stat is the emulator's
	// fake, with zeros where client_golang reads memory and CPU and its own
	// start time: there only names, help and types can be compared.
	emulated := value(theirs["process_resident_memory_bytes"]) == 0
	if emulated {
		t.Log("client_golang reads a zero RSS (an emulated /proc/self/stat): values not compared")
	}
	for name, want := range theirs {
		got, ok := ours[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if got.GetHelp() != want.GetHelp() || got.GetType() != want.GetType() {
			t.Errorf("%s: %s %q, client_golang %s %q", name, got.GetType(), got.GetHelp(), want.GetType(), want.GetHelp())
		}
		if emulated {
			continue
		}
		g, w := value(got), value(want)
		margin := 0.0
		switch name {
		case "process_cpu_seconds_total":
			margin = 0.05 // client_golang counts whole ticks
		case "process_resident_memory_bytes", "process_virtual_memory_bytes":
			margin = 0.1 * w
		case "process_open_fds":
			margin = 1
		case "process_network_receive_bytes_total", "process_network_transmit_bytes_total":
			margin = 1 << 20 // the namespace's counters, moving under other traffic
		}
		if math.Abs(g-w) > margin {
			t.Errorf("%s = %v, client_golang %v", name, g, w)
		}
	}
}

func TestParseNetstatOctets(t *testing.T) {
	in, out := parseNetstatOctets([]byte("TcpExt: SyncookiesSent SyncookiesRecv\nTcpExt: 0 0\n" +
		"IpExt: InNoRoutes InTruncatedPkts InMcastPkts OutMcastPkts InBcastPkts OutBcastPkts InOctets OutOctets\n" +
		"IpExt: 0 0 0 0 0 0 123456 654321\nMPTcpExt: MPCapableSYNRX\nMPTcpExt: 0\n"))
	if in != 123456 || out != 654321 {
		t.Errorf("in %v out %v", in, out)
	}
	if in, out := parseNetstatOctets([]byte("IpExt: InOctets OutOctets\nIpExt: x\n")); in != 0 || out != 0 {
		t.Errorf("malformed: in %v out %v", in, out)
	}
}

// FuzzProcFiles: any content of statm and netstat gives values or nothing,
// never a panic. Seeds: this machine's own files.
func FuzzProcFiles(f *testing.F) {
	for _, p := range []string{"/proc/self/statm", "/proc/self/net/netstat"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("IpExt: InOctets\nIpExt:\n"))
	f.Add([]byte("1 2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseStatm(b)
		parseNetstatOctets(b)
	})
}

// process_open_fds counts the descriptors open at each scrape: the
// directory kept open is listed anew, from its start, every time.
func TestProcessOpenFDsFollowsDescriptors(t *testing.T) {
	c := newProcessCollector()
	count := func() float64 { t.Helper(); return value(gatherOne(t, c)["process_open_fds"]) }
	count() // the first opens the files the collector keeps open
	before := count()
	if before < 4 { // stdin, stdout, stderr and the directory itself at least
		t.Fatalf("process_open_fds %v", before)
	}
	var files []*os.File
	for range 5 {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if got := count(); got != before+5 {
		t.Errorf("with 5 more files open: %v, before %v", got, before)
	}
	for _, f := range files {
		f.Close()
	}
	if got := count(); got != before {
		t.Errorf("with them closed again: %v, before %v", got, before)
	}
}

func TestCountDirents(t *testing.T) {
	ent := func(name string) []byte {
		reclen := (19 + len(name) + 1 + 7) &^ 7
		b := make([]byte, reclen)
		b[16], b[17] = byte(reclen), byte(reclen>>8) // little endian, as on amd64 and arm64
		copy(b[19:], name)
		return b
	}
	var buf []byte
	for _, n := range []string{".", "..", "0", "1", "2", "10", "255"} {
		buf = append(buf, ent(n)...)
	}
	if got := countDirents(buf); got != 5 {
		t.Errorf("%d entries, want 5", got)
	}
	// A truncated or malformed record ends the count, no panic.
	if got := countDirents(buf[:len(buf)-3]); got != 4 {
		t.Errorf("truncated: %d entries, want 4", got)
	}
	if got := countDirents(make([]byte, 40)); got != 0 {
		t.Errorf("zero reclen: %d", got)
	}
}
