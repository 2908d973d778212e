package privileged

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/hostio"
)

// Client asks the helper listening at Path.
type Client struct {
	Path string
	// wait, for tests, replaces opTimeout.
	wait func(request) time.Duration
}

// answerStart is the room call reads an answer into first (most answers
// are a few hundred bytes; a scan's a few KiB): on the heap, not the
// caller's stack.
const answerStart = 4 << 10

// call sends one request and returns the answer and the descriptor that
// came with it (-1: none). It waits for the answer as long as the helper
// may take to give it (opTimeout).
func (c *Client) call(ctx context.Context, req request) (response, int, error) {
	limit := opTimeout(req)
	if c.wait != nil {
		limit = c.wait(req)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// failed names the caller's cancel where it ended the exchange.
	failed := func(err error) error {
		if perr := parent.Err(); perr != nil {
			err = perr
		}
		return fmt.Errorf("privileged helper at %s: %w", c.Path, err)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.Path)
	if err != nil {
		return response{}, -1, fmt.Errorf("privileged helper: %w", err)
	}
	conn := nc.(*net.UnixConn)
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// A caller's cancel ends the exchange too, not only the deadline: the
	// daemon's stop does not wait behind a helper that does not answer.
	defer context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })()
	b, _ := json.Marshal(req)
	if _, err := conn.Write(b); err != nil {
		return response{}, -1, failed(err)
	}
	conn.CloseWrite()
	// The answer is read into body's spare room, which doubles as it
	// fills: a buffer of constant size here lived on the caller's stack
	// (64 KiB did), which grew to 128 KiB at each call, was zeroed page by
	// page (16 page faults) and shrunk again at the next collections, a
	// check's worker calling every few minutes (README, Cost: "The idle
	// daemon's page faults").
	body := make([]byte, 0, answerStart)
	fd := -1
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		if cap(body)-len(body) < answerStart/2 && cap(body) <= maxResponse {
			// Doubled, but not past the first byte over maxResponse:
			// an answer too large is refused holding no more.
			grown := make([]byte, len(body), min(2*cap(body), maxResponse+1))
			copy(grown, body)
			body = grown
		}
		n, oobn, _, _, err := conn.ReadMsgUnix(body[len(body):cap(body)], oob)
		if n > 0 {
			body = body[:len(body)+n]
		}
		if oobn > 0 {
			if fds := rights(oob[:oobn]); len(fds) > 0 {
				for _, extra := range fds[1:] {
					unix.Close(extra)
				}
				if fd >= 0 {
					unix.Close(fd)
				}
				fd = fds[0]
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && n <= 0 && oobn <= 0) {
			break
		}
		if err != nil {
			closeFD(fd)
			return response{}, -1, failed(err)
		}
		if len(body) > maxResponse {
			closeFD(fd)
			return response{}, -1, fmt.Errorf("privileged helper at %s: answer over %d bytes", c.Path, maxResponse)
		}
	}
	var resp response
	if err := json.Unmarshal(body, &resp); err != nil {
		closeFD(fd)
		if len(body) == 0 {
			return response{}, -1, fmt.Errorf("privileged helper at %s: no answer (refused, or it stopped)", c.Path)
		}
		return response{}, -1, fmt.Errorf("privileged helper at %s: malformed answer: %w", c.Path, err)
	}
	if !resp.FD && fd >= 0 {
		unix.Close(fd)
		fd = -1
	}
	return resp, fd, nil
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []int
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err == nil {
			out = append(out, fds...)
		}
	}
	return out
}

// OpenKmsg returns a descriptor of /dev/kmsg, opened by the helper
// (read-only, non-blocking, close-on-exec); the caller closes it.
//
// ctx done (canceled, or past its deadline) ends the exchange wherever it
// is, also while the helper has not answered yet: the call returns -1 and
// an error that is ctx's (errors.Is), closing any descriptor received so
// far (without ctx done, the request's own limit, opTimeout, ends it the
// same way with a timeout). An answer read whole before the cancel ends
// the read is not undone: the call then returns its descriptor and a nil
// error although ctx is done by the time it returns. A caller that stops
// at ctx checks ctx after a nil error and closes the descriptor itself
// (kmsg.Reader closes one opened as its stop came;
// TestDescriptorAnsweredAtTheCancelIsNotLeaked,
// TestOpenKmsgCanceledBeforeTheCall).
func (c *Client) OpenKmsg(ctx context.Context) (int, error) {
	resp, fd, err := c.call(ctx, request{Op: OpKmsg})
	if err != nil {
		return -1, err
	}
	if err := resp.err(); err != nil {
		closeFD(fd)
		return -1, err
	}
	if fd < 0 {
		return -1, fmt.Errorf("privileged helper at %s: the kernel log's descriptor did not come", c.Path)
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// ask sends a request whose answer carries no descriptor (one that comes
// anyway is closed) and returns the answer with the helper's error, if any;
// on a failed exchange the answer is empty.
func (c *Client) ask(ctx context.Context, req request) (response, error) {
	resp, fd, err := c.call(ctx, req)
	closeFD(fd)
	if err != nil {
		return response{}, err
	}
	return resp, resp.err()
}

func (c *Client) data(req request) ([]byte, error) {
	resp, err := c.ask(context.Background(), req)
	return resp.Data, err
}

// Identify returns controller ctrl's Identify Controller page.
func (c *Client) Identify(ctrl string) ([]byte, error) {
	return c.data(request{Op: OpNVMeIdentify, Ctrl: ctrl})
}

// SMART returns controller ctrl's SMART / Health Information log page.
func (c *Client) SMART(ctrl string) ([]byte, error) {
	return c.data(request{Op: OpNVMeSMART, Ctrl: ctrl})
}

// RunLVM runs an LVM report in the helper (hostio.RunLVM).
func (c *Client) RunLVM(ctx context.Context, lvm string, timeout time.Duration, command string, args ...string) ([]byte, error) {
	resp, err := c.ask(ctx, request{Op: OpLVM, LVM: lvm, Timeout: timeout, Command: command, Args: args})
	return resp.Data, err
}

// DM reads the device-mapper tables through the helper, on the control
// node at path.
func (c *Client) DM(path string) hostio.DM { return dmVia{c, path} }

type dmVia struct {
	c    *Client
	path string
}

func (d dmVia) VerityTargets() ([]hostio.VerityTarget, error) {
	resp, err := d.c.ask(context.Background(), request{Op: OpDMVerity, Path: d.path})
	return resp.Verity, err
}

// Scan scans the protected paths in the helper (hostio.Scan); root must be
// the host's.
func (c *Client) Scan(root string, spec hostio.Spec) ([]hostio.Entry, error) {
	es, _, err := c.ScanNoting(root, spec)
	return es, err
}

// ScanNoting is Scan, and what the helper's scan skipped of its host input
// (hostio.ScanNoting).
func (c *Client) ScanNoting(root string, spec hostio.Spec) ([]hostio.Entry, hostio.ScanNotes, error) {
	if root != "" && root != "/" {
		return nil, hostio.ScanNotes{}, fmt.Errorf("privileged helper: scans only the host's root, not %s", root)
	}
	resp, err := c.ask(context.Background(), request{Op: OpScan, Spec: &spec})
	var notes hostio.ScanNotes
	if resp.Notes != nil {
		notes = *resp.Notes
	}
	return resp.Entries, notes, err
}
