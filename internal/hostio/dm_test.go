package hostio

import (
	"encoding/binary"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The offsets of struct dm_ioctl, dm_target_spec and dm_name_list in
// include/uapi/linux/dm-ioctl.h, against the Go structs the ioctls use.
func TestDMLayout(t *testing.T) {
	var h unix.DmIoctl
	var s unix.DmTargetSpec
	var n unix.DmNameList
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof dm_ioctl", unsafe.Sizeof(h), 312},
		{"dm_ioctl.data_size", unsafe.Offsetof(h.Data_size), 12},
		{"dm_ioctl.data_start", unsafe.Offsetof(h.Data_start), 16},
		{"dm_ioctl.target_count", unsafe.Offsetof(h.Target_count), 20},
		{"dm_ioctl.flags", unsafe.Offsetof(h.Flags), 28},
		{"dm_ioctl.dev", unsafe.Offsetof(h.Dev), 40},
		{"dm_ioctl.name", unsafe.Offsetof(h.Name), 48},
		{"dm_ioctl.uuid", unsafe.Offsetof(h.Uuid), 176},
		{"dm_ioctl.data", unsafe.Offsetof(h.Data), 305},
		{"sizeof dm_target_spec", unsafe.Sizeof(s), 40},
		{"dm_target_spec.next", unsafe.Offsetof(s.Next), 20},
		{"dm_target_spec.target_type", unsafe.Offsetof(s.Target_type), 24},
		{"dm_name_list.name", unsafe.Offsetof(n.Name), dmNameListNameOff},
		{"SizeofDmIoctl", unix.SizeofDmIoctl, 312},
		{"SizeofDmTargetSpec", unix.SizeofDmTargetSpec, 40},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	// _IOWR(0xfd, 2 / 12, struct dm_ioctl)
	if unix.DM_LIST_DEVICES != 0xc138fd02 || unix.DM_TABLE_STATUS != 0xc138fd0c || unix.DM_STATUS_TABLE_FLAG != 1<<4 {
		t.Error("DM ioctl numbers differ from the kernel's")
	}
}

// nameList builds DM_LIST_DEVICES data as the kernel writes it.
func nameList(names ...string) []byte {
	var out []byte
	for i, n := range names {
		rec := make([]byte, dmNameListNameOff+len(n)+1)
		binary.NativeEndian.PutUint64(rec, uint64(0xfd00+i+1))
		copy(rec[dmNameListNameOff:], n)
		for len(rec)%8 != 0 {
			rec = append(rec, 0)
		}
		if i < len(names)-1 {
			binary.NativeEndian.PutUint32(rec[8:], uint32(len(rec)))
		}
		out = append(out, rec...)
	}
	return out
}

// targets builds DM_TABLE_STATUS data as the kernel's retrieve_status
// writes it: next is the offset of the following spec from the data start.
func targets(ts ...dmTarget) []byte {
	var out []byte
	for _, t := range ts {
		spec := make([]byte, unix.SizeofDmTargetSpec)
		binary.NativeEndian.PutUint64(spec, t.Start)
		binary.NativeEndian.PutUint64(spec[8:], t.Length)
		copy(spec[24:], t.Type)
		start := len(out)
		out = append(out, spec...)
		out = append(out, t.Params...)
		out = append(out, 0)
		for len(out)%8 != 0 {
			out = append(out, 0)
		}
		binary.NativeEndian.PutUint32(out[start+20:], uint32(len(out)))
	}
	return out
}

func TestParseDMAnswers(t *testing.T) {
	names, err := parseNameList(nameList("root", "usr-verity", "x"))
	if err != nil || !slices.Equal(names, []string{"root", "usr-verity", "x"}) {
		t.Errorf("names %q %v", names, err)
	}
	if names, err := parseNameList(make([]byte, 16)); err != nil || names != nil {
		t.Errorf("no devices (dev 0): %q %v", names, err)
	}
	want := []dmTarget{{0, 2097152, "verity", verityLine}, {2097152, 8, "linear", "8:1 0"}}
	got, err := parseTargets(targets(want...), 2)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("targets %+v %v", got, err)
	}
	bad := targets(want[0])
	if _, err := parseTargets(bad[:len(bad)-8], 1); err == nil {
		t.Error("an unterminated parameter string was accepted")
	}
	if _, err := parseTargets(bad, 2); err == nil {
		t.Error("a count past the data was accepted")
	}
}

func FuzzParseDMAnswers(f *testing.F) {
	f.Add(nameList("root", "usr"), targets(dmTarget{0, 8, "verity", verityLine}), 1)
	f.Fuzz(func(t *testing.T, list, table []byte, count int) {
		parseNameList(list)
		parseTargets(table, count)
	})
}
