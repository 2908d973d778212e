package vmhost

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// NVMeDrive is one emulated NVMe controller with one namespace.
type NVMeDrive struct {
	Image  string // raw disk image (sparse)
	Serial string
	// CriticalWarning is QEMU's smart_critical_warning property: the
	// SMART critical-warning bits the controller reports from power-on.
	CriticalWarning uint8
}

// Boot is one run of the guest.
type Boot struct {
	Kernel *Kernel
	Initrd string
	NVMe   []NVMeDrive
	// Append is added to the kernel command line (vmtest.* parameters
	// for the guest's /init).
	Append  string
	MemMB   int
	SMP     int
	Timeout time.Duration
	// Echo, when set, gets every console line as it arrives.
	Echo io.Writer
	// QMP, when set, is the path of a QMP socket QEMU listens on; the
	// guest's "VMTEST QOM-SET" lines are then carried out over it (the
	// NVMe drives are the devices nvme0, nvme1, ...).
	QMP string
}

// Args is the QEMU command line: TCG (this machine kind's KVM cannot run a
// stock kernel), no firmware devices, the serial console on stdio, and
// no reboot: the guest powering off or panicking ends QEMU.
func (b Boot) Args() []string {
	a := []string{"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
		"-accel", "tcg", "-cpu", "max",
		"-m", strconv.Itoa(b.MemMB), "-smp", strconv.Itoa(b.SMP), "-no-reboot",
		"-kernel", b.Kernel.Image, "-initrd", b.Initrd,
		"-append", strings.TrimSpace("console=ttyS0 panic=-1 quiet " + b.Append)}
	if b.QMP != "" {
		a = append(a, "-qmp", "unix:"+b.QMP+",server=on,wait=off")
	}
	for i, d := range b.NVMe {
		a = append(a, "-drive", fmt.Sprintf("file=%s,if=none,id=nv%d,format=raw,cache=unsafe", d.Image, i),
			"-device", fmt.Sprintf("nvme,id=nvme%d,serial=%s,drive=nv%d,smart_critical_warning=%d", i, d.Serial, i, d.CriticalWarning))
	}
	return a
}

// Line is one line of the serial console.
type Line struct {
	At   time.Duration // since QEMU started
	Text string
}

// Result is what one guest run printed.
type Result struct {
	Lines []Line
	// Results are the guest's "VMTEST RESULT" lines by scenario name.
	Results map[string]ScenarioResult
	// Done is set when the guest printed "VMTEST DONE" (it ran to the end).
	Done    bool
	Elapsed time.Duration
	Err     error
}

// ScenarioResult is one "VMTEST RESULT <name> PASS|FAIL <ms>ms <detail>".
type ScenarioResult struct {
	Pass     bool
	Duration time.Duration
	Detail   string
}

// ResultPrefix and DonePrefix start the guest's protocol lines.
const (
	ResultPrefix = "VMTEST RESULT "
	DonePrefix   = "VMTEST DONE"
)

// ParseResult parses a "VMTEST RESULT" line (the prefix included).
func ParseResult(line string) (name string, r ScenarioResult, ok bool) {
	rest, found := strings.CutPrefix(line, ResultPrefix)
	if !found {
		return "", r, false
	}
	f := strings.SplitN(rest, " ", 4)
	if len(f) < 3 || (f[1] != "PASS" && f[1] != "FAIL") {
		return "", r, false
	}
	ms, err := strconv.Atoi(strings.TrimSuffix(f[2], "ms"))
	if err != nil {
		return "", r, false
	}
	r = ScenarioResult{Pass: f[1] == "PASS", Duration: time.Duration(ms) * time.Millisecond}
	if len(f) == 4 {
		r.Detail = f[3]
	}
	return f[0], r, true
}

// Run boots the guest and reads the console until QEMU exits (the guest
// powers off when it is done) or the timeout.
func (b Boot) Run() Result {
	if b.MemMB == 0 {
		b.MemMB = 1024
	}
	if b.SMP == 0 {
		b.SMP = 2
	}
	if b.Timeout == 0 {
		b.Timeout = 2 * time.Minute
	}
	r := Result{Results: map[string]ScenarioResult{}}
	ctx, cancel := context.WithTimeout(context.Background(), b.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", b.Args()...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.Err = err
		return r
	}
	cmd.Stderr = cmd.Stdout
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		r.Err = err
		return r
	}
	br := bufio.NewReaderSize(stdout, 64*1024)
	for {
		s, err := br.ReadString('\n')
		if s != "" {
			s = strings.TrimRight(s, "\r\n")
			l := Line{At: time.Since(t0), Text: s}
			r.Lines = append(r.Lines, l)
			if b.Echo != nil {
				fmt.Fprintf(b.Echo, "[%6.2fs] %s\n", l.At.Seconds(), s)
			}
			if name, sr, ok := ParseResult(s); ok {
				r.Results[name] = sr
			}
			if strings.HasPrefix(s, DonePrefix) {
				r.Done = true
			}
			if dev, prop, v, ok := ParseQOMSet(s); ok {
				msg := "ok"
				if b.QMP == "" {
					msg = "no QMP socket in this boot (Boot.QMP)"
				} else if err := QOMSet(b.QMP, dev, prop, v); err != nil {
					msg = err.Error()
				}
				h := Line{At: time.Since(t0), Text: fmt.Sprintf("%sqom-set %s %s %d: %s", HostPrefix, dev, prop, v, msg)}
				r.Lines = append(r.Lines, h)
				if b.Echo != nil {
					fmt.Fprintf(b.Echo, "[%6.2fs] %s\n", h.At.Seconds(), h.Text)
				}
			}
		}
		if err != nil {
			break
		}
	}
	r.Err = cmd.Wait()
	r.Elapsed = time.Since(t0)
	if ctx.Err() != nil {
		r.Err = fmt.Errorf("qemu did not finish within %v", b.Timeout)
	}
	return r
}

// Tail returns the last n console lines whose text does not start with
// one of the skip prefixes.
func (r Result) Tail(n int, skip ...string) string {
	var keep []string
	for _, l := range r.Lines {
		if !hasAnyPrefix(l.Text, skip) {
			keep = append(keep, fmt.Sprintf("[%6.2fs] %s", l.At.Seconds(), l.Text))
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return strings.Join(keep, "\n")
}

// Prefixed returns the text after prefix of every line that has it.
func (r Result) Prefixed(prefix string) string {
	var out []string
	for _, l := range r.Lines {
		if s, ok := strings.CutPrefix(l.Text, prefix); ok {
			out = append(out, s)
		}
	}
	return strings.Join(out, "\n")
}

func hasAnyPrefix(s string, ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// SparseImage creates a sparse raw disk image of size bytes.
func SparseImage(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// BuildStatic builds a Go package of this module as a static binary
// (CGO_ENABLED=0, stripped) to out; dir is the module root.
func BuildStatic(dir, pkg, out string, ldflags string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", strings.TrimSpace("-s -w "+ldflags), "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
