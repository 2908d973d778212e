package checks

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("ClockNotSynchronized", newClockCheck) }

// clockBootGrace is how long after the boot an unsynchronized clock is
// not yet a problem (see clockCheck).
const clockBootGrace = 10 * time.Minute

// From the kernel's uapi/linux/timex.h and kernel/time/ntp.c; x/sys/unix
// does not define them.
const (
	timeError     = 5          // TIME_ERROR: clock not synchronized
	staUnsync     = 0x0040     // STA_UNSYNC: clock unsynchronized
	ntpPhaseLimit = 16_000_000 // NTP_PHASE_LIMIT: the maximum error's cap, µs
)

// clockCheck reads the kernel's NTP state with adjtimex(2) (modes 0: read
// only). The clock is unsynchronized while the kernel's maximum error is at
// its 16 s limit: where the kernel puts it at boot and at each step of the
// clock (ntp_clear), and where it gets to, growing 500 µs a second, when no
// NTP client (chrony, systemd-timesyncd, ntpd) has written a smaller one for
// long enough. That is how timedated's NTPSynchronized (timedatectl's
// "System clock synchronized") reads it. The STA_UNSYNC bit alone, and the
// TIME_ERROR state the kernel answers while it is set, do not count: a
// client that disciplines the clock keeps the bit set so that the kernel's
// 11-minute mode leaves the RTC alone (chronyd without rtcsync, or with
// rtcfile; systemd-timesyncd with the RTC in local time), and the kernel
// sets it itself once the maximum error reaches the limit. TIME_ERROR with
// STA_UNSYNC clear (STA_CLOCKERR, a lost PPS signal) still counts. The cost:
// ntpd releases before 4.2.8 write their unscaled MAXDISPERSE, 16 µs, as the
// maximum error when they start, so where such an ntpd never reaches a
// server the clock counts as unsynchronized only once the kernel has grown
// that to 16 s, about 9 h after ntpd started.
//
// Right after boot the clock is unsynchronized until the NTP client's first
// update, which comes once the network is up: a minute or two, after this
// daemon's first runs (it starts before the network). Within clockBootGrace
// of the boot an unsynchronized clock is Unknown, NoData ("not synchronized
// yet in this boot"), not True: every boot would otherwise set the
// condition and clear it a minute later. An estimated error above the limit
// is True at once: a client has written it.
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
	if tx.Maxerror >= ntpPhaseLimit || state == timeError && tx.Status&staUnsync == 0 {
		if up, err := c.sys.SinceBoot(); err == nil && up < clockBootGrace {
			return Result{Status: report.StatusUnknown, Reason: report.ReasonNoData,
				Message: fmt.Sprintf("the clock has not been synchronized yet in this boot (adjtimex state %d, status %#x, maximum error %s); an unsynchronized clock is a problem from %s after the boot", state, tx.Status, max, config.ShortDuration(clockBootGrace))}, nil
		}
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
