package kmsg

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

var updateKernelCaptures = flag.Bool("update-kernel-captures", false, "rewrite "+kernelCaptures+" from this machine's /dev/kmsg")

// kernelCaptures holds writes to /dev/kmsg and the records this machine's
// kernel gave back for them (TestParseRecordAgainstTheKernel).
const kernelCaptures = "testdata/kernel-devkmsg-captures.txt"

// kernelWrites are written to the real /dev/kmsg; %s is the test's tag.
var kernelWrites = []string{
	"<3>%s plain error",
	"%s no prefix: the default level, facility LOG_USER",
	"<2043>%s the highest facility a record holds (255), level 3",
	"<2048>%s facility 256: (N>>3)&0xff is 0, so LOG_USER, level 0",
	"<4294967299>%s 2^32+3: truncated to 32 bits, level 3, LOG_USER",
	"<>%s no digits: N is 0, level 0, LOG_USER",
	"<6%s an unclosed prefix is text",
	"<14>%s escaped: tab\there, ESC \x1b[0m, DEL \x7f, backslash \\ and \\x41, é \xff, ; and , kept",
	"<14>%s an inner newline\nstays in the record, escaped",
	"<14>%s two trailing newlines, one taken off\n\n",
	"<14>%s ends at the NUL\x00 and not this",
	"<14>%s the last line, no newline",
	"<14>%s the end\n",
}

// The parser against the kernel of this machine: lines written to
// /dev/kmsg (root) come back as records that parse to the level, facility
// and text the kernel's devkmsg_write makes of them, byte for byte as the
// kernel's writer is modelled here. -update-kernel-captures keeps what the
// kernel gave back in kernelCaptures, which TestParseRecordKernelCaptures
// checks on any machine.
func TestParseRecordAgainstTheKernel(t *testing.T) {
	dev, err := Open("/dev/kmsg")
	if err != nil {
		testenv.Skip(t, "cannot open /dev/kmsg: "+err.Error())
	}
	defer dev.Close()
	if _, err := dev.Seek(0, io.SeekEnd); err != nil {
		t.Fatal(err)
	}
	defLevel := defaultMessageLevel(t)
	tag := fmt.Sprintf("kt-diff-%d-%d", os.Getpid(), time.Now().UnixNano())
	for _, w := range kernelWrites {
		// One open per line: printk_devkmsg=ratelimit allows ten lines a
		// 5 s per open file.
		f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
		if err != nil {
			testenv.Skip(t, "cannot write /dev/kmsg: "+err.Error())
		}
		_, err = f.Write([]byte(fmt.Sprintf(w, tag)))
		f.Close()
		if err != nil {
			t.Fatalf("write %q: %v", w, err)
		}
	}
	var caps []kernelCapture
	buf := make([]byte, BufSize)
	for len(caps) < len(kernelWrites) {
		dev.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := dev.Read(buf)
		if errors.Is(err, syscall.EPIPE) {
			continue
		}
		if err != nil {
			t.Fatalf("read after %d of the test's records: %v", len(caps), err)
		}
		if !bytes.Contains(buf[:n], []byte(tag)) {
			continue // another writer's
		}
		caps = append(caps, kernelCapture{wrote: []byte(fmt.Sprintf(kernelWrites[len(caps)], tag)), read: bytes.Clone(buf[:n])})
	}
	var prev uint64
	for i, c := range caps {
		r := checkCapture(t, c, defLevel)
		if i > 0 && r.Seq <= prev {
			t.Errorf("record %q: sequence number %d after %d", c.read, r.Seq, prev)
		}
		prev = r.Seq
	}
	if *updateKernelCaptures {
		var out bytes.Buffer
		var uts syscall.Utsname
		syscall.Uname(&uts)
		rel := make([]byte, 0, len(uts.Release))
		for _, c := range uts.Release {
			if c == 0 {
				break
			}
			rel = append(rel, byte(c))
		}
		fmt.Fprintf(&out, "# Written to and read back from /dev/kmsg on Linux %s (go test ./kmsg -run TestParseRecordAgainstTheKernel -update-kernel-captures, as root).\n", rel)
		fmt.Fprintf(&out, "default_message_loglevel %d\n", defLevel)
		for _, c := range caps {
			fmt.Fprintf(&out, "wrote %s\nread %s\n", strconv.Quote(string(c.wrote)), strconv.Quote(string(c.read)))
		}
		if err := os.WriteFile(kernelCaptures, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// defaultMessageLevel is kernel.printk's second field: the level of a line
// written to /dev/kmsg without a "<N>" prefix.
func defaultMessageLevel(t *testing.T) uint8 {
	b, err := os.ReadFile("/proc/sys/kernel/printk")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		t.Fatalf("/proc/sys/kernel/printk: %q", b)
	}
	v, err := strconv.ParseUint(f[1], 10, 8)
	if err != nil {
		t.Fatal(err)
	}
	return uint8(v)
}

// What a real kernel gave back for writes to /dev/kmsg, parsed on any
// machine.
func TestParseRecordKernelCaptures(t *testing.T) {
	f, err := os.Open(kernelCaptures)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var defLevel uint8
	var wrote []byte
	n := 0
	for sc.Scan() {
		line := sc.Text()
		key, val, _ := strings.Cut(line, " ")
		switch key {
		case "#":
		case "default_message_loglevel":
			v, err := strconv.ParseUint(val, 10, 8)
			if err != nil {
				t.Fatal(err)
			}
			defLevel = uint8(v)
		case "wrote", "read":
			s, err := strconv.Unquote(val)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if key == "wrote" {
				wrote = []byte(s)
				continue
			}
			checkCapture(t, kernelCapture{wrote: wrote, read: []byte(s)}, defLevel)
			n++
		default:
			t.Fatalf("%s: unknown line %q", kernelCaptures, line)
		}
	}
	if n != len(kernelWrites) {
		t.Errorf("%d captures, want one per kernelWrites line (%d)", n, len(kernelWrites))
	}
}
