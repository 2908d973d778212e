package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// The timeouts of the daemon's two HTTP servers, the metrics listener and
// the status socket. The metrics listener listens on every interface by
// default (:20257), the status socket answers root only: on either, a client
// that opens connections and leaves them idle, or sends or reads slowly, must
// not hold them and a goroutine of the daemon for ever. A scrape and
// `autopilot-health status` are a GET without a body, answered in
// milliseconds; a connection idle for longer than a scrape interval of a
// minute is closed (the next scrape opens one).
const (
	serverReadHeaderTimeout = 10 * time.Second
	serverReadTimeout       = 10 * time.Second
	serverWriteTimeout      = 30 * time.Second
	serverIdleTimeout       = 90 * time.Second
	// serverMaxHeaderBytes bounds a request's headers (net/http reads 4 KiB
	// more before it answers 431). A scrape's are a few hundred bytes, a
	// bearer token a few KB; net/http's default, 1 MiB, let each
	// connection hold a MiB of the daemon's heap for the 10 s its headers
	// may take (TestMetricsListenerBoundsHeaderBytes).
	serverMaxHeaderBytes = 8 << 10
)

// newServer is the server of /metrics and /healthz (Handler) and of the
// status socket (statusHandler), with the timeouts and the bound above.
// net/http's own answer to "OPTIONS *" (200, no Allow) is off: both
// answer it 405 naming GET and HEAD, as every other method (the muxes would
// answer any request for "*" 400).
func newServer(h http.Handler) *http.Server {
	inner := h
	h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.RequestURI == "*" && r.Method == http.MethodOptions {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		inner.ServeHTTP(w, r)
	})
	return &http.Server{Handler: h, ReadHeaderTimeout: serverReadHeaderTimeout, ReadTimeout: serverReadTimeout,
		WriteTimeout: serverWriteTimeout, IdleTimeout: serverIdleTimeout, MaxHeaderBytes: serverMaxHeaderBytes,
		DisableGeneralOptionsHandler: true}
}

// Addr returns the metrics listener's address; nil while
// metrics.listen_address cannot be bound.
func (d *Daemon) Addr() net.Addr {
	if ln := d.metricsListener(); ln != nil {
		return ln.Addr()
	}
	return nil
}

// Handler serves /metrics and /healthz.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	metrics := d.metrics.Handler(slog.NewLogLogger(d.log.Handler(), slog.LevelError))
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		// autopilot_health_healthy says what /healthz would say now, not
		// what the last /healthz request or watchdog tick found.
		d.Healthy()
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := d.Healthy(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		if note := d.stateWriteNote(); note != "" {
			// Not the daemon stuck: the writer's loop works on, and
			// systemd's watchdog keeps being pinged.
			fmt.Fprintf(w, "ok: %d loops making progress; %s\n", len(d.live.Loops()), note)
			return
		}
		fmt.Fprintf(w, "ok: %d loops making progress\n", len(d.live.Loops()))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "autopilot-health: /metrics (Prometheus), /healthz (daemon liveness)")
	})
	return mux
}
