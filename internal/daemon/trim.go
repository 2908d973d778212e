package daemon

import "github.com/syself/autopilot-health/internal/trim"

// The start-up pages of the binary are let go by internal/trim (shared with
// the privileged helper).
func trimStartupPages() (int, error)              { return trim.StartupPages() }
func trimMappings(exe, smaps string) (int, error) { return trim.Mappings(exe, smaps) }
func isExecELF(path string) (bool, error)         { return trim.IsExecELF(path) }
