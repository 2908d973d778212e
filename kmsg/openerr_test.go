package kmsg

import (
	"bytes"
	"context"
	"errors"
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
// /dev/kmsg, a reader's too: the VM tier's devkmsg_off) names the setting,
// in the reader's log line and in the kernel conditions' Unknown message,
// and errors.Is still finds the EPERM. With the setting at ratelimit or on
// (an EPERM of kernel.dmesg_restrict), without procfs, or for another
// error, the error is as it was.
func TestOpenRefusedByPrintkDevkmsgIsSaid(t *testing.T) {
	eperm := &os.PathError{Op: "open", Path: "/dev/kmsg", Err: syscall.EPERM}
	for _, tc := range []struct {
		name, setting string
		err           error
		said          bool
	}{
		{"off", "off\n", eperm, true},
		{"ratelimit", "ratelimit\n", eperm, false},
		{"on", "on\n", eperm, false},
		{"no procfs", "", eperm, false},
		{"other error", "off\n", &os.PathError{Op: "open", Path: "/dev/kmsg", Err: syscall.ENOENT}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := ""
			if tc.setting != "" {
				proc = t.TempDir()
				os.MkdirAll(filepath.Join(proc, "sys/kernel"), 0o755)
				if err := os.WriteFile(filepath.Join(proc, printkDevkmsgPath), []byte(tc.setting), 0o644); err != nil {
					t.Fatal(err)
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
				const said = "kernel.printk_devkmsg is off, and the kernel then refuses every open of /dev/kmsg"
				c, _ := store.Get("ReadonlyFilesystem")
				if c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed || !strings.HasPrefix(c.Message, "cannot read the kernel log: "+tc.err.Error()) {
					t.Fatalf("ReadonlyFilesystem = %+v, want Unknown CheckFailed with the open's error", c)
				}
				if got := strings.Contains(c.Message, said); got != tc.said {
					t.Errorf("the condition's message %q names printk_devkmsg: %v, want %v", c.Message, got, tc.said)
				}
				if got := strings.Contains(logBuf.String(), said); got != tc.said {
					t.Errorf("the reader's log names printk_devkmsg: %v, want %v:\n%s", got, tc.said, logBuf.String())
				}
			})
			if got := explainOpen(tc.err, proc); !errors.Is(got, tc.err.(*os.PathError).Err) {
				t.Errorf("explainOpen(%v) = %v: errors.Is no longer finds the errno", tc.err, got)
			}
		})
	}
}
