package hostio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DM reads the device-mapper tables the kernel enforces.
type DM interface {
	// VerityTargets returns the verity targets of every device-mapper
	// device's live table.
	VerityTargets() ([]VerityTarget, error)
}

// VerityTarget is one verity target of a device-mapper device.
type VerityTarget struct {
	// Device is the device-mapper name (the sealed layer's name).
	Device string
	Table  VerityTable
	// Targets is the number of targets in the device's table, of any type
	// (0: not known). A sealed layer's device has one: a verity target
	// beside another covers only part of the device. (The kernel accepts
	// several verity targets in one table, as the VM tier's sealed_os
	// shows; it refuses a verity target beside one of another type,
	// "immutable target type cannot be mixed", which the count guards
	// against all the same.)
	Targets int
}

// ErrNoDeviceMapper: the control node does not exist (the kernel has no
// device-mapper, or /dev is not the host's).
var ErrNoDeviceMapper = errors.New("no device-mapper control node")

// DMControl reads the tables through the device-mapper ioctl interface on
// the control node (/dev/mapper/control), as dmsetup does, without running
// it. Reading needs CAP_SYS_ADMIN.
type DMControl struct{ Path string }

// Layout of the ioctl buffers (include/uapi/linux/dm-ioctl.h); the tests pin
// these against the structs of golang.org/x/sys/unix.
const (
	dmNameListNameOff = 12 // struct dm_name_list: __u64 dev; __u32 next; char name[];
	dmMaxBuffer       = 4 << 20
)

// VerityTargets lists the devices (DM_LIST_DEVICES) and reads each live
// table (DM_TABLE_STATUS with DM_STATUS_TABLE_FLAG).
func (c DMControl) VerityTargets() ([]VerityTarget, error) {
	// dmsetup opens it read-write; the ioctls check CAP_SYS_ADMIN, not the
	// open mode, so read-only does where a device policy allows only that
	// (the unit's DeviceAllow=/dev/mapper/control r).
	f, err := os.OpenFile(c.Path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrPermission) {
		f, err = os.OpenFile(c.Path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", c.Path, ErrNoDeviceMapper)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fd := int(f.Fd())
	data, _, err := dmIoctl(fd, unix.DM_LIST_DEVICES, "", 0)
	if err != nil {
		return nil, fmt.Errorf("DM_LIST_DEVICES: %w", err)
	}
	names, err := parseNameList(data)
	if err != nil {
		return nil, err
	}
	var out []VerityTarget
	for _, name := range names {
		data, count, err := dmIoctl(fd, unix.DM_TABLE_STATUS, name, unix.DM_STATUS_TABLE_FLAG)
		if errors.Is(err, unix.ENXIO) {
			continue // removed since the list
		}
		if err != nil {
			return nil, fmt.Errorf("DM_TABLE_STATUS %s: %w", name, err)
		}
		ts, err := parseTargets(data, count)
		if err != nil {
			return nil, fmt.Errorf("table of %s: %w", name, err)
		}
		for _, t := range ts {
			if t.Type != "verity" {
				continue
			}
			vt, err := ParseVerityTable(t.Params)
			if err != nil {
				return nil, fmt.Errorf("table of %s: %w", name, err)
			}
			out = append(out, VerityTarget{Device: name, Table: vt, Targets: len(ts)})
		}
	}
	return out, nil
}

// dmIoctl runs one ioctl with a buffer that grows until the answer fits, and
// returns the data area and the target count.
func dmIoctl(fd int, req uint, name string, flags uint32) ([]byte, int, error) {
	if len(name) >= unix.DM_NAME_LEN {
		return nil, 0, fmt.Errorf("device name %q too long", name)
	}
	for size := 16 << 10; size <= dmMaxBuffer; size *= 2 {
		buf := make([]byte, size)
		h := (*unix.DmIoctl)(unsafe.Pointer(&buf[0]))
		h.Version = [3]uint32{unix.DM_VERSION_MAJOR, 0, 0}
		h.Data_size = uint32(size)
		h.Data_start = unix.SizeofDmIoctl
		h.Flags = flags
		copy(h.Name[:], name)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return nil, 0, errno
		}
		if h.Flags&unix.DM_BUFFER_FULL_FLAG != 0 {
			continue
		}
		end := min(int(h.Data_size), size)
		start := int(h.Data_start)
		if start < unix.SizeofDmIoctl || start > end {
			return nil, 0, fmt.Errorf("kernel answered data %d..%d in a buffer of %d", start, end, size)
		}
		return buf[start:end], int(h.Target_count), nil
	}
	return nil, 0, fmt.Errorf("answer larger than %d bytes", dmMaxBuffer)
}

// parseNameList decodes DM_LIST_DEVICES' data: dm_name_list records, each
// with the offset of the next (0 ends the list); a first record with dev 0
// means there are no devices.
func parseNameList(data []byte) ([]string, error) {
	if len(data) < 8 || binary.NativeEndian.Uint64(data) == 0 {
		return nil, nil
	}
	var names []string
	for off := 0; ; {
		if off+dmNameListNameOff > len(data) {
			return nil, fmt.Errorf("device list: record at %d past the end (%d)", off, len(data))
		}
		next := int(binary.NativeEndian.Uint32(data[off+8:]))
		rest := data[off+dmNameListNameOff:]
		end := bytes.IndexByte(rest, 0)
		if end < 0 {
			return nil, fmt.Errorf("device list: name at %d not terminated", off)
		}
		names = append(names, string(rest[:end]))
		if next == 0 {
			return names, nil
		}
		if next < dmNameListNameOff+end+1 || len(names) > 1<<16 {
			return nil, fmt.Errorf("device list: next record offset %d at %d overlaps the name", next, off)
		}
		off += next
	}
}

// dmTarget is one target of a table.
type dmTarget struct {
	Start, Length uint64
	Type          string
	Params        string
}

// parseTargets decodes DM_TABLE_STATUS' data: count dm_target_spec records,
// each followed by its NUL-terminated parameter string; a record's next is
// the offset of the following record from the start of the data.
func parseTargets(data []byte, count int) ([]dmTarget, error) {
	if count < 0 || count > 1<<16 {
		return nil, fmt.Errorf("%d targets", count)
	}
	var out []dmTarget
	off := 0
	for i := range count {
		if off < 0 || off+unix.SizeofDmTargetSpec > len(data) {
			return nil, fmt.Errorf("target %d at %d past the end (%d)", i, off, len(data))
		}
		var spec unix.DmTargetSpec
		spec.Sector_start = binary.NativeEndian.Uint64(data[off:])
		spec.Length = binary.NativeEndian.Uint64(data[off+8:])
		spec.Next = binary.NativeEndian.Uint32(data[off+20:])
		typ := data[off+24 : off+40]
		if z := bytes.IndexByte(typ, 0); z >= 0 {
			typ = typ[:z]
		}
		params := data[off+unix.SizeofDmTargetSpec:]
		z := bytes.IndexByte(params, 0)
		if z < 0 {
			return nil, fmt.Errorf("target %d: parameters not terminated", i)
		}
		out = append(out, dmTarget{Start: spec.Sector_start, Length: spec.Length, Type: string(typ), Params: string(params[:z])})
		next := int(spec.Next)
		if i < count-1 && next <= off {
			return nil, fmt.Errorf("target %d: next offset %d does not move past %d", i, next, off)
		}
		off = next
	}
	return out, nil
}
