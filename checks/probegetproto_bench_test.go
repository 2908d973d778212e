package checks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/internal/testenv"
)

// BenchmarkProbeGetProto: prototypes of a synchronous GET of /healthz (a
// measurement only; issue 14), in BenchmarkProbeCost's harness.
// PROTO_ADDR: an external server's address (for strace of the client alone).
func BenchmarkProbeGetProto(b *testing.B) {
	every := 100 * time.Millisecond
	if v := os.Getenv("PROBECOST_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		every = d
	}
	addr := func(b *testing.B) string {
		if a := os.Getenv("PROTO_ADDR"); a != "" {
			return a
		}
		return probeCostServer(b, "kubelet")
	}
	b.Run("none", func(b *testing.B) {
		probeCostLoop(b, every, func(context.Context) error { return nil })
	})
	b.Run("none-noctx", func(b *testing.B) {
		probeCostLoopNoCtx(b, every, func(context.Context) error { return nil })
	})
	b.Run("nethttp", func(b *testing.B) {
		g := newHealthzGet("http://"+addr(b)+"/healthz", 10*time.Second)
		g.addr = "" // through net/http's client, as before
		defer g.close()
		probeCostLoop(b, every, g.get)
	})
	for _, v := range []struct {
		name string
		g    syncGet
	}{
		{"a-bare", syncGet{}},
		{"b-afterfunc", syncGet{afterFunc: true}},
		{"c1-timerreset", syncGet{afterFunc: true, idleTimer: true}},
		{"c2-stamp", syncGet{afterFunc: true, idleStamp: true}},
		{"d-deadline", syncGet{deadline: true}},
		{"e-full", syncGet{afterFunc: true, idleStamp: true, pending: true}},
	} {
		b.Run(v.name, func(b *testing.B) {
			g := v.g
			g.init(addr(b))
			defer g.close()
			probeCostLoop(b, every, g.get)
		})
	}
	b.Run("healthzget", func(b *testing.B) {
		g := newHealthzGet("http://"+addr(b)+"/healthz", 10*time.Second)
		defer g.close()
		probeCostLoop(b, every, g.get)
	})
	b.Run("healthzget-notimeout", func(b *testing.B) {
		g := newHealthzGet("http://"+addr(b)+"/healthz", 10*time.Second)
		g.timeout = 0 // no context.WithTimeout of its own: the loop's alone
		defer g.close()
		probeCostLoop(b, every, g.get)
	})
	b.Run("a-bare-noctx", func(b *testing.B) {
		g := syncGet{}
		g.init(addr(b))
		defer g.close()
		probeCostLoopNoCtx(b, every, g.get)
	})
}

// probeCostLoopNoCtx is probeCostLoop without the per-probe
// context.WithTimeout (its timer).
func probeCostLoopNoCtx(b *testing.B, every time.Duration, probe func(context.Context) error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ctx := context.Background()
	if err := probe(ctx); err != nil {
		b.Fatal(err)
	}
	cpu0, wakes0 := testenv.Threads(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(every)
		if err := probe(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu1, wakes1 := testenv.Threads(b)
	b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(wakes1-wakes0)/float64(b.N), "wakes/op")
}

type syncGet struct {
	afterFunc, deadline, idleTimer, idleStamp, pending bool

	addr string
	req  []byte
	conn net.Conn
	br   *bufio.Reader
	idle *time.Timer
	last time.Time
}

func (g *syncGet) init(addr string) {
	g.addr = addr
	g.req = []byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: Go-http-client/1.1\r\n\r\n")
}

func (g *syncGet) close() {
	if g.idle != nil {
		g.idle.Stop()
	}
	if g.conn != nil {
		g.conn.Close()
		g.conn = nil
	}
}

func (g *syncGet) get(ctx context.Context) error {
	if g.conn != nil && g.idleStamp && time.Since(g.last) > keptConnIdle {
		g.close()
	}
	if g.conn != nil && g.pending && (g.br.Buffered() > 0 || rawsys.Pending(g.conn)) {
		g.close()
	}
	if g.conn == nil {
		c, err := dialLocal(ctx, "tcp", g.addr)
		if err != nil {
			return err
		}
		g.conn, g.br = c, bufio.NewReaderSize(c, 4096)
	}
	conn := g.conn
	if g.afterFunc {
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		defer stop()
	}
	if g.deadline {
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)
			defer conn.SetDeadline(time.Time{})
		}
	}
	if _, err := conn.Write(g.req); err != nil {
		g.close()
		return err
	}
	resp, err := http.ReadResponse(g.br, nil)
	if err != nil {
		g.close()
		return err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if err != nil {
		g.close()
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	// The body must be whole for the connection to be kept.
	var one [1]byte
	if n, _ := resp.Body.Read(one[:]); n > 0 {
		g.close()
		return errors.New("long body")
	}
	if g.idleTimer {
		if g.idle == nil {
			g.idle = time.AfterFunc(keptConnIdle, func() {})
		} else {
			g.idle.Reset(keptConnIdle)
		}
	}
	if g.idleStamp {
		g.last = time.Now()
	}
	return nil
}
