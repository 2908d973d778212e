package checks

import (
	"bytes"
	"fmt"
	"strconv"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// ProcStat is the kernel's statistics file, whose btime line is when this
// boot began.
const ProcStat = "/proc/stat"

// procStatMax bounds the read of /proc/stat: a line per CPU and the intr
// line's count per interrupt; 16 MiB is a bound, not a size expected.
const procStatMax = 16 << 20

// BootTime reads when this boot began from the btime line of /proc/stat
// under the host root: whole seconds since the epoch, which the kernel
// computes from the current wall clock less the time since boot, so it
// follows a step of the clock.
func (e *Env) BootTime() (time.Time, error) {
	data, err := rawsys.ReadPseudoFile(e.Path(ProcStat), procStatMax)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the boot time: %w", err)
	}
	t, err := parseBtime(data)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", ProcStat, err)
	}
	return t, nil
}

// parseBtime returns the time on the btime line of /proc/stat's content.
func parseBtime(data []byte) (time.Time, error) {
	for line := range bytes.Lines(data) { // no line limit: intr is long on hosts with many IRQs
		v, ok := bytes.CutPrefix(line, []byte("btime "))
		if !ok {
			continue
		}
		s, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil || s <= 0 {
			return time.Time{}, fmt.Errorf("btime %q is not a positive number of seconds", bytes.TrimSpace(v))
		}
		return time.Unix(s, 0), nil
	}
	return time.Time{}, fmt.Errorf("no btime line")
}
