package checks

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The clock checks' and the boot grace's reads of the kernel's clock
// (every minute: adjtimex(2), clock_gettime(CLOCK_BOOTTIME)) are raw
// system calls: none enters the runtime's system-call state (x/sys's
// Adjtimex and ClockGettime did, 3.6 a minute in the idle daemon, README,
// Cost).
func TestClockReadsMakeNoOrdinarySyscall(t *testing.T) {
	reads := map[string]func() error{
		"SinceBoot": func() error { _, err := RealSys().SinceBoot(); return err },
		"Adjtimex":  func() error { var tx unix.Timex; _, err := RealSys().Adjtimex(&tx); return err },
	}
	for name, read := range reads {
		var err error
		n := testenv.ThreadOrdinarySyscalls(t, func() { err = read() })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n != 0 {
			t.Errorf("%s: %d ordinary system calls, want none (raw)", name, n)
		}
	}
	if d, err := RealSys().SinceBoot(); err != nil || d <= 0 {
		t.Errorf("SinceBoot = %v, %v: want the time since boot", d, err)
	}
	var tx unix.Timex
	if st, err := RealSys().Adjtimex(&tx); err != nil || st < unix.TIME_OK || st > unix.TIME_ERROR {
		t.Errorf("Adjtimex = %d, %v: want a clock state", st, err)
	}
}
