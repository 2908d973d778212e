package hostio

import (
	"fmt"
	"strconv"
	"strings"
)

// VerityTable is a dm-verity target's table line as the kernel reports it
// (DM_TABLE_STATUS with DM_STATUS_TABLE_FLAG; `dmsetup table`):
//
//	<version> <data_dev> <hash_dev> <data_block_size> <hash_block_size>
//	<num_data_blocks> <hash_start_block> <algorithm> <root_hash> <salt>
//	[<#opt_params> <opt_params>...]
//
// (Documentation/admin-guide/device-mapper/verity.rst).
type VerityTable struct {
	Version                      int
	DataDev, HashDev             string
	DataBlockSize, HashBlockSize uint64
	NumDataBlocks, HashStart     uint64
	Algorithm                    string
	// RootHash is lower-case hex, as the kernel prints it.
	RootHash string
	// Salt is "-" when there is none.
	Salt string
	// Options are the optional parameters (ignore_corruption,
	// restart_on_corruption, panic_on_corruption, use_fec_from_device ...).
	Options []string
}

// ParseVerityTable parses one verity target's table line.
func ParseVerityTable(line string) (VerityTable, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return VerityTable{}, fmt.Errorf("verity table: %d fields, want at least 10", len(f))
	}
	var t VerityTable
	var err error
	num := func(i int, what string) uint64 {
		if err != nil {
			return 0
		}
		var v uint64
		v, err = strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			err = fmt.Errorf("verity table: %s %q is not a number", what, f[i])
		}
		return v
	}
	v := num(0, "version")
	t.DataDev, t.HashDev = f[1], f[2]
	t.DataBlockSize = num(3, "data block size")
	t.HashBlockSize = num(4, "hash block size")
	t.NumDataBlocks = num(5, "number of data blocks")
	t.HashStart = num(6, "hash start block")
	if err != nil {
		return VerityTable{}, err
	}
	if v > 1 {
		return VerityTable{}, fmt.Errorf("verity table: unknown version %d", v)
	}
	t.Version = int(v)
	t.Algorithm = f[7]
	if t.RootHash, err = NormHex(f[8]); err != nil {
		return VerityTable{}, fmt.Errorf("verity table: root hash: %w", err)
	}
	t.Salt = f[9]
	if t.Salt != "-" {
		if _, err := NormHex(t.Salt); err != nil {
			return VerityTable{}, fmt.Errorf("verity table: salt: %w", err)
		}
	}
	if len(f) > 10 {
		n, err := strconv.Atoi(f[10])
		if err != nil || n < 0 || n != len(f)-11 {
			return VerityTable{}, fmt.Errorf("verity table: %d optional parameters after the count %q", len(f)-11, f[10])
		}
		t.Options = f[11:]
	}
	return t, nil
}

// NormHex checks a hex digest (at least 128 bits, whole bytes) and returns it
// in lower case.
func NormHex(s string) (string, error) {
	if len(s) < 32 || len(s)%2 != 0 || len(s) > 256 {
		return "", fmt.Errorf("%q is not a hex digest of 16 to 128 bytes", s)
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return "", fmt.Errorf("%q is not hex", s)
		}
	}
	return strings.ToLower(s), nil
}
