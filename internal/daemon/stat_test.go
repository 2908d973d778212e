package daemon

import (
	"fmt"
	"syscall"
	"testing"
)

func statFd(t *testing.T, fd int) string {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}
