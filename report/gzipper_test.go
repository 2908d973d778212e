package report

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// page is a metrics page of n series in families of 8, series i showing
// values[i] (0 where values is short).
func page(n int, values map[int]int) []byte {
	var b strings.Builder
	for i := range n {
		if i%8 == 0 {
			fmt.Fprintf(&b, "# HELP fam_%d A family.\n# TYPE fam_%d gauge\n", i/8, i/8)
		}
		fmt.Fprintf(&b, "fam_%d{series=\"%d\",node=\"worker-%d\"} %d\n", i/8, i, i%3, values[i])
	}
	return []byte(b.String())
}

// gunzip decodes body as exactly one gzip member (compress/gzip checks the
// CRC-32 and the length) and, where GNU gzip is installed, with it too: a
// decoder of its own.
func gunzip(t *testing.T, body []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	got, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("compress/gzip: %v", err)
	}
	if rest, _ := io.ReadAll(zr); len(rest) != 0 {
		t.Fatalf("%d bytes after the member", len(rest))
	}
	if path, err := exec.LookPath("gzip"); err == nil && os.Getenv(testenv.NoExecEnv) == "" {
		cmd := exec.Command(path, "-dc")
		cmd.Stdin = bytes.NewReader(body)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("gzip -dc: %v", err)
		}
		if !bytes.Equal(out, got) {
			t.Fatalf("gzip -dc and compress/gzip disagree")
		}
	}
	return got
}

// Each response is one gzip member with the page's text, across scrapes
// where parts change every time, once, or never; a part whose text is new
// scrape after scrape is stored as it is, and compressed again once it
// stays the same.
func TestGzipperResponses(t *testing.T) {
	g := newGzipper()
	values := map[int]int{}
	const hot = 40 // the series that changes every scrape
	for scrape := range 8 {
		if scrape < 5 {
			values[hot] = 1000000 + scrape
		}
		if scrape == 3 {
			values[200] = 7 // changes once
		}
		text := page(300, values)
		var b bytes.Buffer
		g.gzip(&b, text)
		if got := gunzip(t, b.Bytes()); !bytes.Equal(got, text) {
			t.Fatalf("scrape %d: decoded %d bytes, not the %d of the page", scrape, len(got), len(text))
		}
		line := fmt.Sprintf("fam_5{series=\"40\",node=\"worker-1\"} %d\n", values[hot])
		raw := bytes.Contains(b.Bytes(), []byte(line))
		// New in scrapes 0-4: stored from the second time in a row (1
		// to 4), and still in 5 (the same text as in 4); the same text
		// again in 6: compressed again.
		if want := scrape >= 1 && scrape <= 5; raw != want {
			t.Errorf("scrape %d: the changing line stored as it is: %v, want %v", scrape, raw, want)
		}
		if len(b.Bytes()) >= len(text)/2 {
			t.Errorf("scrape %d: %d bytes for a page of %d", scrape, b.Len(), len(text))
		}
	}
}

// A scrape compresses the chunks whose text changed, not the page.
func TestGzipperCompressesOnlyWhatChanged(t *testing.T) {
	g := newGzipper()
	values := map[int]int{}
	var b bytes.Buffer
	text := page(1000, values)
	g.gzip(&b, text)
	if g.compressed != len(text) {
		t.Fatalf("first scrape compressed %d bytes of %d", g.compressed, len(text))
	}
	before := g.compressed
	g.gzip(&b, text)
	if g.compressed != before || g.storedBytes != 0 {
		t.Fatalf("the same page again compressed %d bytes, stored %d", g.compressed-before, g.storedBytes)
	}
	values[500] = 123456789 // a longer value: the text after it moves
	g.gzip(&b, page(1000, values))
	changed := g.compressed - before
	// One chunk: at most maxChunkLines lines of ~40 bytes.
	if changed == 0 || changed > maxChunkLines*45 {
		t.Errorf("one changed value compressed %d bytes of a %d-byte page", changed, len(text))
	}
	if len(g.chunks) > len(text)/(minChunkLines*30) {
		t.Errorf("%d chunks kept", len(g.chunks))
	}
}

// Where the page is cut depends on its series, not their values.
func TestGzipperCutsBySeries(t *testing.T) {
	g := newGzipper()
	cuts := func(text []byte) (lines []int) {
		for len(text) > 0 {
			n, _ := g.cut(text)
			lines = append(lines, bytes.Count(text[:n], []byte("\n")))
			text = text[n:]
		}
		return lines
	}
	a := cuts(page(500, nil))
	values := map[int]int{}
	for i := range 500 {
		values[i] = i * i * 1000
	}
	b := cuts(page(500, values))
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("cut into %v, and with other values into %v", a, b)
	}
	if len(a) < 500/maxChunkLines+1 || len(a) > 500/minChunkLines {
		t.Errorf("%d chunks of %v lines", len(a), a)
	}
	for _, n := range a {
		if n > maxChunkLines {
			t.Errorf("a chunk of %d lines", n)
		}
	}
}

// Stored blocks hold at most 65,535 bytes each.
func TestStoredBlocks(t *testing.T) {
	text := bytes.Repeat([]byte("0123456789abcdef"), 10000) // 160,000 bytes: three blocks
	var b bytes.Buffer
	b.Write(gzipHeader[:])
	b.Write(stored(text))
	b.Write(finalBlock[:])
	g := newGzipper()
	var whole bytes.Buffer
	g.gzip(&whole, text) // for its trailer
	b.Write(whole.Bytes()[whole.Len()-8:])
	if got := gunzip(t, b.Bytes()); !bytes.Equal(got, text) {
		t.Fatalf("decoded %d bytes of %d", len(got), len(text))
	}
}

// Any sequence of pages, one gzipper: each response decodes to its page.
func FuzzGzipper(f *testing.F) {
	f.Add([]byte("a 1\nb 2\n\x00a 2\nb 2\n\x00a 3\nb 2\n\x00a 3\nb 2\n\x00a 3\nb 2"))
	f.Add(page(100, nil))
	f.Add([]byte("# HELP x\n\x00\x00no newline at the end"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := newGzipper()
		for text := range bytes.SplitSeq(data, []byte{0}) {
			var b bytes.Buffer
			g.gzip(&b, text)
			zr, err := gzip.NewReader(&b)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(zr)
			if err != nil || !bytes.Equal(got, text) {
				t.Fatalf("%q: decoded %q, %v", text, got, err)
			}
		}
	})
}

// BenchmarkGzipper is a gzip response of a page like the daemon's (~50 KB,
// 1,200 series) in which one series changed since the last.
func BenchmarkGzipper(b *testing.B) {
	g := newGzipper()
	var texts [][]byte
	for i := range 64 {
		texts = append(texts, page(1200, map[int]int{100: i}))
	}
	var buf bytes.Buffer
	for i := 0; b.Loop(); i++ {
		buf.Reset()
		g.gzip(&buf, texts[i%len(texts)])
	}
	b.ReportMetric(float64(len(texts[0])), "bytes/page")
}
