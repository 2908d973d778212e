package privileged

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// Whatever the helper answers (cut short, not JSON, an errno out of range,
// an unknown sentinel, a descriptor promised and not sent), the daemon's
// client returns an answer or an error naming the helper: it neither
// panics nor keeps a descriptor. And whatever a peer sends, the helper
// answers it with an error it can decode, and goes on.
func FuzzWire(f *testing.F) {
	for _, s := range []string{
		`{"error":"x","errno":5,"sentinel":"not-exist"}`, `{"fd":true}`, `{"errno":-1}`, `{"errno":99999999999}`,
		`{"limit":{"Limit":-3,"At":""},"error":"y"}`, `{"data":"AAAA"}`, `{"entries":[{"path":"/a","kind":"file"}]}`,
		`{"op":"nvme-smart","ctrl":"nvme0\n"}`, `{"op":"lvm","timeout":9223372036854775807}`, `{"op":"dm-verity","path":""}`,
		`{"op":"scan","spec":{"patterns":["/proc"]}}`, `{"op":"scan"}`, "", "{", "null", `"x"`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	// The daemon's side: a helper that answers b.
	answers := make(chan []byte)
	hp := filepath.Join(dir, "answers.sock")
	hl, err := net.ListenUnix("unix", &net.UnixAddr{Name: hp, Net: "unix"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { hl.Close() })
	go func() {
		for b := range answers {
			c, err := hl.AcceptUnix()
			if err != nil {
				return
			}
			io.ReadAll(c)
			c.Write(b)
			c.Close()
		}
	}()
	f.Cleanup(func() { close(answers) })
	helper := &Client{Path: hp}
	// The helper's side: a peer that sends b. The handler answers what
	// would reach a device, so nothing is read on this machine.
	srv := serve(f, &Server{DevDir: dir, DMControl: filepath.Join(dir, "control"), LVM: filepath.Join(dir, "lvm"), KmsgPath: filepath.Join(dir, "kmsg"),
		handler: func(_ context.Context, req request) (response, int) { return response{Error: "fuzz: " + req.Op}, -1 }})
	before := openFDs(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		go func() { answers <- b }()
		if fd, err := helper.OpenKmsg(context.Background()); err == nil {
			closeFD(fd)
			t.Fatalf("a descriptor from an answer %q without one", b)
		}
		go func() { answers <- b }()
		helper.Identify("nvme0")

		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: srv.Path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(b)
		conn.CloseWrite()
		out, _ := io.ReadAll(conn)
		conn.Close()
		var r response
		if err := json.Unmarshal(out, &r); err != nil || (r.Error == "" && len(r.Data) == 0 && r.Verity == nil && r.Entries == nil) {
			t.Fatalf("request %q: answer %q (%v), want one", b, out, err)
		}
		if n := openFDs(t); n > before+2 {
			t.Fatalf("%d descriptors open, %d before", n, before)
		}
	})
}
