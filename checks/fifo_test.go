package checks

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
)

// probeFIFO probes c, whose input at fifo is a named pipe, and returns the
// probe's error. A probe that does not return within 10 s (its open
// waiting for a writer that never comes) fails the test, after a writer
// has let the blocked open return.
func probeFIFO(t *testing.T, c Check, fifo string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Probe(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-done
		t.Fatalf("the probe of the FIFO %s did not return within 10 s", fifo)
		return nil
	}
}
