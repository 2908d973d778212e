package kmsg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// An open of the kernel log refused with EPERM while the host's
// kernel.printk_devkmsg is off (the kernel then refuses every open of
// /dev/kmsg, a reader's too: the VM tier's devkmsg_off), or while
// kernel.dmesg_restrict is 1 (the kernel then lets only a reader with
// CAP_SYSLOG open it), names the setting and its fix, in the reader's log
// line and in the kernel conditions' Unknown message, and errors.Is still
// finds the EPERM. printk_devkmsg=off is named first, as the kernel checks
// it first. With neither setting (an EPERM of a device cgroup or a seccomp
// filter), without procfs, or for another error, the error is as it was.
func TestOpenRefusedByPrintkDevkmsgIsSaid(t *testing.T) {
	const (
		devkmsgOff = "kernel.printk_devkmsg is off, and the kernel then refuses every open of /dev/kmsg"
		restricted = "kernel.dmesg_restrict is 1, and the kernel then lets only a process with CAP_SYSLOG (in the host's user namespace) open /dev/kmsg for reading; open it with CAP_SYSLOG"
	)
	eperm := &os.PathError{Op: "open", Path: "/dev/kmsg", Err: syscall.EPERM}
	for _, tc := range []struct {
		name, setting, restrict string
		err                     error
		said                    string
	}{
		{"off", "off\n", "0\n", eperm, devkmsgOff},
		{"off and restricted", "off\n", "1\n", eperm, devkmsgOff},
		{"ratelimit", "ratelimit\n", "0\n", eperm, ""},
		{"on", "on\n", "0\n", eperm, ""},
		{"ratelimit and restricted", "ratelimit\n", "1\n", eperm, restricted},
		{"on and restricted", "on\n", "1\n", eperm, restricted},
		{"restricted, no printk_devkmsg", "", "1\n", eperm, restricted},
		{"restricted, the helper's refusal", "ratelimit\n", "1\n", fmt.Errorf("privileged helper: %w", eperm), restricted},
		{"no procfs", "", "", eperm, ""},
		{"other error", "off\n", "1\n", &os.PathError{Op: "open", Path: "/dev/kmsg", Err: syscall.ENOENT}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := ""
			if tc.setting != "" || tc.restrict != "" {
				proc = t.TempDir()
				os.MkdirAll(filepath.Join(proc, "sys/kernel"), 0o755)
				for name, v := range map[string]string{printkDevkmsgPath: tc.setting, dmesgRestrictPath: tc.restrict} {
					if v == "" {
						continue
					}
					if err := os.WriteFile(filepath.Join(proc, name), []byte(v), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			synctest.Test(t, func(t *testing.T) {
				store := report.NewStore("b")
				o := opts(t, store)
				o.Proc = proc
				mon := NewMonitor(o)
				var logBuf bytes.Buffer
				rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(&logBuf, nil)), ReadTimeout: 10 * time.Second,
					Open: func(context.Context, string) (Device, error) { return nil, tc.err }}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				rd.Run(ctx)
				c, _ := store.Get("ReadonlyFilesystem")
				if c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed || !strings.HasPrefix(c.Message, "cannot read the kernel log: "+tc.err.Error()) {
					t.Fatalf("ReadonlyFilesystem = %+v, want Unknown CheckFailed with the open's error", c)
				}
				for _, said := range []string{devkmsgOff, restricted} {
					want := said == tc.said
					if got := strings.Contains(c.Message, said); got != want {
						t.Errorf("the condition's message %q has %q: %v, want %v", c.Message, said, got, want)
					}
					if got := strings.Contains(logBuf.String(), said); got != want {
						t.Errorf("the reader's log has %q: %v, want %v:\n%s", said, got, want, logBuf.String())
					}
				}
			})
			var pe *os.PathError
			errors.As(tc.err, &pe)
			if got := explainOpen(tc.err, proc); !errors.Is(got, pe.Err) {
				t.Errorf("explainOpen(%v) = %v: errors.Is no longer finds the errno", tc.err, got)
			}
		})
	}
}
