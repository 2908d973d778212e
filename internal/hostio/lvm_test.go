package hostio

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeLVM writes an executable shell script that stands in for lvm.
func fakeLVM(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lvm")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// An lvm that writes more than maxLVMReport bytes (a broken build, a loop
// printing warnings to stdout) is an error, and RunLVM keeps no more than
// the bound: before, the whole output was buffered, in the helper's memory
// and then in its answer to the daemon.
func TestRunLVMBoundsTheReport(t *testing.T) {
	lvm := fakeLVM(t, "head -c "+strconv.Itoa(maxLVMReport+1)+" /dev/zero; exit 0")
	out, err := RunLVM(context.Background(), lvm, time.Minute, "vgs")
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("RunLVM of an lvm writing %d bytes: %d bytes, error %v; want a report-too-long error", maxLVMReport+1, len(out), err)
	}
	if out != nil {
		t.Errorf("RunLVM returned %d bytes with the error; want none", len(out))
	}
}

// An lvm that never stops writing is ended once it passed the bound, not
// read (and waited for) until lvm_timeout: this one goes on after its pipe
// is closed (each head dies of SIGPIPE, the shell loops on). It writes 10
// MB/s at most, so that RunLVM without its bound holds 150 MB at most.
func TestRunLVMEndsAnEndlessReport(t *testing.T) {
	lvm := fakeLVM(t, "while :; do head -c 1048576 /dev/zero; sleep 0.1; done")
	start := time.Now()
	_, err := RunLVM(context.Background(), lvm, 15*time.Second, "vgs")
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("RunLVM of an endless lvm: %v; want a report-too-long error", err)
	}
	if d := time.Since(start); d >= 15*time.Second {
		t.Errorf("RunLVM took %s; want it ended at the bound", d)
	}
}

// What lvm writes to stderr is kept up to a bound: the message names the
// start of it.
func TestRunLVMBoundsStderr(t *testing.T) {
	lvm := fakeLVM(t, "echo '  Volume group \"vg0\" not found' >&2; head -c 10000000 /dev/zero >&2; exit 5")
	_, err := RunLVM(context.Background(), lvm, time.Minute, "vgs")
	if err == nil || !strings.Contains(err.Error(), `Volume group "vg0" not found`) {
		t.Fatalf("RunLVM: %v; want lvm's message", err)
	}
}
