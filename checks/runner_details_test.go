package checks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// scripted is a check whose runs return what its script says, run by run
// (the last entry again once the script is done).
type scripted struct {
	mu   sync.Mutex
	runs []func(ctx context.Context) (Result, error)
}

func (s *scripted) Probe(ctx context.Context) (Result, error) {
	s.mu.Lock()
	f := s.runs[0]
	if len(s.runs) > 1 {
		s.runs = s.runs[1:]
	}
	s.mu.Unlock()
	return f(ctx)
}

func returns(res Result, err error) func(context.Context) (Result, error) {
	return func(context.Context) (Result, error) { return res, err }
}

// docOf renders the documents of det and returns domain's.
func docOf(t *testing.T, det *report.Details, domain string) string {
	t.Helper()
	docs, err := det.Documents(time.Now(), report.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	return docs[report.AnnotationPrefix+domain]
}

var (
	fsDetail = report.Detail{Domain: "storage", Field: "filesystems", Value: []string{"/var"}}
	vgDetail = report.Detail{Domain: "storage", Field: "volumeGroups", Value: []string{"vg0"}}
	diskOK   = Result{Status: report.StatusFalse, Reason: "DiskUsageOK"}
)

// A field the check's previous result carried and its latest does not
// (DiskUsageHigh's LVM part gave no report this time) leaves the document
// and the check's evidence.
func TestRunnerDropsAFieldALaterResultLacks(t *testing.T) {
	env := testEnv(t, nil)
	det := report.NewDetails()
	first, second := diskOK, diskOK
	first.Details = []report.Detail{fsDetail, vgDetail}
	second.Details = []report.Detail{fsDetail}
	c := &scripted{runs: []func(context.Context) (Result, error){returns(first, nil), returns(second, nil)}}
	r, err := NewRunner(env, Options{Store: report.NewStore("b"), Details: det, Only: []string{"DiskUsageHigh"},
		Factories: map[string]Factory{"DiskUsageHigh": fixed(c)}})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(t.Context())
	if d := docOf(t, det, "storage"); !strings.Contains(d, `"volumeGroups":["vg0"]`) {
		t.Fatalf("storage document after the first run: %s", d)
	}
	r.RunOnce(t.Context())
	if d := docOf(t, det, "storage"); strings.Contains(d, "volumeGroups") || !strings.Contains(d, `"filesystems":["/var"]`) {
		t.Errorf("storage document after a run without volume groups: %s", d)
	}
	ev := det.Evidence("DiskUsageHigh")
	if _, ok := ev["storage.volumeGroups"]; ok || ev["storage.filesystems"] == nil {
		t.Errorf("evidence after a run without volume groups: %v", ev)
	}
}

// A run that failed (an error, a panic, a timeout, a reason outside the
// catalog) leaves the fields its check collected before as they were: its
// condition says the check failed, and a transient failure does not blank
// the report. An error that carries details adds them.
func TestRunnerFailedRunKeepsTheCheckFields(t *testing.T) {
	certs := report.Detail{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem", DaysLeft: 40}}}
	ok := Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Details: []report.Detail{certs}}
	release := make(chan struct{})
	for _, tc := range []struct {
		name string
		run  func(context.Context) (Result, error)
	}{
		{"error", returns(Result{}, errors.New("cannot read"))},
		{"panic", func(context.Context) (Result, error) { panic("boom") }},
		{"timeout", func(context.Context) (Result, error) { <-release; return ok, nil }},
		{"invalid reason", returns(Result{Status: report.StatusFalse, Reason: "NoSuchReason"}, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release = make(chan struct{})
				defer close(release)
				env := testEnv(t, nil)
				det := report.NewDetails()
				c := &scripted{runs: []func(context.Context) (Result, error){returns(ok, nil), tc.run}}
				r, err := NewRunner(env, Options{Store: report.NewStore("b"), Details: det, Only: []string{"CertRenewalFailing"},
					Factories: map[string]Factory{"CertRenewalFailing": fixed(c)}})
				if err != nil {
					t.Fatal(err)
				}
				r.RunOnce(t.Context())
				if d := docOf(t, det, "certs"); !strings.Contains(d, "/x.pem") {
					t.Fatalf("certs document after a run that collected them: %s", d)
				}
				r.RunOnce(t.Context())
				if cond, _ := r.store.Get("CertRenewalFailing"); cond.Status != report.StatusUnknown {
					t.Fatalf("condition after the failed run: %+v", cond)
				}
				if d := docOf(t, det, "certs"); !strings.Contains(d, "/x.pem") {
					t.Errorf("certs document after a failed run lost what the check collected before: %s", d)
				}
				if ev := det.Evidence("CertRenewalFailing"); ev == nil {
					t.Error("evidence after a failed run: none")
				}
			})
		})
	}
}

// tamper.tamper is carried by both tamper checks: it stays while either
// carries it, and goes once neither does.
func TestRunnerKeepsASharedFieldWhileAnOwnerCarriesIt(t *testing.T) {
	tamperOf := func(v string) []report.Detail {
		return []report.Detail{{Domain: "tamper", Field: "tamper", Value: v}}
	}
	node := &scripted{runs: []func(context.Context) (Result, error){
		returns(Result{Status: report.StatusFalse, Reason: report.ReasonNodeIntact, Details: tamperOf("node-1")}, nil),
		returns(Result{Status: report.StatusFalse, Reason: report.ReasonNodeIntact}, nil),
	}}
	sealed := &scripted{runs: []func(context.Context) (Result, error){
		returns(Result{Status: report.StatusFalse, Reason: report.ReasonSealedOSIntact, Details: tamperOf("sealed-1")}, nil),
		returns(Result{Status: report.StatusFalse, Reason: report.ReasonSealedOSIntact, Details: tamperOf("sealed-2")}, nil),
		returns(Result{Status: report.StatusFalse, Reason: report.ReasonSealedOSIntact}, nil),
	}}
	det := report.NewDetails()
	r, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"NodeTampered", "SealedOSTampered"},
		Factories: map[string]Factory{"NodeTampered": fixed(node), "SealedOSTampered": fixed(sealed)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Checks(); len(got) != 2 {
		t.Fatalf("checks: %v", got)
	}
	r.RunOnce(t.Context())
	r.RunOnce(t.Context())
	if d := docOf(t, det, "tamper"); !strings.Contains(d, `"tamper":"sealed-2"`) {
		t.Errorf("tamper document while SealedOSTampered carries it: %s", d)
	}
	if ev := det.Evidence("NodeTampered"); ev != nil {
		t.Errorf("NodeTampered evidence after a run without it: %v", ev)
	}
	r.RunOnce(t.Context())
	if d := docOf(t, det, "tamper"); strings.Contains(d, `"tamper":`) {
		t.Errorf("tamper document once neither check carries it: %s", d)
	}
}

// A check a reload disables leaves the report.
func TestApplyRemovesTheStoppedCheckFields(t *testing.T) {
	det := report.NewDetails()
	res := diskOK
	res.Details = []report.Detail{fsDetail}
	factories := map[string]Factory{}
	for name, h := range healthy {
		factories[name] = fixed(probeFunc(func(context.Context) (Result, error) { return h, nil }))
	}
	factories["DiskUsageHigh"] = fixed(probeFunc(func(context.Context) (Result, error) { return res, nil }))
	r, err := NewRunner(reloadEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Factories: factories})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(t.Context())
	if d := docOf(t, det, "storage"); !strings.Contains(d, "filesystems") {
		t.Fatalf("storage document before the reload: %s", d)
	}
	a, err := r.Apply(reloadEnv(t, func(c *config.Config) { c.Checks.DiskUsageHigh.Enabled = false }))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Stopped) != 1 || a.Stopped[0] != "DiskUsageHigh" {
		t.Fatalf("Apply = %+v", a)
	}
	if d := docOf(t, det, "storage"); strings.Contains(d, "filesystems") {
		t.Errorf("storage document after DiskUsageHigh was disabled: %s", d)
	}
	if ev := det.Evidence("DiskUsageHigh"); ev != nil {
		t.Errorf("evidence of the stopped check: %v", ev)
	}
}

// The daemon replaces its runner when the node's role changes: the new
// runner's Run removes what checks it does not run collected, and keeps
// the fields of those it runs until their runs replace them.
func TestRunRemovesTheFieldsOfChecksItDoesNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		det := report.NewDetails()
		certs := Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Details: []report.Detail{{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem"}}}}}
		disk := diskOK
		disk.Details = []report.Detail{fsDetail}
		factories := map[string]Factory{
			"CertRenewalFailing": fixed(probeFunc(func(context.Context) (Result, error) { return certs, nil })),
			"DiskUsageHigh":      fixed(probeFunc(func(context.Context) (Result, error) { return disk, nil })),
		}
		old, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"CertRenewalFailing", "DiskUsageHigh"}, Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		old.RunOnce(t.Context())
		next, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"DiskUsageHigh"}, Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			next.Run(ctx, nil)
			close(done)
		}()
		synctest.Wait()
		if d := docOf(t, det, "certs"); strings.Contains(d, "/x.pem") {
			t.Errorf("certs document once no runner runs CertRenewalFailing: %s", d)
		}
		if d := docOf(t, det, "storage"); !strings.Contains(d, `"filesystems":["/var"]`) {
			t.Errorf("storage document of a check the new runner runs: %s", d)
		}
		cancel()
		<-done
	})
}

// staleOf decodes the "stale" list of a document (nil when it has none).
func staleOf(t *testing.T, doc string) []map[string]any {
	t.Helper()
	var d struct {
		Stale []map[string]any `json:"stale"`
	}
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatalf("document %s: %v", doc, err)
	}
	return d.Stale
}

// A run that failed (an error, a panic, a timeout, a reason outside the
// catalog) keeps the fields its check collected before, and their document
// says so: "stale" names the check, the fields, when they were collected
// (the last run that decided) and the failed run's error (the condition's
// message), under the fresh updatedAt of every refresh. The next run that
// decides drops it: the document is again what it was before the failure.
func TestRunnerFailedRunMarksTheCheckFieldsStale(t *testing.T) {
	certs := report.Detail{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem", DaysLeft: 40}}}
	ok := Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Details: []report.Detail{certs}}
	for _, tc := range []struct {
		name string
		run  func(context.Context) (Result, error)
	}{
		{"error", returns(Result{}, errors.New("cannot read"))},
		{"panic", func(context.Context) (Result, error) { panic("boom") }},
		{"timeout", func(ctx context.Context) (Result, error) { <-ctx.Done(); return ok, nil }},
		{"invalid reason", returns(Result{Status: report.StatusFalse, Reason: "NoSuchReason"}, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				env := testEnv(t, nil)
				det := report.NewDetails()
				c := &scripted{runs: []func(context.Context) (Result, error){returns(ok, nil), tc.run, returns(ok, nil)}}
				r, err := NewRunner(env, Options{Store: report.NewStore("b"), Details: det, Only: []string{"CertRenewalFailing"},
					Factories: map[string]Factory{"CertRenewalFailing": fixed(c)}})
				if err != nil {
					t.Fatal(err)
				}
				collected := time.Now()
				r.RunOnce(t.Context())
				healthy := docOf(t, det, "certs")
				if strings.Contains(healthy, "stale") {
					t.Fatalf("certs document after a run that decided: %s", healthy)
				}
				time.Sleep(2 * time.Hour) // the fake clock of the bubble
				r.RunOnce(t.Context())
				cond, _ := r.store.Get("CertRenewalFailing")
				if cond.Status != report.StatusUnknown {
					t.Fatalf("condition after the failed run: %+v", cond)
				}
				doc := docOf(t, det, "certs")
				want := []map[string]any{{"check": "CertRenewalFailing", "fields": []any{"certs"},
					"collectedAt": collected.UTC().Format(time.RFC3339), "error": cond.Message}}
				if got := staleOf(t, doc); !reflect.DeepEqual(got, want) || !strings.Contains(doc, "/x.pem") {
					t.Errorf("certs document after a failed run: %s\nstale = %v, want %v", doc, got, want)
				}
				for _, other := range []string{"storage", "disks", "tamper", "services"} {
					if d := docOf(t, det, other); strings.Contains(d, "stale") {
						t.Errorf("%s document names a check that carries none of its fields: %s", other, d)
					}
				}
				synctest.Wait() // the timed-out probe has returned
				now := time.Now()
				r.RunOnce(t.Context())
				// The run that decided collected at now: the same document
				// as the first run's, byte for byte, but its time.
				if d, want := docOf(t, det, "certs"), strings.ReplaceAll(healthy, collected.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)); d != want {
					t.Errorf("certs document after the check decided again:\n%s\nwant\n%s", d, want)
				}
			})
		})
	}
}

// A check that never decided has no fields: nothing is stale (its
// condition says it fails); nor is a field its failed run carried itself
// (a drive whose SMART page could not be read is in the list with its
// error: collected now).
func TestRunnerFailedRunWithoutOldFieldsIsNotStale(t *testing.T) {
	certs := report.Detail{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem", DaysLeft: 40}}}
	ok := Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Details: []report.Detail{certs}}
	for _, tc := range []struct {
		name string
		runs []func(context.Context) (Result, error)
	}{
		{"never decided", []func(context.Context) (Result, error){returns(Result{}, errors.New("cannot read"))}},
		{"failed run carries its fields", []func(context.Context) (Result, error){returns(ok, nil),
			returns(Result{Details: []report.Detail{certs}}, errors.New("/y.pem: cannot read"))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			det := report.NewDetails()
			c := &scripted{runs: tc.runs}
			r, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"CertRenewalFailing"},
				Factories: map[string]Factory{"CertRenewalFailing": fixed(c)}})
			if err != nil {
				t.Fatal(err)
			}
			for range tc.runs {
				r.RunOnce(t.Context())
			}
			if cond, _ := r.store.Get("CertRenewalFailing"); cond.Reason != report.ReasonCheckFailed {
				t.Fatalf("condition after the failed run: %+v", cond)
			}
			if d := docOf(t, det, "certs"); strings.Contains(d, "stale") {
				t.Errorf("certs document: %s", d)
			}
		})
	}
}

// A stale entry's error is its condition's message as the Node carries it
// (report.CapMessage: a control character or a byte not UTF-8 written
// `\xNN`), whole when it is at most report.MaxStaleErrorBytes, else its
// start ending in "…", cut neither inside a `\xNN` nor inside a character.
// A message ending in a byte not UTF-8 lost its end ("stat /data/caf…"), and
// a newline, an ESC or a C1 CSI reached the document raw (a terminal's
// control sequence in `jq -r .stale[0].error`).
func TestStaleErrorIsTheConditionsMessage(t *testing.T) {
	certs := report.Detail{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem", DaysLeft: 40}}}
	ok := Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Details: []report.Detail{certs}}
	msgs := []string{
		"stat /data/caf\xe9",
		"stat /data/caf\xe9:",
		"stat /data/caf\xe9: gone",
		"two errors:\nfirst\x1b]0;title\x07 second\u009b2J",
	}
	// Long messages with a character of several bytes, a control
	// character or a byte not UTF-8 at every place around the cut.
	for i := report.MaxStaleErrorBytes - 12; i <= report.MaxStaleErrorBytes+2; i++ {
		for _, s := range []string{"é", "€", "\x01", "\xe9", "\xe9\xe9"} {
			msgs = append(msgs, strings.Repeat("a", i)+s+strings.Repeat("b", 300))
		}
	}
	for _, msg := range msgs {
		det := report.NewDetails()
		c := &scripted{runs: []func(context.Context) (Result, error){returns(ok, nil), returns(Result{}, errors.New(msg))}}
		r, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"CertRenewalFailing"},
			Factories: map[string]Factory{"CertRenewalFailing": fixed(c)}})
		if err != nil {
			t.Fatal(err)
		}
		r.RunOnce(t.Context())
		r.RunOnce(t.Context())
		cond, _ := r.store.Get("CertRenewalFailing")
		st := staleOf(t, docOf(t, det, "certs"))
		if len(st) != 1 {
			t.Fatalf("%q: stale %v", msg, st)
		}
		got, _ := st[0]["error"].(string)
		if len(cond.Message) <= report.MaxStaleErrorBytes {
			if got != cond.Message {
				t.Errorf("error %q, want the condition's message %q", got, cond.Message)
			}
			continue
		}
		start, cut := strings.CutSuffix(got, "…")
		switch {
		case !cut || len(got) > report.MaxStaleErrorBytes || !utf8.ValidString(got) || !strings.HasPrefix(cond.Message, start):
			t.Errorf("error %q (%d bytes): not the start of the condition's message %q cut to %d bytes", got, len(got), cond.Message, report.MaxStaleErrorBytes)
		case strings.HasSuffix(start, `\`) || strings.HasSuffix(start, `\x`) || len(start) >= 3 && start[len(start)-3:len(start)-1] == `\x`:
			t.Errorf("error %q: cut inside a \\xNN", got)
		case len(start) < report.MaxStaleErrorBytes-len("…")-3:
			t.Errorf("error %q: %d bytes, cut shorter than it need be", got, len(got))
		}
	}
}

// A check that fails for hours: its document's stale entry keeps the time
// of the last run that decided, its error follows the latest failure, and
// the document does not grow run by run (one entry per check, replaced).
func TestStaleAcrossHoursOfFailedRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		det := report.NewDetails()
		res := diskOK
		res.Details = []report.Detail{fsDetail, vgDetail}
		runs := []func(context.Context) (Result, error){returns(res, nil)}
		for i := range 8 {
			runs = append(runs, returns(Result{}, fmt.Errorf("statfs /var: failure %c", 'A'+i/4)))
		}
		r, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"DiskUsageHigh"},
			Factories: map[string]Factory{"DiskUsageHigh": fixed(&scripted{runs: runs})}})
		if err != nil {
			t.Fatal(err)
		}
		collected := time.Now().UTC().Format(time.RFC3339)
		r.RunOnce(t.Context())
		size := 0
		for i := range 8 {
			time.Sleep(time.Hour)
			r.RunOnce(t.Context())
			cond, _ := r.store.Get("DiskUsageHigh")
			doc := docOf(t, det, "storage")
			want := []map[string]any{{"check": "DiskUsageHigh", "fields": []any{"filesystems", "volumeGroups"},
				"collectedAt": collected, "error": cond.Message}}
			if got := staleOf(t, doc); !reflect.DeepEqual(got, want) {
				t.Errorf("failed run %d, %v later: stale = %v, want %v", i+1, time.Duration(i+1)*time.Hour, got, want)
			}
			if !strings.HasSuffix(cond.Message, fmt.Sprintf("failure %c", 'A'+i/4)) {
				t.Errorf("failed run %d: condition %q", i+1, cond.Message)
			}
			if size == 0 {
				size = len(doc)
			} else if len(doc) != size {
				t.Errorf("failed run %d: document of %d bytes, %d after the first: %s", i+1, len(doc), size, doc)
			}
		}
	})
}

// A True held through a failed run (the catalog's hold, at most 2 runs):
// the condition still says True with its own message, and the document
// names its fields stale with the failure, which `status` shows beside the
// held True (HeldFailure).
func TestStaleWhileATrueIsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		det := report.NewDetails()
		certs := report.Detail{Domain: "certs", Field: "certs", Value: []CertInfo{{Path: "/x.pem", DaysLeft: 3, Expiring: true}}}
		expiring := Result{Status: report.StatusTrue, Reason: report.ReasonCertificateExpiringSoon, Message: "/x.pem expires in 3 days", Details: []report.Detail{certs}}
		c := &scripted{runs: []func(context.Context) (Result, error){returns(expiring, nil), returns(Result{}, errors.New("read /x.pem: input/output error"))}}
		r, err := NewRunner(testEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Only: []string{"CertRenewalFailing"},
			Factories: map[string]Factory{"CertRenewalFailing": fixed(c)}})
		if err != nil {
			t.Fatal(err)
		}
		collected := time.Now().UTC().Format(time.RFC3339)
		r.RunOnce(t.Context())
		time.Sleep(time.Hour)
		r.RunOnce(t.Context())
		cond, _ := r.store.Get("CertRenewalFailing")
		if cond.Status != report.StatusTrue || cond.Message != expiring.Message {
			t.Fatalf("condition after one failed run: %+v, want the True held", cond)
		}
		held, _ := r.Holding("CertRenewalFailing")
		doc := docOf(t, det, "certs")
		want := []map[string]any{{"check": "CertRenewalFailing", "fields": []any{"certs"},
			"collectedAt": collected, "error": held.Message}}
		if got := staleOf(t, doc); !reflect.DeepEqual(got, want) || held.Message != "read /x.pem: input/output error" || !strings.Contains(doc, "/x.pem") {
			t.Errorf("certs document while the True is held (held %+v): %s\nstale = %v, want %v", held, doc, got, want)
		}
	})
}

// A reload while a check fails: a check rebuilt (its interval changed)
// keeps its stale entry as it was until its new instance's first run; the
// new instance failing too keeps the time of the last run that decided;
// a check disabled takes its fields and its stale entry with it.
func TestStaleAcrossAReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		det := report.NewDetails()
		res := diskOK
		res.Details = []report.Detail{fsDetail}
		c := &scripted{runs: []func(context.Context) (Result, error){returns(res, nil), returns(Result{}, errors.New("statfs /var: failure"))}}
		factories := map[string]Factory{"DiskUsageHigh": fixed(c)}
		for name, h := range healthy {
			if name != "DiskUsageHigh" {
				factories[name] = fixed(probeFunc(func(context.Context) (Result, error) { return h, nil }))
			}
		}
		r, err := NewRunner(reloadEnv(t, nil), Options{Store: report.NewStore("b"), Details: det, Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		collected := time.Now().UTC().Format(time.RFC3339)
		r.RunOnce(t.Context())
		time.Sleep(time.Hour)
		r.RunOnce(t.Context())
		before := staleOf(t, docOf(t, det, "storage"))
		if len(before) != 1 || before[0]["collectedAt"] != collected {
			t.Fatalf("stale after a failed run: %v", before)
		}
		a, err := r.Apply(reloadEnv(t, func(c *config.Config) { c.Checks.DiskUsageHigh.Interval = config.Duration{Duration: 7 * time.Minute} }))
		if err != nil || len(a.Changed) != 1 || a.Changed[0] != "DiskUsageHigh" {
			t.Fatalf("Apply = %+v, %v", a, err)
		}
		if got := staleOf(t, docOf(t, det, "storage")); !reflect.DeepEqual(got, before) {
			t.Errorf("stale after the check was rebuilt = %v, want %v as before", got, before)
		}
		time.Sleep(time.Hour)
		r.RunOnce(t.Context())
		if got := staleOf(t, docOf(t, det, "storage")); len(got) != 1 || got[0]["collectedAt"] != collected {
			t.Errorf("stale after the new instance failed = %v, want collectedAt %s", got, collected)
		}
		a, err = r.Apply(reloadEnv(t, func(c *config.Config) { c.Checks.DiskUsageHigh.Enabled = false }))
		if err != nil || len(a.Stopped) != 1 {
			t.Fatalf("Apply = %+v, %v", a, err)
		}
		if d := docOf(t, det, "storage"); strings.Contains(d, "stale") || strings.Contains(d, "filesystems") {
			t.Errorf("storage document after the failing check was disabled: %s", d)
		}
	})
}
