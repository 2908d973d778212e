package checks

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("ClockNotSynchronized", newClockCheck) }

// From the kernel's uapi/linux/timex.h; x/sys/unix does not define them.
const (
	timeError = 5      // TIME_ERROR: clock not synchronized
	staUnsync = 0x0040 // STA_UNSYNC: clock unsynchronized
)

// clockCheck reads the kernel's NTP state with adjtimex(2) (modes 0: read
// only). The kernel sets STA_UNSYNC until an NTP client (chrony,
// systemd-timesyncd, ntpd) disciplines the clock, and again when the client
// stops updating it long enough for the maximum error to pass 16 s.
type clockCheck struct {
	sys    Sys
	maxErr time.Duration
}

func newClockCheck(env *Env) (Check, error) {
	return &clockCheck{sys: env.Sys, maxErr: env.Config.Checks.ClockNotSynchronized.MaxError.Duration}, nil
}

func (c *clockCheck) Probe(ctx context.Context) (Result, error) {
	var tx unix.Timex
	state, err := c.sys.Adjtimex(&tx)
	if err != nil {
		return Result{}, fmt.Errorf("adjtimex: %w", err)
	}
	est := time.Duration(tx.Esterror) * time.Microsecond
	max := time.Duration(tx.Maxerror) * time.Microsecond
	if state == timeError || tx.Status&staUnsync != 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonClockUnsynchronized,
			Message: fmt.Sprintf("the kernel reports the clock as not synchronized (adjtimex state %d, status %#x, maximum error %s): is an NTP client running and reaching its servers?", state, tx.Status, max)}, nil
	}
	if est > c.maxErr {
		return Result{Status: report.StatusTrue, Reason: report.ReasonClockErrorTooLarge,
			Message: fmt.Sprintf("estimated clock error %s is above the limit of %s", est, c.maxErr)}, nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonClockSynchronized,
		Message: fmt.Sprintf("clock synchronized, estimated error %s", est)}, nil
}
