package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// A realistic mix of kernel records on a busy Kubernetes node: mostly
// network, audit and filesystem noise that no rule matches.
var nonMatching = []string{
	"6,1201,812345678,-;IPv6: ADDRCONF(NETDEV_CHANGE): lxc8f2a1c3b4d5e: link becomes ready",
	"6,1202,812345700,-;eth0: renamed from tmp4b1c2",
	"5,1203,812345800,-;audit: type=1400 audit(1700000000.123:4242): apparmor=\"DENIED\" operation=\"open\" profile=\"cri-containerd.apparmor.d\" name=\"/proc/sys/kernel/random/boot_id\" pid=4242 comm=\"python3\"",
	"6,1204,812345900,-;cilium_vxlan: Caught tx_queue_len zero misconfig",
	"4,1205,812346000,-;xfs filesystem being remounted at /var/lib/kubelet/pods/0c1f/volumes supports timestamps until 2038 (0x7fffffff)",
	"6,1206,812346100,-;EXT4-fs (nvme0n1p3): mounted filesystem 8c1d2e3f-0000-0000-0000-000000000000 r/w with ordered data mode. Quota mode: none.",
	"6,1207,812346200,-;device lxc_health entered promiscuous mode",
	"6,1208,812346300,-;overlayfs: idmapped layers are currently not supported",
	"6,1209,812346400,-;nvme nvme0: 8/0/0 default/read/poll queues",
	"4,1210,812346500,-;TCP: request_sock_TCP: Possible SYN flooding on port 6443. Sending cookies.  Check SNMP counters.",
}

var matching = []string{
	"3,1300,812400000,-;I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0",
	"3,1301,812400001,-;INFO: task kubelet:128 blocked for more than 120 seconds.",
}

func benchMonitor(b *testing.B) *Monitor {
	rs, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		b.Fatal(err)
	}
	store := report.NewStore("b")
	mon := NewMonitor(Options{Rules: rs, Store: store, IOErrorThreshold: 5, IOErrorWindow: 600e9, Sysfs: fixtureSysfs})
	mon.Start(t0, t0)
	return mon
}

// Parse + all rules on records that no rule matches: the common case. Must
// not allocate.
func BenchmarkNonMatchingRecord(b *testing.B) {
	mon := benchMonitor(b)
	recs := make([][]byte, len(nonMatching))
	for i, s := range nonMatching {
		recs[i] = []byte(s)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r, err := ParseRecord(recs[i%len(recs)])
		if err != nil {
			b.Fatal(err)
		}
		mon.Handle(r, t0)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// The same with 1 record in 100 matching a rule (an event or a window entry).
func BenchmarkMixedRecords(b *testing.B) {
	mon := benchMonitor(b)
	var recs [][]byte
	for i := range 100 {
		if i == 50 {
			recs = append(recs, []byte(matching[i%2]))
			continue
		}
		recs = append(recs, []byte(nonMatching[i%len(nonMatching)]))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r, _ := ParseRecord(recs[i%len(recs)])
		mon.Handle(r, t0)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkParseRecord(b *testing.B) {
	rec := []byte(nonMatching[2])
	b.ReportAllocs()
	for b.Loop() {
		ParseRecord(rec)
	}
}

// memDevice serves records from memory as fast as they are read (1 in 20
// matching, as in the kmsg-flood harness), each with the next sequence
// number, and stops the reader after n.
type memDevice struct {
	seq, n uint64
	stop   func()
}

func (d *memDevice) Read(p []byte) (int, error) {
	d.seq++
	if d.seq > d.n {
		d.stop()
		return 0, os.ErrDeadlineExceeded
	}
	msg := nonMatching[d.seq%uint64(len(nonMatching))]
	if d.seq%20 == 0 {
		msg = matching[d.seq/20%uint64(len(matching))]
	}
	msg = msg[strings.IndexByte(msg, ';')+1:]
	b := append(p[:0], "6,"...)
	b = strconv.AppendUint(b, d.seq, 10)
	b = append(b, ",812345678,-;"...)
	b = append(b, msg...)
	return len(b), nil
}
func (d *memDevice) Seek(int64, int) (int64, error)  { return 0, nil }
func (d *memDevice) SetReadDeadline(time.Time) error { return nil }
func (d *memDevice) Close() error                    { return nil }

// The reader's loop for each record, without the system calls: read from
// the device, parse, match, the cursor, progress and the read deadline.
func BenchmarkReaderLoop(b *testing.B) {
	mon := benchMonitor(b)
	ctx, cancel := context.WithCancel(context.Background())
	dev := &memDevice{n: uint64(b.N), stop: cancel}
	// FromStart: every record is handled. Started at the end of the log,
	// the first open reads the ring to its end handling nothing (skipRing),
	// and a device that never waits would be read to its end there.
	rd := &Reader{Path: "mem", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), ReadTimeout: time.Second,
		FromStart: true, Progress: func(string, time.Duration) {}, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	b.ReportAllocs()
	b.ResetTimer()
	rd.Run(ctx)
	b.StopTimer()
	if got := mon.Metrics().Records(); got != float64(b.N) {
		b.Fatalf("handled %v records, want %d", got, b.N)
	}
}

// One read of a record from the real /dev/kmsg, as the reader reads it:
// the records in the ring buffer, half of them over and over. Needs the
// right to read the kernel log (root).
func BenchmarkDeviceRead(b *testing.B) {
	dev, err := Open("/dev/kmsg")
	if err != nil {
		b.Skip("cannot open /dev/kmsg: ", err)
	}
	defer dev.Close()
	buf := make([]byte, BufSize)
	// How many records the ring holds now (a read that waits ends it).
	held := 0
	dev.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	for {
		if _, err := dev.Read(buf); err != nil && !errors.Is(err, syscall.EPIPE) {
			break
		}
		held++
	}
	if held < 20 {
		b.Skipf("only %d records in the kernel log", held)
	}
	dev.SetReadDeadline(time.Now().Add(time.Hour))
	dev.Seek(0, io.SeekStart)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%(held/2) == 0 {
			dev.Seek(0, io.SeekStart)
		}
		if _, err := dev.Read(buf); err != nil && !errors.Is(err, syscall.EPIPE) {
			b.Fatal(err)
		}
	}
}

// A flood of disk I/O errors on three devices: each line goes into the
// window and the window is evaluated (its count must not walk the window,
// which holds up to windowCap errors).
func BenchmarkIOErrorFlood(b *testing.B) { ioErrorFlood(b, "sda", "sdb", "sdc") }

// The same on NVMe drives, one of them a namespace of NVMe over Fabrics
// (not counted): each device is looked up in sysfs once, then cached.
func BenchmarkIOErrorFloodNVMe(b *testing.B) { ioErrorFlood(b, "nvme0n1", "nvme1n1", "nvme3n1") }

func ioErrorFlood(b *testing.B, devs ...string) {
	mon := benchMonitor(b)
	recs := make([][]byte, 4096)
	for i := range recs {
		recs[i] = fmt.Appendf(nil, "3,%d,%d,-;I/O error, dev %s, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", 2000+i, 812400000+i*100, devs[i%len(devs)])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r, _ := ParseRecord(recs[i%len(recs)])
		r.Usec = uint64(812400000 + i*100)
		mon.Handle(r, t0)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
