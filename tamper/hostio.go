package tamper

import "github.com/syself/autopilot-health/internal/hostio"

// The scan of the protected paths and the device-mapper reads live in
// internal/hostio, which the privileged helper (autopilot-health-privileged)
// links without the rest of the daemon; these names keep this package's API.
type (
	Kind         = hostio.Kind
	Entry        = hostio.Entry
	Spec         = hostio.Spec
	LimitError   = hostio.LimitError
	ScanNotes    = hostio.ScanNotes
	DM           = hostio.DM
	DMControl    = hostio.DMControl
	VerityTarget = hostio.VerityTarget
	VerityTable  = hostio.VerityTable
)

const (
	KindFile       = hostio.KindFile
	KindDir        = hostio.KindDir
	KindSymlink    = hostio.KindSymlink
	KindOther      = hostio.KindOther
	KindUnreadable = hostio.KindUnreadable
	MaxEntries     = hostio.MaxEntries
	MaxFileSize    = hostio.MaxFileSize
)

// ErrNoDeviceMapper: the control node does not exist.
var ErrNoDeviceMapper = hostio.ErrNoDeviceMapper

// Scan reads the protected paths under root (hostio.Scan).
func Scan(root string, spec Spec) ([]Entry, error) { return hostio.Scan(root, spec) }

// ScanNoting is Scan, and what it skipped of its host input
// (hostio.ScanNoting).
func ScanNoting(root string, spec Spec) ([]Entry, ScanNotes, error) {
	return hostio.ScanNoting(root, spec)
}

// ParseVerityTable parses a verity target's table line.
func ParseVerityTable(line string) (VerityTable, error) { return hostio.ParseVerityTable(line) }

// WildcardDirs returns the directories a pattern's wildcard passes through
// (hostio.WildcardDirs).
func WildcardDirs(root string, spec Spec) []string { return hostio.WildcardDirs(root, spec) }
