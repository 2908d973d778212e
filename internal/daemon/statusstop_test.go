package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// From SIGTERM until the final save is done (up to finalSaveWait on a hung
// disk) the status socket still answers, with "stopping"; it is removed
// once the daemon is done. Before, the socket was closed and removed at
// SIGTERM, and `autopilot-health status` said "the daemon is not running"
// while systemd showed the unit deactivating, its process still saving.
func TestStatusAnswersUntilTheFinalSave(t *testing.T) {
	cfg := testConfig(t)
	cfg.Checks.NodeTampered.Enabled = false
	cfg.Status.Socket = filepath.Join(t.TempDir(), "status.sock")
	d, _ := newLoggedDaemon(t, cfg)
	disk := newHungDisk()
	disk.unblock() // the start's writes go through
	d.stateW.write = disk.write
	defer disk.unblock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	await(t, d, "a ready daemon answering on its status socket", func() bool {
		st, err := getStatus(t, cfg.Status.Socket)
		return err == nil && st.Ready && !st.Stopping
	})
	disk.hangNow() // the final save blocks
	cancel()
	var st StatusReport
	var err error
	await(t, d, "a status that says stopping", func() bool {
		st, err = getStatus(t, cfg.Status.Socket)
		return err == nil && st.Stopping
	})
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while its final save is blocked", err)
	default:
	}
	if st.PID != os.Getpid() || !st.Ready {
		t.Errorf("status while stopping: %+v", st)
	}
	disk.unblock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
	}
	if _, err := os.Lstat(cfg.Status.Socket); !os.IsNotExist(err) {
		t.Errorf("the status socket is left after the stop: %v", err)
	}
}
