// Package smallfile reads a small file an operator or the daemon names (the
// configuration file, the record of a refused one) without blocking on what
// is not one, and never more than a bound.
package smallfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// Limits say what Read reads.
type Limits struct {
	// Max is the most bytes read: a file with more is a *TooLargeError.
	Max int64
	// DeviceWait, when positive, lets a device be read (--config
	// /dev/null), given up with a *NothingToReadError when it has
	// nothing to read for that long (a terminal). Zero: a device is a
	// *NotRegularError, as a directory, a FIFO or a socket always is.
	DeviceWait time.Duration
}

// NotRegularError: what is at the path is not a regular file (nor a
// device, where Limits.DeviceWait lets one be read). Nothing was read.
type NotRegularError struct {
	// Kind names it: "a directory", "a FIFO", "a socket", "a device",
	// else "mode <type>".
	Kind string
}

func (e *NotRegularError) Error() string { return "not a regular file (" + e.Kind + ")" }

// TooLargeError: the file holds more than Limits.Max bytes. At most one
// byte more was read.
type TooLargeError struct {
	Max int64
	// Size is the regular file's size as fstat gives it after the read;
	// -1 where that is not more than Max (a device; a file whose stat
	// says less than it holds, as /proc's say 0 bytes), which is not
	// the file's size.
	Size int64
	// Device: what was read is a device.
	Device bool
}

func (e *TooLargeError) Error() string { return fmt.Sprintf("larger than %d bytes", e.Max) }

// NothingToReadError: a device had nothing to read for Wait.
type NothingToReadError struct{ Wait time.Duration }

func (e *NothingToReadError) Error() string { return fmt.Sprintf("nothing to read for %s", e.Wait) }

// Read reads the file at path, opened without blocking: a FIFO with no
// writer would block the open (and a read) until one came, for ever. A
// directory, a FIFO or a socket is refused from the open descriptor
// without reading it, a device unless l.DeviceWait lets it be read; at
// most l.Max+1 bytes are read. The other errors are the open's, the
// stat's or the read's, as the os package words them.
func Read(path string, l Limits) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ENXIO) {
		// open(2) of a Unix socket.
		if st, serr := os.Stat(path); serr == nil && st.Mode().Type()&fs.ModeSocket != 0 {
			return nil, &NotRegularError{Kind: "a socket"}
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	m := st.Mode()
	device := m&fs.ModeDevice != 0
	if !m.IsRegular() && (!device || l.DeviceWait <= 0) {
		return nil, &NotRegularError{Kind: kind(m)}
	}
	if device {
		f.SetReadDeadline(time.Now().Add(l.DeviceWait))
	}
	b, err := io.ReadAll(io.LimitReader(f, l.Max+1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, &NothingToReadError{Wait: l.DeviceWait}
	}
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > l.Max {
		size := int64(-1)
		if m.IsRegular() {
			// Stat again: the file may have grown since the first.
			if st, err := f.Stat(); err == nil && st.Size() > l.Max {
				size = st.Size()
			}
		}
		return nil, &TooLargeError{Max: l.Max, Size: size, Device: device}
	}
	return b, nil
}

// kind names what a file that is not a regular one is.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.Type().String()
}
