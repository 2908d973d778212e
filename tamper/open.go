package tamper

import (
	"os"

	"github.com/syself/autopilot-health/internal/hostio"
)

// OpenRegular opens p for reading only if it is a regular file, never
// following a symlink in its last component nor blocking on a FIFO or
// device (hostio.OpenRegular). A missing file is an error that matches
// fs.ErrNotExist.
func OpenRegular(p string) (*os.File, error) { return hostio.OpenRegular(p) }
