package report

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"hash/crc32"
	"hash/maphash"
	"sync"
)

// gzipper makes gzip responses of the metrics page without compressing
// again what did not change. Between two scrapes most of the page is the
// same text (the conditions, the problem metrics, the checks that did not
// run), and compressing all of it was most of a gzip scrape's CPU.
//
// The page is cut into chunks of lines, each made into deflate blocks of its
// own, none of them final, ending on a byte boundary (compressed with a sync
// flush, or stored): such chunks laid end to end, then a final empty block,
// are one deflate stream, and with gzip's header and trailer (the CRC-32 and
// length of the whole text) one gzip member (RFC 1951, 1952), as any client
// reads it. A chunk's blocks are kept by the hash of its text as long as
// each scrape uses them.
//
// Where the page is cut depends only on which series its lines are (the
// text before a sample's value), never on values, so a changed value
// changes the text of one chunk and the chunks around it are found again: a
// line starts a chunk when the chunk before has at least minChunkLines lines
// and the hash of the line's series falls on one in chunkEvery, or the
// chunk before has maxChunkLines. A chunk is known from scrape to scrape by
// its first line's series (its slot). Text that changes every scrape (the
// go_* and process_* families, the durations of a check that runs more
// often than the page is scraped) would be compressed every scrape for one
// use: a chunk whose slot's text is new twice in a row is stored, not
// compressed, and compressed once its text stays the same for a scrape.
type gzipper struct {
	mu     sync.Mutex
	seed   maphash.Seed
	scrape uint64
	chunks map[uint64]*zchunk // by the hash of their text
	// slots: by the hash of its first line's series, the last scrape in
	// which a chunk's text was new.
	slots map[uint64]slot
	// compressed and storedBytes count the bytes of text compressed and
	// stored, for tests.
	compressed, storedBytes int
}

type zchunk struct {
	text   []byte // a copy: a hash that matches is checked against it
	blocks []byte
	stored bool
	scrape uint64 // the last scrape that used it
}

type slot struct{ seen, changed uint64 }

const (
	minChunkLines = 4
	chunkEvery    = 16
	maxChunkLines = 128
)

// gzipHeader is a gzip member's header as compress/gzip writes it at the
// fastest level: no name, no time, XFL 4, OS unknown.
var gzipHeader = [10]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255}

// finalBlock is an empty deflate block, marked final, with fixed codes: the
// bits 1 (final), 01 (fixed codes) and the 7 zero bits of end of block.
var finalBlock = [2]byte{0x03, 0x00}

func newGzipper() gzipper {
	return gzipper{seed: maphash.MakeSeed(), chunks: map[uint64]*zchunk{}, slots: map[uint64]slot{}}
}

// gzip appends text to dst as one gzip member.
func (g *gzipper) gzip(dst *bytes.Buffer, text []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.scrape++
	dst.Write(gzipHeader[:])
	for rest := text; len(rest) > 0; {
		n, slot := g.cut(rest)
		dst.Write(g.blocks(rest[:n], slot))
		rest = rest[n:]
	}
	dst.Write(finalBlock[:])
	var trailer [8]byte
	binary.LittleEndian.PutUint32(trailer[:4], crc32.ChecksumIEEE(text))
	binary.LittleEndian.PutUint32(trailer[4:], uint32(len(text)))
	dst.Write(trailer[:])
	for h, c := range g.chunks {
		if c.scrape != g.scrape {
			delete(g.chunks, h)
		}
	}
	for h, s := range g.slots {
		if s.seen != g.scrape {
			delete(g.slots, h)
		}
	}
}

// cut is the length of text's first chunk and its slot.
func (g *gzipper) cut(text []byte) (n int, slot uint64) {
	lines := 0
	for i := 0; i < len(text); lines++ {
		if lines >= maxChunkLines {
			return i, slot
		}
		end := len(text)
		if j := bytes.IndexByte(text[i:], '\n'); j >= 0 {
			end = i + j + 1
		}
		h := maphash.Bytes(g.seed, series(text[i:end]))
		if lines == 0 {
			slot = h
		} else if lines >= minChunkLines && h%chunkEvery == 0 {
			return i, slot
		}
		i = end
	}
	return len(text), slot
}

// series is what names a line of the text format whatever its value: a
// comment whole, a sample up to its last space (before the value; a
// timestamp after it would make the value part of it, which only cuts the
// page elsewhere).
func series(line []byte) []byte {
	if len(line) > 0 && line[0] == '#' {
		return line
	}
	if i := bytes.LastIndexByte(bytes.TrimRight(line, "\n"), ' '); i >= 0 {
		return line[:i]
	}
	return line
}

// blocks is chunk's deflate blocks, kept or made now.
func (g *gzipper) blocks(chunk []byte, slotKey uint64) []byte {
	h := maphash.Bytes(g.seed, chunk)
	s := g.slots[slotKey]
	c := g.chunks[h]
	switch {
	case c == nil || !bytes.Equal(c.text, chunk):
		// New text: stored if its slot's text was new in the scrape
		// before too.
		c = &zchunk{text: bytes.Clone(chunk), stored: s.changed != 0 && s.changed == s.seen && s.seen == g.scrape-1}
		if c.stored {
			c.blocks = stored(chunk)
			g.storedBytes += len(chunk)
		} else {
			c.blocks = compress(chunk)
			g.compressed += len(chunk)
		}
		g.chunks[h] = c
		s.changed = g.scrape
	case c.stored && s.changed < g.scrape-1:
		// The same text as the scrape before, and the one before it.
		c.blocks, c.stored = compress(chunk), false
		g.compressed += len(chunk)
	}
	s.seen = g.scrape
	g.slots[slotKey] = s
	c.scrape = g.scrape
	return c.blocks
}

// compress is text as deflate blocks at the fastest level, ending in a sync
// flush.
func compress(text []byte) []byte {
	var b bytes.Buffer
	fw, _ := flateWriters.Get().(*flate.Writer)
	if fw == nil {
		fw, _ = flate.NewWriter(&b, flate.BestSpeed)
	} else {
		fw.Reset(&b)
	}
	fw.Write(text)
	fw.Flush() // a sync flush: no final block, ends on a byte boundary
	flateWriters.Put(fw)
	return b.Bytes()
}

// stored is text as stored deflate blocks (up to 65,535 bytes each: a byte
// of header bits, none final, then the length and its complement).
func stored(text []byte) []byte {
	b := make([]byte, 0, len(text)+5*(len(text)/0xffff+1))
	for len(text) > 0 {
		n := min(len(text), 0xffff)
		b = append(b, 0)
		b = binary.LittleEndian.AppendUint16(b, uint16(n))
		b = binary.LittleEndian.AppendUint16(b, ^uint16(n))
		b = append(b, text[:n]...)
		text = text[n:]
	}
	return b
}

// flateWriters are reused (a compressor at the fastest level is ~0.5 MB of
// state to allocate; in a pool, the garbage collector may take it back
// between scrapes).
var flateWriters sync.Pool
