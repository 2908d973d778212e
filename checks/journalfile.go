package checks

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"sync"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// A reader of journald's own files (https://systemd.io/JOURNAL_FILE_FORMAT/,
// systemd's journal-def.h), for the one query KubeletHeartbeatFailed asks:
// the entries of one _SYSTEMD_UNIT= value after a position. It reads with
// pread through a small block cache, never the whole file: the header, the
// hash-table bucket of the match, that DATA object's entry-array chain (whole
// arrays skipped by their last item), then each entry and its DATA objects.
//
// Whatever it does not handle is an error (errJournalUnsupported for a
// feature, errJournalCorrupt for data that breaks the format's rules), and
// the caller then asks journalctl instead. Every loop over file data is
// bounded: offsets strictly increase along every chain, counts are capped by
// the file's size.

var (
	errJournalUnsupported = errors.New("not handled by the native journal reader")
	errJournalCorrupt     = errors.New("journal file inconsistent")
)

// unsupportedf is an errJournalUnsupported, for reason (the label of
// autopilot_health_journal_fallbacks_total).
func unsupportedf(reason JournalFallbackReason, format string, a ...any) error {
	return &nativeUnsupported{reason: reason, err: fmt.Errorf("%w: "+format, append([]any{errJournalUnsupported}, a...)...)}
}

func corruptf(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errJournalCorrupt}, a...)...)
}

const (
	jHeaderMinSize = 240 // up to data_hash_chain_depth: the fields this reader uses

	jIncompatXZ        = 1 << 0
	jIncompatLZ4       = 1 << 1
	jIncompatKeyedHash = 1 << 2
	jIncompatZSTD      = 1 << 3
	jIncompatCompact   = 1 << 4
	jIncompatKnown     = jIncompatXZ | jIncompatLZ4 | jIncompatKeyedHash | jIncompatZSTD | jIncompatCompact

	jObjectData       = 1
	jObjectEntry      = 3
	jObjectEntryArray = 6

	jObjCompressedXZ   = 1 << 0
	jObjCompressedLZ4  = 1 << 1
	jObjCompressedZSTD = 1 << 2

	jObjectHeaderSize = 16
	jDataFixedSize    = 64 // object header + hash .. n_entries
	jDataCompactExtra = 8  // tail_entry_array_offset, tail_entry_array_n_entries
	jEntryFixedSize   = 64 // object header + seqnum .. xor_hash
	jEntryArrayFixed  = 24 // object header + next_entry_array_offset

	// jsonValueMax is journalctl --output=json's JSON_THRESHOLD: without
	// --all a field whose "NAME=value" is this long or longer is written
	// null.
	jsonValueMax = 4096
)

// journalHeader holds the header fields the reader uses.
type journalHeader struct {
	incompat          uint32
	state             uint8
	fileID            [16]byte
	machineID         [16]byte
	seqnumID          [16]byte
	headerSize        uint64
	arenaSize         uint64
	dataHashOffset    uint64
	dataHashSize      uint64
	tailObjectOffset  uint64
	nObjects          uint64
	nEntries          uint64
	tailEntrySeqnum   uint64
	headEntrySeqnum   uint64
	headEntryRealtime uint64
	tailEntryRealtime uint64
}

func (h *journalHeader) compact() bool { return h.incompat&jIncompatCompact != 0 }

// journalFile is one open journal file.
type journalFile struct {
	path string
	r    io.ReaderAt
	size int64 // the readable end: the smaller of the file size and header + arena
	hdr  journalHeader
	// tilde: a *.journal~ file, read as sd-journal reads one with a torn
	// tail (openNativeFile).
	tilde bool
	// fd is the open file the native reader closes after its read (nil in
	// tests that read bytes).
	fd *journalFD
	// creating: a file journald has just created, its header alone (no
	// hash tables, no entries): it holds nothing to read.
	creating bool

	cache blockCache
}

// jEntry is one ENTRY object, as the reader needs it.
type jEntry struct {
	offset    uint64
	seqnum    uint64
	realtime  uint64
	monotonic uint64
	bootID    [16]byte
	xorHash   uint64
}

// openJournalFile reads and checks the header of a journal file of
// fileSize bytes.
func openJournalFile(path string, r io.ReaderAt, fileSize int64) (*journalFile, error) {
	return openGrowingJournalFile(path, r, func() (int64, error) { return fileSize, nil })
}

// openGrowingJournalFile is openJournalFile for a file journald may be
// growing: journal_file_allocate extends the file, then sets arena_size in
// the header, so its size is taken after the header is read (before, a
// growth in between would be a header and arena beyond the file).
func openGrowingJournalFile(path string, r io.ReaderAt, sizeNow func() (int64, error)) (*journalFile, error) {
	f := &journalFile{path: path, r: r}
	f.cache.init()
	b := make([]byte, 272)
	n, err := r.ReadAt(b, 0)
	if n < jHeaderMinSize {
		if err == nil || err == io.EOF {
			return nil, corruptf("%d bytes: shorter than a journal header", n)
		}
		return nil, err
	}
	b = b[:n]
	fileSize, err := sizeNow()
	if err != nil {
		return nil, err
	}
	f.size = fileSize
	if string(b[:8]) != "LPKSHHRH" {
		return nil, corruptf("no journal signature")
	}
	le := binary.LittleEndian
	h := &f.hdr
	h.incompat = le.Uint32(b[12:])
	h.state = b[16]
	copy(h.fileID[:], b[24:40])
	copy(h.machineID[:], b[40:56])
	copy(h.seqnumID[:], b[72:88])
	h.headerSize = le.Uint64(b[88:])
	h.arenaSize = le.Uint64(b[96:])
	h.dataHashOffset = le.Uint64(b[104:])
	h.dataHashSize = le.Uint64(b[112:])
	h.tailObjectOffset = le.Uint64(b[136:])
	h.nObjects = le.Uint64(b[144:])
	h.nEntries = le.Uint64(b[152:])
	h.tailEntrySeqnum = le.Uint64(b[160:])
	h.headEntrySeqnum = le.Uint64(b[168:])
	h.headEntryRealtime = le.Uint64(b[184:])
	h.tailEntryRealtime = le.Uint64(b[192:])

	if unknown := h.incompat &^ jIncompatKnown; unknown != 0 {
		return nil, unsupportedf(FallbackUnknownFormat, "unknown incompatible header flags %#x", unknown)
	}
	if h.incompat&(jIncompatXZ|jIncompatLZ4) != 0 {
		return nil, unsupportedf(FallbackCompression, "file compressed with XZ or LZ4 (flags %#x)", h.incompat)
	}
	if h.incompat&jIncompatKeyedHash == 0 {
		return nil, unsupportedf(FallbackNotKeyedHash, "file not keyed-hashed (Jenkins hash)")
	}
	if h.headerSize < jHeaderMinSize || h.headerSize > 1<<20 || h.headerSize%8 != 0 {
		return nil, corruptf("header size %d", h.headerSize)
	}
	end := h.headerSize + h.arenaSize
	if end < h.headerSize || end > uint64(fileSize) {
		// journald allocates ahead, so the file is at least header + arena.
		return nil, corruptf("header and arena (%d bytes) beyond the file's %d", end, fileSize)
	}
	f.size = int64(end)
	if h.nEntries == 0 && h.dataHashOffset == 0 && h.dataHashSize == 0 {
		// A file journald is creating (journal_file_init_header wrote the
		// header; the hash tables come next): no entry yet.
		f.creating = true
		return f, nil
	}
	if h.dataHashSize == 0 || h.dataHashSize%16 != 0 || h.dataHashOffset < h.headerSize+jObjectHeaderSize ||
		h.dataHashOffset+h.dataHashSize < h.dataHashOffset || h.dataHashOffset+h.dataHashSize > end {
		return nil, corruptf("data hash table at %d, %d bytes", h.dataHashOffset, h.dataHashSize)
	}
	return f, nil
}

// read returns n bytes at off, which must lie within the arena; the slice
// is valid until the next read.
func (f *journalFile) read(off uint64, n uint64) ([]byte, error) {
	if off < f.hdr.headerSize || n > uint64(f.size) || off > uint64(f.size)-n {
		return nil, corruptf("%d bytes at offset %d: outside the arena (%d bytes)", n, off, f.size)
	}
	return f.cache.read(f.r, int64(off), int(n))
}

// objectHeader reads the object header at off and checks its type and size.
func (f *journalFile) objectHeader(off uint64, typ uint8, min uint64) (flags uint8, size uint64, err error) {
	if off%8 != 0 {
		return 0, 0, corruptf("object offset %d not 8-byte aligned", off)
	}
	b, err := f.read(off, jObjectHeaderSize)
	if err != nil {
		return 0, 0, err
	}
	if b[0] != typ {
		return 0, 0, corruptf("object at %d is of type %d, want %d", off, b[0], typ)
	}
	flags = b[1]
	size = binary.LittleEndian.Uint64(b[8:])
	if size < min || size > uint64(f.size) || off > uint64(f.size)-size {
		return 0, 0, corruptf("object at %d: size %d", off, size)
	}
	return flags, size, nil
}

// jData is a DATA object's header fields.
type jData struct {
	offset           uint64
	flags            uint8
	size             uint64
	hash             uint64
	nextHashOffset   uint64
	entryOffset      uint64
	entryArrayOffset uint64
	nEntries         uint64
}

func (f *journalFile) dataPayloadOffset() uint64 {
	if f.hdr.compact() {
		return jDataFixedSize + jDataCompactExtra
	}
	return jDataFixedSize
}

func (f *journalFile) dataObject(off uint64) (jData, error) {
	flags, size, err := f.objectHeader(off, jObjectData, f.dataPayloadOffset())
	if err != nil {
		return jData{}, err
	}
	b, err := f.read(off, jDataFixedSize)
	if err != nil {
		return jData{}, err
	}
	le := binary.LittleEndian
	return jData{offset: off, flags: flags, size: size,
		hash: le.Uint64(b[16:]), nextHashOffset: le.Uint64(b[24:]),
		entryOffset: le.Uint64(b[40:]), entryArrayOffset: le.Uint64(b[48:]), nEntries: le.Uint64(b[56:])}, nil
}

var (
	zstdOnce sync.Once
	zstdDec  *zstd.Decoder
	zstdErr  error
)

// payload returns the DATA object's "FIELD=value" bytes, decompressed; at
// most max bytes: a longer payload is returned as over, with no bytes.
func (f *journalFile) payload(d jData, max int) (p []byte, over bool, err error) {
	start := d.offset + f.dataPayloadOffset()
	n := d.offset + d.size - start
	switch d.flags {
	case 0:
		if n >= uint64(max) {
			return nil, true, nil
		}
		b, err := f.read(start, n)
		if err != nil {
			return nil, false, err
		}
		return bytes.Clone(b), false, nil
	case jObjCompressedZSTD:
		if f.hdr.incompat&jIncompatZSTD == 0 {
			return nil, false, corruptf("DATA object at %d compressed with zstd in a file without the flag", d.offset)
		}
		if n > 1<<24 {
			return nil, false, corruptf("DATA object at %d: %d compressed bytes", d.offset, n)
		}
		b, err := f.read(start, n)
		if err != nil {
			return nil, false, err
		}
		zstdOnce.Do(func() {
			zstdDec, zstdErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecodeAllCapLimit(true),
				zstd.WithDecoderMaxMemory(64<<20), zstd.WithDecoderLowmem(true))
		})
		if zstdErr != nil {
			return nil, false, zstdErr
		}
		out, err := zstdDec.DecodeAll(b, make([]byte, 0, max))
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, corruptf("DATA object at %d: zstd: %v", d.offset, err)
		}
		if len(out) >= max {
			return nil, true, nil
		}
		return out, false, nil
	default:
		return nil, false, unsupportedf(FallbackCompression, "DATA object at %d compressed with flags %#x (XZ or LZ4)", d.offset, d.flags)
	}
}

// findData looks the DATA object with payload want up in the data hash
// table: its offset, 0 when the file has none.
func (f *journalFile) findData(want []byte) (jData, bool, error) {
	hash := siphash24(f.hdr.fileID, want)
	buckets := f.hdr.dataHashSize / 16
	b, err := f.read(f.hdr.dataHashOffset+(hash%buckets)*16, 16)
	if err != nil {
		return jData{}, false, err
	}
	p := binary.LittleEndian.Uint64(b)
	var prev uint64
	for p != 0 {
		if p <= prev {
			return jData{}, false, corruptf("hash chain goes back from %d to %d", prev, p)
		}
		prev = p
		d, err := f.dataObject(p)
		if err != nil {
			return jData{}, false, err
		}
		if d.hash == hash {
			got, over, err := f.payload(d, len(want)+1)
			if err != nil {
				return jData{}, false, err
			}
			if !over && bytes.Equal(got, want) {
				return d, true, nil
			}
		}
		p = d.nextHashOffset
	}
	return jData{}, false, nil
}

// entry reads the ENTRY object at off (its fixed part).
func (f *journalFile) entry(off uint64) (jEntry, uint64, error) {
	_, size, err := f.objectHeader(off, jObjectEntry, jEntryFixedSize)
	if err != nil {
		return jEntry{}, 0, err
	}
	b, err := f.read(off, jEntryFixedSize)
	if err != nil {
		return jEntry{}, 0, err
	}
	le := binary.LittleEndian
	e := jEntry{offset: off, seqnum: le.Uint64(b[16:]), realtime: le.Uint64(b[24:]), monotonic: le.Uint64(b[32:]), xorHash: le.Uint64(b[56:])}
	copy(e.bootID[:], b[40:56])
	if e.seqnum == 0 || e.realtime == 0 || e.realtime >= 1<<62 || e.monotonic >= 1<<62 {
		return jEntry{}, 0, corruptf("entry at %d: seqnum %d, realtime %d, monotonic %d", off, e.seqnum, e.realtime, e.monotonic)
	}
	return e, size, nil
}

// entryItems returns the offsets of the DATA objects of the entry at off.
func (f *journalFile) entryItems(off, size uint64) ([]uint64, error) {
	item := uint64(16)
	if f.hdr.compact() {
		item = 4
	}
	n := (size - jEntryFixedSize) / item
	if (size-jEntryFixedSize)%item != 0 || n == 0 {
		return nil, corruptf("entry at %d: size %d", off, size)
	}
	b, err := f.read(off+jEntryFixedSize, n*item)
	if err != nil {
		return nil, err
	}
	items := make([]uint64, n)
	for i := range items {
		if item == 4 {
			items[i] = uint64(binary.LittleEndian.Uint32(b[i*4:]))
		} else {
			items[i] = binary.LittleEndian.Uint64(b[i*16:])
		}
		if items[i] == 0 {
			return nil, corruptf("entry at %d: item %d is 0", off, i)
		}
	}
	return items, nil
}

// entryArray reads an ENTRY_ARRAY object: its next offset and its items
// (all of its slots; the caller counts the used ones).
func (f *journalFile) entryArray(off uint64) (next uint64, items []uint64, err error) {
	_, size, err := f.objectHeader(off, jObjectEntryArray, jEntryArrayFixed+1)
	if err != nil {
		return 0, nil, err
	}
	item := uint64(8)
	if f.hdr.compact() {
		item = 4
	}
	n := (size - jEntryArrayFixed) / item
	if n == 0 {
		return 0, nil, corruptf("entry array at %d: size %d", off, size)
	}
	b, err := f.read(off, jEntryArrayFixed+n*item)
	if err != nil {
		return 0, nil, err
	}
	next = binary.LittleEndian.Uint64(b[16:])
	items = make([]uint64, n)
	for i := range items {
		if item == 4 {
			items[i] = uint64(binary.LittleEndian.Uint32(b[jEntryArrayFixed+i*4:]))
		} else {
			items[i] = binary.LittleEndian.Uint64(b[jEntryArrayFixed+i*8:])
		}
	}
	return next, items, nil
}

// entryArrayLast reads the next offset, the number of slots and one item of
// an ENTRY_ARRAY object without reading all of it.
func (f *journalFile) entryArrayItem(off uint64, i uint64) (uint64, error) {
	item := uint64(8)
	if f.hdr.compact() {
		item = 4
	}
	b, err := f.read(off+jEntryArrayFixed+i*item, item)
	if err != nil {
		return 0, err
	}
	if item == 4 {
		return uint64(binary.LittleEndian.Uint32(b)), nil
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (f *journalFile) entryArrayHeader(off uint64) (next, slots uint64, err error) {
	_, size, err := f.objectHeader(off, jObjectEntryArray, jEntryArrayFixed+1)
	if err != nil {
		return 0, 0, err
	}
	item := uint64(8)
	if f.hdr.compact() {
		item = 4
	}
	slots = (size - jEntryArrayFixed) / item
	if slots == 0 {
		return 0, 0, corruptf("entry array at %d: size %d", off, size)
	}
	b, err := f.read(off+16, 8)
	if err != nil {
		return 0, 0, err
	}
	return binary.LittleEndian.Uint64(b), slots, nil
}

func idHex(id [16]byte) string { return hex.EncodeToString(id[:]) }

// blockCache keeps a few aligned blocks of one file, read with pread: the
// DATA objects most entries share (_PID, _COMM, _SYSTEMD_UNIT, ...) and
// the objects journald writes next to each other are read once.
type blockCache struct {
	blocks map[int64][]byte
	order  []int64
	buf    []byte
}

const (
	cacheBlock  = 16 << 10
	cacheBlocks = 32
)

func (c *blockCache) init() { c.blocks = make(map[int64][]byte, cacheBlocks) }

func (c *blockCache) block(r io.ReaderAt, start int64) ([]byte, error) {
	if b, ok := c.blocks[start]; ok {
		return b, nil
	}
	var b []byte
	if len(c.order) >= cacheBlocks {
		old := c.order[0]
		c.order = c.order[1:]
		b = c.blocks[old][:cacheBlock]
		delete(c.blocks, old)
	} else {
		b = make([]byte, cacheBlock)
	}
	n, err := r.ReadAt(b, start)
	if err != nil && err != io.EOF {
		return nil, err
	}
	b = b[:n]
	c.blocks[start] = b
	c.order = append(c.order, start)
	return b, nil
}

// read returns n bytes at off (valid until the next read).
func (c *blockCache) read(r io.ReaderAt, off int64, n int) ([]byte, error) {
	start := off - off%cacheBlock
	if off+int64(n) <= start+cacheBlock {
		b, err := c.block(r, start)
		if err != nil {
			return nil, err
		}
		if int64(len(b)) < off-start+int64(n) {
			return nil, corruptf("%d bytes at %d: past the end of the file", n, off)
		}
		return b[off-start : off-start+int64(n)], nil
	}
	// Spans blocks: read it directly.
	if cap(c.buf) < n {
		c.buf = make([]byte, n)
	}
	b := c.buf[:n]
	m, err := r.ReadAt(b, off)
	if m < n {
		if err == nil || err == io.EOF {
			return nil, corruptf("%d bytes at %d: past the end of the file", n, off)
		}
		return nil, err
	}
	return b, nil
}

// siphash24 is SipHash-2-4 of data with key, as systemd's siphash24() (the
// key's two halves little-endian), the hash a keyed-hash journal file uses
// (HEADER_INCOMPATIBLE_KEYED_HASH), keyed by the file's file_id.
func siphash24(key [16]byte, data []byte) uint64 {
	k0 := binary.LittleEndian.Uint64(key[:8])
	k1 := binary.LittleEndian.Uint64(key[8:])
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13)
		v1 ^= v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16)
		v3 ^= v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21)
		v3 ^= v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17)
		v1 ^= v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	n := len(data)
	for len(data) >= 8 {
		m := binary.LittleEndian.Uint64(data)
		v3 ^= m
		round()
		round()
		v0 ^= m
		data = data[8:]
	}
	var last [8]byte
	copy(last[:], data)
	last[7] = byte(n)
	m := binary.LittleEndian.Uint64(last[:])
	v3 ^= m
	round()
	round()
	v0 ^= m
	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}

// journalReaderAt is what the native reader reads an open file through:
// the file itself; a benchmark counts the reads.
var journalReaderAt = func(fd *journalFD) io.ReaderAt { return fd }

// journalFD is a journal file open for the native reader, by x/sys/unix:
// os registers every file it opens with the runtime's poller, which for a
// regular file is two fcntl(2) to set O_NONBLOCK, an epoll_ctl(2) add the
// kernel refuses and two fcntl to clear it again, each file each read
// (every 5 minutes; TestNativeJournalReadSystemCalls). Its reads are
// ordinary pread(2) calls, as os's of a regular file are: a disk's read
// may wait.
type journalFD struct {
	fd   int
	name string
}

func openJournalFD(path string) (*journalFD, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return &journalFD{fd: fd, name: path}, nil
	}
}

// Name is the path the file was opened by.
func (f *journalFD) Name() string { return f.name }

// ReadAt is io.ReaderAt's, as os.File's: len(b) bytes, else an error
// (io.EOF at the end of the file).
func (f *journalFD) ReadAt(b []byte, off int64) (int, error) {
	if off < 0 {
		return 0, &os.PathError{Op: "readat", Path: f.name, Err: errors.New("negative offset")}
	}
	n := 0
	for n < len(b) {
		m, err := unix.Pread(f.fd, b[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "read", Path: f.name, Err: err}
		}
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

// Size is the file's size now (fstat(2)).
func (f *journalFD) Size() (int64, error) {
	var st unix.Stat_t
	for {
		err := unix.Fstat(f.fd, &st)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, &os.PathError{Op: "stat", Path: f.name, Err: err}
		}
		return st.Size, nil
	}
}

// Close closes the file; it is not retried (on Linux the descriptor is
// gone even when close says EINTR).
func (f *journalFD) Close() error { return unix.Close(f.fd) }

// osJournalFile opens path for the native reader.
func osJournalFile(path string) (*journalFile, *journalFD, error) {
	fd, err := openJournalFD(path)
	if err != nil {
		return nil, nil, err
	}
	f, err := openGrowingJournalFile(path, journalReaderAt(fd), fd.Size)
	if err != nil {
		fd.Close()
		return nil, nil, err
	}
	return f, fd, nil
}
