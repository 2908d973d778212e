package privileged

import (
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/syself/autopilot-health/internal/hostio"
)

// What the helper's scan skipped of its host input (the hidden mounts'
// malformed lines of the mount table, hostio.ScanNotes) travels with its
// answer and reaches the daemon: the helper reads its own namespace's
// mount table, which the daemon cannot read for it. Answered here by a
// canned helper, since the real one reads the kernel's table, which holds
// no malformed line. Fails where the answer has no notes field or the
// client drops it (notes 0).
func TestScanNotesTravelWithTheAnswer(t *testing.T) {
	p := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first := &hostio.MalformedMountinfoError{Line: 7, Text: "107 66 0:47 /systemd/inaccessible/dir /home ro"}
	go func() {
		conn, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		var req request
		b, _ := io.ReadAll(conn)
		if json.Unmarshal(b, &req) != nil || req.Op != OpScan {
			return
		}
		out, _ := json.Marshal(response{Entries: []hostio.Entry{{Path: "/etc/x", Kind: hostio.KindFile}}, Notes: &hostio.ScanNotes{MalformedMountinfo: 2, FirstMalformed: first}})
		conn.Write(out)
	}()
	c := &Client{Path: p}
	es, notes, err := c.ScanNoting("/", hostio.Spec{Patterns: []string{"/etc/x"}})
	if err != nil || len(es) != 1 {
		t.Fatalf("scan: %v, %v", es, err)
	}
	if notes.MalformedMountinfo != 2 || notes.FirstMalformed == nil || *notes.FirstMalformed != *first {
		t.Errorf("notes %+v (first %v), want 2 and %v", notes, notes.FirstMalformed, first)
	}
}
