// Command autopilot-health is the Syself Autopilot node health daemon.
package main

import (
	"os"

	"github.com/syself/autopilot-health/internal/tick"
)

// main runs the daemon with its timers on a timerfd (tick.UseTimerfd: an
// idle wake-up wakes one thread, not the runtime's monitor too); where none
// can be made they stay Go timers. Tests that run Main keep Go timers
// (testing/synctest's fake clock moves them).
func main() {
	_ = tick.UseTimerfd()
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}
