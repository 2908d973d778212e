package hostio

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// LVMSystemDir holds lvm.conf (LVM's default LVM_SYSTEM_DIR); a variable
// for tests.
var LVMSystemDir = "/etc/lvm"

// LVMReportArgs are the arguments of the LVM report commands the disk
// check runs: volume groups with their extents, and logical volumes with
// their thin pool use. The privileged helper runs no others.
var LVMReportArgs = map[string][]string{
	"vgs": []string{"-o", "vg_name,vg_size,vg_free,vg_extent_count,vg_free_count"},
	"lvs": []string{"-o", "vg_name,lv_name,lv_attr,segtype,lv_size,data_percent,metadata_percent"},
}

// LVMArgsAllowed reports whether args are those of LVMReportArgs[command].
func LVMArgsAllowed(command string, args []string) bool {
	want, ok := LVMReportArgs[command]
	return ok && slices.Equal(want, args)
}

// maxLVMReport bounds what RunLVM reads of lvm's standard output: a report
// is a few hundred bytes per volume group or logical volume (10,000
// logical volumes are about 2.5 MB), and the helper's answer, which carries
// it base64-encoded, must stay under its own bound (privileged's
// maxResponse, 64 MiB). maxLVMStderr bounds what is kept of its standard
// error (the message names the first 300 bytes).
const (
	maxLVMReport = 16 << 20
	maxLVMStderr = 4 << 10
)

// RunLVM runs `lvm <command> --reportformat json ... args` within timeout
// and returns its standard output. An lvm that exits non-zero after writing
// its JSON report returns the report and an error saying so. An output
// longer than maxLVMReport is an error, and lvm is ended there: a report
// cut short is not a report.
func RunLVM(ctx context.Context, lvm string, timeout time.Duration, command string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// --nolocking: a report needs no lock, and the daemon's sandbox keeps
	// /run (LVM's lock directory) read-only.
	full := append([]string{command, "--reportformat", "json", "--units", "b", "--nosuffix", "--nolocking"}, args...)
	cmd := exec.CommandContext(ctx, lvm, full...)
	cmd.Env = []string{"LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if _, err := os.Stat(LVMSystemDir + "/lvm.conf"); errors.Is(err, fs.ErrNotExist) {
		// No configuration to honour: without this, lvm tries to create
		// its system directory, which the sandbox's read-only /etc refuses
		// ("Failed to create LVM2 system dir"), and reports nothing.
		cmd.Env = append(cmd.Env, "LVM_SYSTEM_DIR=")
	}
	// Past the bound lvm is ended (ctx's cancel: exec kills it), not
	// waited for: one that goes on after its pipe closed (a shell that
	// ignores SIGPIPE, a child writing on) would hold the check until
	// timeout.
	stdout := cappedBuffer{max: maxLVMReport, fail: true, onOver: cancel}
	stderr := cappedBuffer{max: maxLVMStderr}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second // a child of lvm holding the pipes cannot keep the check waiting
	err := cmd.Run()
	if stdout.over {
		return nil, fmt.Errorf("%s %s: a report longer than %d bytes, the most read", lvm, command, maxLVMReport)
	}
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("%s %s: no answer within %s", lvm, command, timeout)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		if msg != "" {
			msg = ": " + msg
		}
		if out := bytes.TrimSpace(stdout.Bytes()); len(out) > 0 && json.Valid(out) {
			// A report of what lvm could read: used, and the exit noted.
			return out, fmt.Errorf("%s %s: %v (its report is used)%s", lvm, command, err, msg)
		}
		return nil, fmt.Errorf("%s %s: %v%s", lvm, command, err, msg)
	}
	return stdout.Bytes(), nil
}

// cappedBuffer keeps the first max bytes written to it. Past them, a
// failing one (fail) calls onOver once and refuses the write (exec then
// closes the pipe); another drops the rest and reads on.
//
// The buffer is a field, not embedded: an embedded bytes.Buffer's ReadFrom
// would be what io.Copy (exec's) calls, past Write and its bound.
type cappedBuffer struct {
	buf    bytes.Buffer
	max    int
	fail   bool
	onOver func()
	over   bool // more than max bytes were written
}

var errCapped = errors.New("output over its bound")

func (b *cappedBuffer) Write(p []byte) (int, error) {
	room := b.max - b.buf.Len()
	if len(p) <= room {
		return b.buf.Write(p)
	}
	if !b.over && b.onOver != nil {
		b.onOver()
	}
	b.over = true
	if room > 0 {
		b.buf.Write(p[:room])
	}
	if b.fail {
		return 0, errCapped
	}
	return len(p), nil
}

func (b *cappedBuffer) Bytes() []byte  { return b.buf.Bytes() }
func (b *cappedBuffer) String() string { return b.buf.String() }
