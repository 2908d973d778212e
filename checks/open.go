package checks

import (
	"io/fs"
	"os"
	"syscall"
)

// openNoWait opens path for reading, through symlinks, without blocking
// (O_NONBLOCK), and returns it with what the open descriptor is: the caller
// refuses what is not a regular file. A FIFO's open would otherwise wait for
// a writer that may never come (the run abandoned at its timeout, and every
// later run finding it still running). O_NONBLOCK changes nothing for the
// reads of a regular file.
func openNoWait(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}
