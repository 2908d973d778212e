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

// RunLVM runs `lvm <command> --reportformat json ... args` within timeout
// and returns its standard output. An lvm that exits non-zero after writing
// its JSON report returns the report and an error saying so.
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
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second // a child of lvm holding the pipes cannot keep the check waiting
	err := cmd.Run()
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
