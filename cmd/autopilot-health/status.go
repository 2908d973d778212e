package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report"
)

const statusSyn = "status [--json] [--config FILE] [--socket PATH]"

// cmdStatus asks the running daemon what it believes now, over its status
// socket. It runs no probe.
func cmdStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("status", statusSyn, stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML) naming status.socket; the default path may be absent")
	socket := fs.String("socket", "", "the daemon's status socket (default: status.socket of the configuration)")
	asJSON := fs.Bool("json", false, "print the daemon's status document as JSON")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health status: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	paths := []string{*socket}
	// emptied: the file sets status.socket = "". The key needs a restart
	// to change, so a daemon started before that edit still serves the
	// default socket: it is asked, and only when nothing answers there is
	// the file's "no status" the answer.
	emptied := false
	if *socket == "" {
		if cfg, _, err := loadConfig(*cfgPath, flagSet(fs, "config")); err == nil && cfg.Status.Socket == "" {
			emptied = true
		}
		// The file may name another socket than the running daemon's, or
		// not load at all (a refused reload): the daemon is asked anyway.
		paths = socketCandidates(*cfgPath, flagSet(fs, "config"), func(c *config.Config) string { return c.Status.Socket })
	}
	var body []byte
	var err, notSocket error
	path := ""
	for _, path = range paths {
		body, err = fetchStatus(path)
		if _, ok := err.(notASocketError); ok {
			// The other candidate may answer; if none does, this is
			// what the operator needs to know.
			notSocket = cmp.Or(notSocket, err)
			continue
		}
		if !errors.Is(err, errNotRunning) {
			break
		}
	}
	if emptied && (errors.Is(err, errNotRunning) || notSocket != nil) {
		fmt.Fprintln(stderr, "autopilot-health status: status.socket is empty in the configuration: the daemon serves no status")
		return exitError
	}
	if errors.Is(err, errNotRunning) && notSocket != nil {
		err = notSocket
	}
	if errors.Is(err, errNotRunning) && *socket == "" {
		if words := socketNotKnown(*cfgPath, flagSet(fs, "config"), "status", path); words != "" {
			fmt.Fprintf(stderr, "autopilot-health status: %s\n", words)
			return exitError
		}
	}
	if errors.Is(err, errNotRunning) && notSocket == nil && *socket != "" {
		if other := answersElsewhere(*socket, socketCandidates(*cfgPath, flagSet(fs, "config"), func(c *config.Config) string { return c.Status.Socket })); other != "" {
			fmt.Fprintln(stderr, elsewhereWords("status", *socket, other))
			return exitError
		}
	}
	if errors.Is(err, errNotRunning) {
		// Nothing answers, but a daemon holds the state directory: it
		// runs (starting, or its socket's file removed under it).
		if words := socketGone(paths, stateDirOf(*cfgPath, flagSet(fs, "config")), false); words != "" {
			fmt.Fprintf(stderr, "autopilot-health status: %s\n", words)
			return exitError
		}
	}
	if err != nil {
		if errors.Is(err, errNotRunning) && len(paths) > 1 {
			err = fmt.Errorf("%w; nor on %s, which %s names (status.socket needs a restart to change)", err, paths[0], *cfgPath)
		}
		fmt.Fprintf(stderr, "autopilot-health status: %v\n", err)
		return exitError
	}
	var st daemon.StatusReport
	if err := json.Unmarshal(body, &st); err != nil {
		fmt.Fprintf(stderr, "autopilot-health status: the daemon's answer on %s is not a status document: %v\n", path, err)
		return exitError
	}
	if st.PID <= 0 || st.Now.IsZero() {
		// JSON, but not what a daemon sends (every one sends its pid
		// and its time): null or {} read as a daemon with no condition
		// True would exit 0, a healthy node to a script.
		fmt.Fprintf(stderr, "autopilot-health status: the daemon's answer on %s is not a status document: it has no pid and time of a daemon: %s\n", path, shorten(string(body), 200))
		return exitError
	}
	if *asJSON {
		// A daemon started before an upgrade writes the C1 controls, DEL
		// and bidi overrides of an evidence's file name raw: \u escapes,
		// the same document (the body is JSON: it unmarshalled above).
		stdout.Write(report.PrintableJSON(body))
	} else {
		printStatus(stdout, st)
	}
	for _, c := range st.Conditions {
		if c.Status == report.StatusTrue {
			return exitProblem
		}
	}
	return exitOK
}

// statusTimeout is how long status waits for the daemon's answer.
var statusTimeout = 10 * time.Second

// fetchStatus reads the status document; an error says whether the daemon
// is not running.
func fetchStatus(path string) ([]byte, error) {
	got := daemon.FirstBytes{Max: 256} // the first bytes read, to name an answer that is not HTTP
	c := http.Client{Timeout: statusTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, err
			}
			return &firstBytesConn{Conn: conn, got: &got}, nil
		},
	}}
	resp, err := c.Get("http://autopilot-health" + daemon.StatusPath)
	if err != nil {
		what, notRunning := daemon.DialFailure(path, err)
		switch {
		case got.Len() > 0 && !isTimeout(err):
			// Something answered, but not in HTTP: another program's
			// socket (the daemon's control socket given for its status
			// socket). Not a status document, as any other answer that
			// is not one; its first bytes, printable, say whose.
			return nil, fmt.Errorf("the daemon's answer on %s is not a status document: not HTTP: %s", path, shorten(strings.TrimSpace(got.String()), 200))
		case what != "":
			// A daemon that found this at its start, or in place of
			// its socket while it ran, left it there and runs on
			// without a status socket: not "not running".
			return nil, notASocketAt(path, what)
		case notRunning:
			// Also a daemon starting: its socket is bound once New is
			// done (the state file read, on a disk blocked in I/O as
			// long as the read takes) and Run begins; systemd shows the
			// unit activating meanwhile.
			return nil, fmt.Errorf("%w: nothing answers on %s (systemctl status autopilot-health says which: activating while it starts)", errNotRunning, path)
		case errors.Is(err, os.ErrPermission):
			return nil, fmt.Errorf("%s: permission denied: the status socket is root's (run with sudo)", path)
		case errors.Is(err, syscall.EAGAIN):
			// The socket's backlog is full: connections the daemon
			// did not accept (its accepting goroutine stopped, the
			// process frozen). Not "within 10s": the connect fails
			// at once (EAGAIN is a net.Error Timeout too).
			return nil, fmt.Errorf("the daemon on %s takes no connection (its listen backlog is full): it may be hung (systemctl status autopilot-health; journalctl -u autopilot-health)", path)
		case isTimeout(err):
			return nil, hungError(path)
		}
		return nil, fmt.Errorf("asking the daemon on %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if isTimeout(err) {
		return nil, hungError(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the daemon's answer on %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		// Whatever answers on the socket words the body: printable, and
		// not megabytes of it on the terminal.
		return nil, fmt.Errorf("the daemon on %s answered %s: %s", path, report.Printable(resp.Status), shorten(strings.TrimSpace(string(b)), 400))
	}
	return b, nil
}

// firstBytesConn records what it reads in got.
type firstBytesConn struct {
	net.Conn
	got *daemon.FirstBytes
}

func (c *firstBytesConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.got.Write(p[:n])
	return n, err
}

// notASocketAt names what is at the status socket's path instead of a
// socket. A daemon finds it there at its start or while it runs, put in
// place of its socket's file removed or renamed over: either logs it, and
// binds its socket once it is moved away (its socket watch), which it logs
// too.
func notASocketAt(path, what string) error {
	return notASocketError(fmt.Sprintf("%s is not a socket but %s: the daemon serves no status there; move it away: the daemon binds its socket then, whether it found it there at its start or while it ran (its socket's file removed, or renamed over); journalctl -u autopilot-health says so", path, what))
}

// printEvidence writes each report field of evidence on a line of its own,
// prefix, its name and its value as JSON, printable and cut to 400 bytes.
func printEvidence(w io.Writer, prefix string, evidence map[string]any) {
	for _, k := range slices.Sorted(maps.Keys(evidence)) {
		b, _ := json.Marshal(evidence[k])
		b = report.PrintableJSON(b)
		fmt.Fprintf(w, "%s%s: %s\n", prefix, report.Printable(k), shorten(string(b), 400))
	}
}

// isTimeout: the daemon did not answer within statusTimeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// hungError: a daemon that took the connection and sent no status in
// time, told apart from one that is not running.
func hungError(path string) error {
	return fmt.Errorf("the daemon on %s accepts but does not answer within %s: it may be hung (systemctl status autopilot-health; journalctl -u autopilot-health)", path, statusTimeout)
}

// printStatus writes the one-screen status: what is wrong, since when, and
// what the daemon did about it.
func printStatus(w io.Writer, st daemon.StatusReport) {
	// Every text is the daemon's, and much of it a peer's words (a kernel
	// line, an API error, a file name): the daemon sends it printable, but
	// one started before an upgrade, or whatever answers on the socket, may
	// not; a terminal does not act on an escape sequence in it.
	p := report.Printable
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%s (%s ago)", t.Local().Format("2006-01-02 15:04:05"), st.Now.Sub(t).Round(time.Second))
	}
	state := "ready"
	if !st.Ready {
		state = "starting (first pass of the checks not done)"
	}
	if st.Stopping {
		// Between SIGTERM and the final save: systemd shows the unit
		// deactivating; the socket goes away once the daemon is done.
		state = "STOPPING (ending its loops and saving its state)"
	}
	if st.Unhealthy != "" {
		state += "; UNHEALTHY: " + p(st.Unhealthy)
	}
	if b := st.StateWriteBlocked; b != nil {
		state += fmt.Sprintf("; STATE NOT SAVED: the write of %s blocked in I/O since %s", p(b.Path), ago(b.Since))
	} else if f := st.StateSaveFailing; f != nil {
		state += fmt.Sprintf("; STATE NOT SAVED: the saves of %s have failed since %s: %s", p(f.Path), ago(f.Since), shorten(f.Error, 300))
	}
	if b := st.TamperWriteBlocked; b != nil {
		state += fmt.Sprintf("; TAMPER STATE NOT SAVED: the write of %s blocked in I/O since %s", p(b.Path), ago(b.Since))
	}
	gpu := ""
	if st.GPU {
		gpu = ", GPU"
	}
	fmt.Fprintf(w, "autopilot-health %s on node %s (%s%s), pid %d, running since %s, %s\n", p(st.Version), p(st.Node), p(st.Role), gpu, st.PID, ago(st.Started), state)
	// The line systemctl status shows: the note of a Node not updated in
	// front of the summary, as the daemon's STATUS= has it.
	summary := st.Summary
	if n := st.Kubernetes.NodeNotUpdated; n != nil {
		summary = n.Note() + "; " + summary
	}
	fmt.Fprintf(w, "Status: %s\n\n", p(summary))

	conds := slices.Clone(st.Conditions)
	rank := map[report.Status]int{report.StatusTrue: 0, report.StatusUnknown: 1, report.StatusFalse: 2}
	slices.SortStableFunc(conds, func(a, b daemon.ConditionStatus) int { return rank[a.Status] - rank[b.Status] })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONDITION\tSTATUS\tREASON\tSINCE\tEVALUATED")
	for _, c := range conds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\n", p(c.Type), p(string(c.Status)), p(string(c.Reason)), c.LastTransitionTime.Local().Format("2006-01-02 15:04:05"), st.Now.Sub(c.LastUpdateTime).Round(time.Second))
	}
	tw.Flush()
	for _, c := range conds {
		if c.Status == report.StatusFalse {
			continue
		}
		fmt.Fprintf(w, "\n%s=%s (%s) since %s:\n  %s\n", p(c.Type), p(string(c.Status)), p(string(c.Reason)), ago(c.LastTransitionTime), p(c.Message))
		if c.Source == "kmsg" && c.Status == report.StatusTrue {
			fmt.Fprintln(w, "  evidence: the kernel line above")
		}
		// Of a True held through failed runs: the evidence of the run
		// that decided it, beside its message; what the failed run
		// collected only under the line that says it failed, labelled.
		printEvidence(w, "  evidence ", c.Evidence)
		if h := c.Held; h != nil {
			// Not what the check last found: what it found before its
			// last runs failed, held through them.
			runs := "1 failed run"
			if h.Runs != 1 {
				runs = fmt.Sprintf("%d failed runs", h.Runs)
			}
			fmt.Fprintf(w, "  held through %s of its check in a row since %s (%s: %s); a 3rd makes what its check found Unknown\n",
				runs, ago(h.Since), p(string(h.Reason)), p(h.Message))
			printEvidence(w, "  the last failed run's evidence (not what decided "+p(string(c.Status))+") ", h.Evidence)
		}
	}

	fmt.Fprintln(w, "\nRepairs:")
	units := make([]string, 0, len(st.Repairs))
	for u := range st.Repairs {
		units = append(units, u)
	}
	slices.Sort(units)
	if len(units) == 0 {
		fmt.Fprintln(w, "  none watched")
	}
	// A repair's reason holds the kubelet's /healthz answer, whatever
	// answers on its port: printable, as a condition's message is.
	for _, u := range units {
		r := st.Repairs[u]
		if r.Repairs == 0 && r.LastRepair.IsZero() {
			fmt.Fprintf(w, "  %s: never repaired\n", p(u))
		} else {
			fmt.Fprintf(w, "  %s: %d repairs, last %s: restart %s (%s), %d in a row\n", p(u), r.Repairs, ago(r.LastRepair), p(r.LastResult), p(r.LastReason), r.Consecutive)
		}
		if r.LastAttemptError != "" && !r.LastAttempt.Before(r.LastRepair) {
			fmt.Fprintf(w, "    last attempt %s could not start: %s\n", ago(r.LastAttempt), report.Printable(r.LastAttemptError))
		}
	}

	fmt.Fprint(w, "\nKernel log: ")
	if k := st.Kmsg; k == nil {
		fmt.Fprintln(w, "not monitored (kmsg.enabled = false)")
	} else {
		reading := "reading " + p(k.Device)
		if !k.Reading {
			reading = "NOT reading " + p(k.Device)
		}
		last := "no record read yet"
		if r := k.LastRecord; r != nil {
			last = fmt.Sprintf("last record #%d at %.6f s after boot (%s)", r.Seq, float64(r.Usec)/1e6, ago(r.Time))
		}
		fmt.Fprintf(w, "%s, %s; %.0f records, %.0f lost, %.0f reopens\n", reading, last, k.Records, k.Lost, k.Reopens)
	}

	if m := st.Metrics; m.Serving && m.AcceptError != "" {
		fmt.Fprintf(w, "Metrics: NOT accepting connections on %s since %s, %d failed accepts in a row, retrying with backoff: %s\n", p(m.Address), ago(m.AcceptFailingSince), m.FailedAccepts, report.Printable(m.AcceptError))
	} else if m.Serving {
		fmt.Fprintf(w, "Metrics: serving on %s\n", p(m.Address))
	} else if m.Error != "" {
		fmt.Fprintf(w, "Metrics: NOT serving on %s since %s, %d failed binds, retrying with backoff: %s\n", p(m.Address), ago(m.FailingSince), m.Attempts, report.Printable(m.Error))
	}

	fmt.Fprint(w, "Configuration: ")
	if cs := st.Config; cs.File == "" {
		fmt.Fprintln(w, "embedded defaults")
	} else {
		if cs.Absent {
			fmt.Fprintf(w, "embedded defaults (%s absent), in effect since %s\n", p(cs.File), ago(cs.Since))
		} else {
			fmt.Fprintf(w, "%s, in effect since %s\n", p(cs.File), ago(cs.Since))
		}
		if r := cs.LastReload; r != nil && r.Result == "refused" {
			fmt.Fprintf(w, "  last reload %s REFUSED (running on the previous configuration): %s\n", ago(r.At), shorten(r.Error, 400))
		} else if r != nil {
			fmt.Fprintf(w, "  last reload %s: %s\n", ago(r.At), p(r.Changed))
		}
	}

	k := st.Kubernetes
	fmt.Fprintf(w, "Kubernetes: %s", p(k.State))
	if k.Detail != "" {
		fmt.Fprintf(w, " (%s)", report.Printable(k.Detail))
	}
	fmt.Fprintln(w)
	// Waiting for the kubeconfig, the events are queued all the same (a
	// stop before it comes loses them): pending is shown then too.
	if k.State == "reporting" || len(k.Calls) > 0 || k.StatusPending || k.EventsQueued > 0 {
		pending := "none"
		if k.StatusPending {
			pending = "the conditions"
		}
		if k.EventsQueued > 0 {
			events := "events"
			if k.EventsQueued == 1 {
				events = "event"
			}
			pending = strings.TrimPrefix(pending+fmt.Sprintf(", %d %s", k.EventsQueued, events), "none, ")
		}
		fmt.Fprintf(w, "  conditions last written: %s; pending: %s\n", ago(k.Calls["status"].LastSuccess), pending)
		if n := k.NodeNotUpdated; n != nil {
			fmt.Fprintf(w, "  NODE NOT UPDATED since %s: %d calls failed in a row since %s: %s: %s\n", ago(n.Since), n.Failures, ago(n.FailingSince), p(n.Reason), shorten(n.Error, 300))
		}
		if len(k.ReportLeftOut) > 0 {
			fmt.Fprintf(w, "  REPORT DOCUMENTS LEFT OUT (no room on the Node beside its other annotations): %s\n", p(strings.Join(k.ReportLeftOut, ", ")))
		}
		if k.TamperAnnotationAsIs {
			fmt.Fprintln(w, "  the Node's tamper annotation is left as it was (not even its stub fits): its updatedAt stands still while the daemon runs; its cleared is kept")
		}
		kinds := make([]string, 0, len(k.Calls))
		for kind := range k.Calls {
			kinds = append(kinds, kind)
		}
		slices.Sort(kinds)
		for _, kind := range kinds {
			c := k.Calls[kind]
			if c.LastError == "" {
				continue
			}
			now := "recovered since"
			if c.Failing {
				now = "FAILING"
			}
			fmt.Fprintf(w, "  %s: last error %s, %s: %s\n", p(kind), ago(c.LastErrorAt), now, shorten(c.LastError, 300))
		}
	}
}

// shorten is s with its control characters and invalid bytes written
// \xNN (report.Printable: free text a peer worded reaches a terminal),
// cut to n bytes, not inside an escape nor inside a character (half of
// its UTF-8 bytes would be bytes that are not text).
func shorten(s string, n int) string {
	s = report.Printable(s)
	if len(s) <= n {
		return s
	}
	cut := n
	if i := strings.LastIndex(s[max(0, n-3):n], `\x`); i >= 0 {
		cut = max(0, n-3) + i // not inside \xNN
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// errNotRunning: nothing answers on the status socket: no daemon, or one
// that has not bound it yet.
var errNotRunning = errors.New("the daemon is not running, or still starting")

// notASocketError: something other than a socket is at the status
// socket's path.
type notASocketError string

func (e notASocketError) Error() string { return string(e) }
