package kmsg

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every rule has a fixture file of real-format kernel lines, positive (+)
// and negative (-), and matches exactly the positive ones.
func TestRuleFixtures(t *testing.T) {
	rs, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range DefaultRules {
		if r.Kind == PodVolume {
			// No pattern: ReadonlyFilesystem's lines on a pod's volume
			// (TestPodVolumeReadOnlyIsNotReadonlyFilesystem).
			continue
		}
		t.Run(r.Name, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", "rules", r.Name+".txt"))
			if err != nil {
				t.Fatalf("no fixture for rule %s: %v", r.Name, err)
			}
			defer f.Close()
			pos, neg := 0, 0
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				line := sc.Text()
				if line == "" || line[0] == '#' {
					continue
				}
				want := line[0] == '+'
				if want {
					pos++
				} else {
					neg++
				}
				l := ParseLine([]byte(line[2:]))
				rec := l.Record
				if l.Skip {
					t.Fatalf("fixture line skipped by the parser: %q", line)
				}
				msg := Unescape(nil, rec.Message)
				got := false
				for _, m := range rs.Matches(nil, msg) {
					got = got || m.Rule.Name == r.Name
				}
				if got != want {
					t.Errorf("%s on %q = %v, want %v", r.Name, msg, got, want)
				}
			}
			if pos < 2 || neg < 2 {
				t.Errorf("fixture has %d positive and %d negative lines; want at least 2 of each", pos, neg)
			}
		})
	}
}

func TestBuildRules(t *testing.T) {
	custom := []Rule{
		{Name: "IOError", Kind: Temp, Reason: "IOError", Pattern: `^mydrv: Buffer I/O error`},
		{Name: "MyDriver", Kind: Temp, Reason: "BlockIOError", Pattern: `^mydrv \S+: I/O error`},
	}
	rules, err := BuildRules([]string{"NvmeError"}, custom)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, r := range rules {
		names[r.Name] = r.Pattern
	}
	if _, ok := names["NvmeError"]; ok {
		t.Error("disabled rule still there")
	}
	if names["IOError"] != `^mydrv: Buffer I/O error` || names["MyDriver"] == "" || len(rules) != len(DefaultRules)+1-1 {
		t.Errorf("override/add: %v", names)
	}
	if _, err := BuildRules([]string{"Nope"}, nil); err == nil {
		t.Error("unknown disabled rule accepted")
	}
	rs, err := Compile(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ms := rs.Matches(nil, []byte("mydrv sdx: I/O error at 42")); len(ms) != 1 || ms[0].Rule.Name != "MyDriver" {
		t.Errorf("custom rule: %+v", ms)
	}
}

// The device a disk I/O error names is the whole disk the block layer
// printed (req->q->disk->disk_name, blk_print_req_error 6.x; rq_disk before
// 5.18), whatever its driver names it: SCSI, NVMe and an NVMe multipath
// path, virtio, Xen, MMC, Ceph RBD, device-mapper (request-based, e.g.
// multipath) and md; "?" when the request had no disk (before 5.18).
func TestDiskIOErrorDevice(t *testing.T) {
	rs, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	for line, dev := range map[string]string{
		"I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2":                  "sda",
		"I/O error, dev nvme0n1, sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2":          "nvme0n1",
		"I/O error, dev nvme1c1n1, sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2":        "nvme1c1n1",
		"I/O error, dev vda, sector 1050624 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 2":            "vda",
		"timeout error, dev xvdb, sector 4096 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2":             "xvdb",
		"I/O error, dev mmcblk0, sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2":          "mmcblk0",
		"I/O error, dev rbd0, sector 10485760 op 0x1:(WRITE) flags 0x8800 phys_seg 4 prio class 2":         "rbd0",
		"I/O error, dev dm-2, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2":                    "dm-2",
		"I/O error, dev md127, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2":                   "md127",
		"blk_update_request: I/O error, dev sdb, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0": "sdb",
		"print_req_error: I/O error, dev sdc, sector 2048":                                                 "sdc",
		"blk_update_request: I/O error, dev ?, sector 2048":                                                "?",
		"I/O error, dev fd0, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2":                     "fd0",
	} {
		var got []string
		for _, m := range rs.Matches(nil, []byte(line)) {
			if m.Rule.Kind == DiskIOError {
				got = append(got, m.Dev)
			}
		}
		if len(got) != 1 || got[0] != dev {
			t.Errorf("%q: devices %q, want [%q]", line, got, dev)
		}
	}
	set := settings{ignore: DefaultIgnoreDevices}
	for dev, ignored := range map[string]bool{
		"sda": false, "nvme0n1": false, "nvme1c1n1": false, "vda": false, "xvdb": false, "mmcblk0": false, "?": false,
		"loop0": true, "dm-2": true, "md127": true, "nbd0": true, "rbd0": true, "zram0": true, "ram0": true, "sr0": true, "fd0": true,
	} {
		if got := set.ignored(dev); got != ignored {
			t.Errorf("ignored(%q) = %v, want %v", dev, got, ignored)
		}
	}
}

// A disk-io-error rule (BlockIOError's kind, as `kmsg rules` lists it) must
// name the device in a (?P<dev>...) group: ignore_devices and the NVMe over
// Fabrics and iSCSI lookups judge each error by its device. Before, an
// operator's replacement of BlockIOError without the group was accepted,
// and every error counted for the device "": a loop device's errors
// (ignored by default) turned DisksFailure True "... on ".
func TestDiskIOErrorRuleNeedsADevGroup(t *testing.T) {
	_, err := Compile([]Rule{{Name: "BlockIOError", Kind: DiskIOError, Reason: "BlockIOError",
		Pattern: `I/O error, dev \S+, sector \d+`}}, nil)
	if err == nil || !strings.Contains(err.Error(), "(?P<dev>") {
		t.Fatalf("a disk-io-error rule without a dev group: %v, want refused naming (?P<dev>...)", err)
	}
	if _, err := Compile([]Rule{{Name: "BlockIOError", Kind: DiskIOError, Reason: "BlockIOError",
		Pattern: `I/O error, dev (?P<dev>[^,\s]+), sector \d+`}}, nil); err != nil {
		t.Errorf("with the group: %v", err)
	}
	_, err = Compile([]Rule{{Name: "X", Kind: "bad", Reason: "IOError", Pattern: `x`}}, nil)
	if err == nil || !strings.Contains(err.Error(), "disk-io-error") {
		t.Errorf("an unknown kind: %v, want the three kinds named", err)
	}
}
