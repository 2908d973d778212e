package kmsg

import (
	"testing"

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
	mon := NewMonitor(Options{Rules: rs, Store: store, IOErrorThreshold: 5, IOErrorWindow: 600e9})
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
