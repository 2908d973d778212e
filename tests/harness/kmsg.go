package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
)

// WriteKmsg writes one line to the real kernel log at level 5 (notice), as
// user space can: the record gets facility user. It opens the device once
// per line, because the kernel accepts only a burst of 10 lines per open
// file (printk_devkmsg=ratelimit), and ends the line with a newline (without
// it the record stays invisible).
func WriteKmsg(line string) error { return WriteKmsgLevel(5, line) }

// WriteKmsgLevel is WriteKmsg at a level of the kernel's (0 KERN_EMERG to
// 7 KERN_DEBUG): what the kernel prints a line at. The facility stays user:
// the kernel gives every record written from user space that facility
// (devkmsg_write), so a test's line never passes for the kernel's own.
func WriteKmsgLevel(level int, line string) error {
	f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte("<" + strconv.Itoa(level&7) + ">" + line + "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Token returns a unique token to tell this test's lines from everything
// else in the machine-wide kernel log.
func Token() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}
