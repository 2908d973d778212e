package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// The health report: one Node annotation per domain, each a self-contained
// JSON document.
const (
	AnnotationPrefix = "autopilot.syself.com/"
	// SchemaVersion is written into every document as "schemaVersion"; it
	// changes when a field changes meaning or is removed.
	SchemaVersion = 1
	// MaxListLen caps every list in a document; the number left out is
	// written as "<field>Truncated".
	MaxListLen = 32
	// MaxDocumentBytes caps one document; lists are shortened further until
	// it fits. The API server limits all annotations of an object to 256 KiB
	// together.
	MaxDocumentBytes = 8 * 1024
	// MaxEntryBytes: in a document over MaxDocumentBytes, a list entry
	// larger than this (a mount point or an error of kilobytes) has its
	// long strings shortened until it is not, before any list is cut, so
	// that it costs the room of about one entry, not entries of every list
	// in its document (shortenEntries).
	MaxEntryBytes = 512
	// minShortString: a string is never shortened below this many bytes.
	minShortString = 64
	// MaxStaleErrorBytes caps the error of a "stale" entry (Failed): the
	// list counts toward its document's MaxDocumentBytes and is never cut.
	MaxStaleErrorBytes = 256
)

// Domains are the report's domains, in annotation order, with the fields
// each may carry (a field is absent until something collected it).
var Domains = []struct {
	Name   string
	Fields []string
}{
	{"storage", []string{"filesystems", "volumeGroups"}},
	{"disks", []string{"disks"}},
	{"certs", []string{"certs"}},
	{"tamper", []string{"tamper"}},
	{"services", []string{"services", "operabilityServices"}},
}

// Detail is one field of a report domain, produced by a check.
type Detail struct {
	Domain string
	Field  string
	Value  any
}

// Details holds the latest value of every report field. Safe for concurrent use.
//
// A field a check collects is owned by its condition type (SetFor,
// Replace): it is in the documents while at least one condition's latest
// result carries it, and removed once none does (Replace, Drop), so that
// a document never shows data no check stands for any more under a fresh
// updatedAt. A field set with Set alone has no owner and stays.
//
// A check whose latest run failed (Failed) keeps the fields it collected
// before: its documents name it in "stale" (Stale) until a run of it
// decides again (Replace) or it stops (Drop).
type Details struct {
	mu     sync.Mutex
	data   map[string]map[string]any
	bootID string
	// byCond holds, per condition type, the fields its check's latest
	// result carried, with their values: the evidence `status` shows.
	byCond map[string]map[fieldKey]owned
	// failed holds, per condition type whose check's latest run failed,
	// that failure (Failed); empty on a healthy node.
	failed map[string]failure
	// seq orders the values set (owned.seq).
	seq uint64
	// now is the clock of owned.at.
	now func() time.Time
}

// failure is the latest run of a check that failed (Failed).
type failure struct {
	// seq: d.seq before the run's own fields were set: the check's fields
	// of a lower or equal seq are from an earlier run.
	seq uint64
	// err: why the run failed, as its document writes it.
	err string
	// decided: the check's fields as its last run that decided left them
	// (Replace), before the failed runs since set theirs over them: what
	// `status` shows as the evidence of a True held through those runs
	// (DecidedEvidence). Taken at the first failed run in a row, so a
	// healthy node's runs copy nothing.
	decided map[string]any
}

// Stale is an entry of a document's "stale" list: a check whose latest run
// failed (an error, a timeout, a panic) and whose fields the document still
// carries as an earlier run collected them, under the fresh updatedAt of
// every refresh.
type Stale struct {
	// Check is the condition type of the check.
	Check string `json:"check"`
	// Fields are its fields in the document that are from an earlier run,
	// in the domain's field order.
	Fields []string `json:"fields"`
	// CollectedAt is when the oldest of them was collected (RFC 3339):
	// the last run of the check that decided, or an earlier failed run
	// that carried them.
	CollectedAt string `json:"collectedAt"`
	// Error is why its latest run failed: its condition's message as the
	// Node carries it (Printable), at most MaxStaleErrorBytes.
	Error string `json:"error"`
}

// fieldKey names a report field.
type fieldKey struct{ domain, field string }

// owned is a field's value as one condition's check last carried it.
type owned struct {
	value any
	// seq: when it was set; of the values the owners of a shared field
	// carry, the latest set is the field's value.
	seq uint64
	// at: when it was set (Stale.CollectedAt).
	at time.Time
}

// SetBootID sets the boot the documents are written in (their bootID): a
// daemon that starts again in the same boot knows from it that the Node's
// conditions were written in this boot.
func (d *Details) SetBootID(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.bootID = id
}

// BootID returns the boot the documents are written in (SetBootID).
func (d *Details) BootID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bootID
}

// ReportBootID returns the bootID of the report documents among a Node's
// annotations ("" when there is none, e.g. written by an older version).
func ReportBootID(annotations map[string]string) string {
	for _, dm := range Domains {
		var doc struct {
			BootID string `json:"bootID"`
		}
		if json.Unmarshal([]byte(annotations[AnnotationPrefix+dm.Name]), &doc) == nil && doc.BootID != "" {
			return doc.BootID
		}
	}
	return ""
}

// ReportedClear returns when the tamper conditions were last cleared by an
// operator, as the daemon published it in the tamper report among a Node's
// annotations (tamper.cleared.at; zero when there is none). Only the daemon
// (with the node's credentials) writes that annotation, so unlike the tamper
// state file on the host it corroborates a clear.
func ReportedClear(annotations map[string]string) time.Time {
	var doc struct {
		Tamper struct {
			Cleared *struct {
				At time.Time `json:"at"`
			} `json:"cleared"`
		} `json:"tamper"`
	}
	if json.Unmarshal([]byte(annotations[AnnotationPrefix+"tamper"]), &doc) != nil || doc.Tamper.Cleared == nil {
		return time.Time{}
	}
	return doc.Tamper.Cleared.At
}

// NewDetails returns an empty set of report details.
func NewDetails() *Details {
	return &Details{data: map[string]map[string]any{}, byCond: map[string]map[fieldKey]owned{},
		failed: map[string]failure{}, now: time.Now}
}

// SetFor is Set, recording the field as evidence of condType too: the
// check of that condition collected it (see Evidence). It adds to what
// condType's check carried; Replace records a whole result.
func (d *Details) SetFor(condType string, x Detail) {
	mustValid(x)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setForLocked(condType, x)
}

// Replace records the fields the latest result of condType's check carried
// (none: it collected nothing, or it stopped: Drop), a run that decided:
// they replace those of its previous result, and none of them is stale. A field the previous result carried and ds does not is
// no longer condType's evidence, and leaves the documents unless another
// condition's check still carries it (its value is then the one that
// check carried). It panics on a field that is not part of the schema
// (a programming error), before changing anything.
func (d *Details) Replace(condType string, ds []Detail) {
	for _, x := range ds {
		mustValid(x)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.byCond[condType]
	delete(d.byCond, condType)
	delete(d.failed, condType)
	for _, x := range ds {
		d.setForLocked(condType, x)
	}
	for k := range old {
		if _, still := d.byCond[condType][k]; !still {
			d.forgetLocked(k)
		}
	}
}

// Failed records a run of condType's check that failed (an error, a
// timeout, a panic, a reason outside the catalog), why being its
// condition's message: the fields it collected (ds, e.g. a drive whose
// SMART page could not be read, with its error) are set as SetFor sets
// them, and the check's other fields stay as an earlier run collected
// them, stale: their documents say so (Stale) until a run that decides
// replaces them (Replace) or the check stops (Drop). A check that carries
// no field from an earlier run has nothing stale (its condition says it
// fails). It panics as Replace does.
func (d *Details) Failed(condType string, ds []Detail, why string) {
	for _, x := range ds {
		mustValid(x)
	}
	// As the Node's condition carries it (CapMessage): no control
	// character (a newline, an ESC) reaches a reader's terminal.
	why = Printable(why)
	d.mu.Lock()
	defer d.mu.Unlock()
	decided := d.failed[condType].decided
	if _, again := d.failed[condType]; !again {
		decided = d.fieldsLocked(condType, func(owned) bool { return true })
	}
	d.failed[condType] = failure{seq: d.seq, err: cutEscaped(why, MaxStaleErrorBytes), decided: decided}
	for _, x := range ds {
		d.setForLocked(condType, x)
	}
}

// Stale returns the "stale" list of domain's document: the checks whose
// latest run failed (Failed) and that carry fields of domain from an
// earlier run, by check name; nil when there are none (a healthy node's).
func (d *Details) Stale(domain string) []Stale {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.staleLocked(domain)
}

// staleLocked is Stale; d.mu is held.
func (d *Details) staleLocked(domain string) []Stale {
	if len(d.failed) == 0 {
		return nil
	}
	var out []Stale
	for _, cond := range slices.Sorted(maps.Keys(d.failed)) {
		f := d.failed[cond]
		var e Stale
		var oldest time.Time
		for _, field := range domainFields(domain) {
			o, ok := d.byCond[cond][fieldKey{domain, field}]
			if !ok || o.seq > f.seq {
				continue // not carried, or by the failed run itself
			}
			e.Fields = append(e.Fields, field)
			if oldest.IsZero() || o.at.Before(oldest) {
				oldest = o.at
			}
		}
		if len(e.Fields) == 0 {
			continue
		}
		e.Check, e.Error = cond, f.err
		e.CollectedAt = oldest.UTC().Format(time.RFC3339)
		out = append(out, e)
	}
	return out
}

// domainFields returns the fields of domain, in their order (Domains).
func domainFields(domain string) []string {
	for _, dm := range Domains {
		if dm.Name == domain {
			return dm.Fields
		}
	}
	return nil
}

// Drop removes the fields of condType's check (it no longer runs): as
// Replace with no fields.
func (d *Details) Drop(condType string) {
	d.Replace(condType, nil)
}

// setForLocked records x as the latest value of its field, carried by
// condType's check. d.mu is held.
func (d *Details) setForLocked(condType string, x Detail) {
	d.setLocked(x)
	if d.byCond[condType] == nil {
		d.byCond[condType] = map[fieldKey]owned{}
	}
	d.seq++
	d.byCond[condType][fieldKey{x.Domain, x.Field}] = owned{x.Value, d.seq, d.now()}
}

// forgetLocked removes field k from the documents once no condition's
// check carries it; while one does, its value is the latest set of those
// they carry (of Snapshots, the latest taken). d.mu is held.
func (d *Details) forgetLocked(k fieldKey) {
	var best *owned
	for _, fs := range d.byCond {
		if o, ok := fs[k]; ok && (best == nil || takenBefore(best.value, o.value) || (o.seq > best.seq && !takenBefore(o.value, best.value))) {
			best = &o
		}
	}
	if best != nil {
		d.data[k.domain][k.field] = best.value
		return
	}
	delete(d.data[k.domain], k.field)
	if len(d.data[k.domain]) == 0 {
		delete(d.data, k.domain)
	}
}

// Evidence returns the report fields the latest result of condType's check
// carried, keyed "domain.field" (nil when none), a name that is not UTF-8
// written `\xNN` as in the documents (utf8Fields): `status` shows them.
// After a failed run they are what it collected over what the last run
// that decided did (Failed).
func (d *Details) Evidence(condType string) map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	return utf8Fields(d.fieldsLocked(condType, func(owned) bool { return true }))
}

// DecidedEvidence returns the report fields of condType's check as its
// last run that decided left them, keyed as Evidence keys them, before
// the failed runs since (Failed) set what they collected over them; the
// same as Evidence while its latest run decided. `status` shows them as
// the evidence of a True held through failed runs: a failed run's fields
// (a certificate file's "not a regular file") are not what decided True.
func (d *Details) DecidedEvidence(condType string) map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, failed := d.failed[condType]
	if !failed {
		return utf8Fields(d.fieldsLocked(condType, func(owned) bool { return true }))
	}
	if len(f.decided) == 0 {
		return nil
	}
	return utf8Fields(maps.Clone(f.decided))
}

// FailedRunEvidence returns the report fields the latest run of condType's
// check collected although it failed (Failed), keyed as Evidence keys
// them; nil when its latest run decided, or collected nothing.
func (d *Details) FailedRunEvidence(condType string) map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, failed := d.failed[condType]
	if !failed {
		return nil
	}
	return utf8Fields(d.fieldsLocked(condType, func(o owned) bool { return o.seq > f.seq }))
}

// fieldsLocked is condType's fields that keep selects, keyed
// "domain.field", a new map; nil when none. d.mu is held.
func (d *Details) fieldsLocked(condType string, keep func(owned) bool) map[string]any {
	var out map[string]any
	for k, o := range d.byCond[condType] {
		if !keep(o) {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(d.byCond[condType]))
		}
		out[k.domain+"."+k.field] = o.value
	}
	return out
}

// Set records the latest value of a field. It panics on a domain or field
// that is not part of the schema (a programming error).
func (d *Details) Set(x Detail) {
	mustValid(x)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setLocked(x)
}

func (d *Details) setLocked(x Detail) {
	if d.data[x.Domain] == nil {
		d.data[x.Domain] = map[string]any{}
	}
	if old, ok := d.data[x.Domain][x.Field]; ok && takenBefore(x.Value, old) {
		// A snapshot of a shared source taken before the one the field
		// holds, set after it (two checks' runs side by side): the field
		// keeps the later one. The setter's ownership is recorded all
		// the same (setForLocked).
		return
	}
	d.data[x.Domain][x.Field] = x.Value
}

// Snapshot is a report field's value read from a source that several
// checks share (the tamper state: NodeTampered and SealedOSTampered both
// carry its report): Taken orders the snapshots the source gave, later
// ones greater. Of two snapshots of one field, the one taken later is the
// field's value, whichever check's result was recorded last: one check's
// run may read the source, another's change it and be recorded, and the
// first's be recorded after it, and its older snapshot would otherwise
// stand until one of them runs again.
type Snapshot interface {
	Taken() uint64
}

// takenBefore reports whether v is a Snapshot taken before old's.
func takenBefore(v, old any) bool {
	a, ok := v.(Snapshot)
	if !ok {
		return false
	}
	b, ok := old.(Snapshot)
	return ok && a.Taken() < b.Taken()
}

func mustValid(x Detail) {
	if !validField(x.Domain, x.Field) {
		panic(fmt.Sprintf("report: %s.%s is not a report field", x.Domain, x.Field))
	}
}

func validField(domain, field string) bool {
	for _, dm := range Domains {
		if dm.Name == domain {
			for _, f := range dm.Fields {
				if f == field {
					return true
				}
			}
		}
	}
	return false
}

// Shrinker is a report field that knows how to shorten itself when its
// document is over MaxDocumentBytes (a struct whose lists renderDocument
// cannot cut): Shrink returns the value with at most limit entries in each
// of its lists (the number left out recorded in the value).
type Shrinker interface {
	Shrink(limit int) any
}

// Problem is a list entry that knows whether it is a problem (a drive
// with a critical warning, a filesystem over its threshold, a certificate
// about to expire, a failed unit): when its list must be cut to fit a
// document, the problem entries are kept first, so that the entry a
// condition names is in the report (cut).
type Problem interface {
	Problem() bool
}

// Unread is a problem entry that may be a problem only for not having been
// read (a filesystem whose statfs failed): when there are more problem
// entries than room, those that are not unread (over a threshold: what the
// condition's True is about) are kept before it (cut).
type Unread interface {
	Unread() bool
}

// cut returns a list's limit entries to keep: every problem entry (the
// first limit of them, when there are more, those not Unread first), and
// as many of the others as there is room for, in list order; the kept
// entries in their order in the list. A list without problem entries
// keeps its first limit entries.
func cut(list reflect.Value, limit int) reflect.Value {
	n := list.Len()
	// rank: 2 a problem entry, 1 one that is a problem for not having
	// been read (Unread), 0 the others.
	rank := make([]int, n)
	problems, unread := 0, 0
	for i := range n {
		e := list.Index(i)
		if (e.Kind() == reflect.Pointer || e.Kind() == reflect.Interface) && e.IsNil() {
			continue
		}
		if p, ok := e.Interface().(Problem); ok && p.Problem() {
			rank[i] = 2
			problems++
			if u, ok := e.Interface().(Unread); ok && u.Unread() {
				rank[i] = 1
				unread++
			}
		}
	}
	if problems == 0 {
		return list.Slice(0, limit)
	}
	// room per rank, taken in rank order.
	var room [3]int
	left := limit
	room[2] = min(problems-unread, left)
	left -= room[2]
	room[1] = min(unread, left)
	left -= room[1]
	room[0] = left
	kept := reflect.MakeSlice(list.Type(), 0, limit)
	for i := 0; i < n && kept.Len() < limit; i++ {
		if room[rank[i]] == 0 {
			continue
		}
		room[rank[i]]--
		kept = reflect.Append(kept, list.Index(i))
	}
	return kept
}

// Documents renders every domain as its annotation value, keyed by the full
// annotation key. A domain that cannot be rendered does not hold back the
// others: it gets a small document saying why ("error"), and the returned
// error names it (for the log); the map is complete either way. A document
// whose fields are partly from before a failed run of their check has
// "stale" saying so (Stale); a healthy node's have none.
func (d *Details) Documents(now time.Time, role Role) (map[string]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]string, len(Domains))
	var errs []error
	for _, dm := range Domains {
		b, err := renderDocument(now, role, d.bootID, d.data[dm.Name], d.staleLocked(dm.Name))
		if err != nil {
			errs = append(errs, fmt.Errorf("report domain %s: %w", dm.Name, err))
			b, _ = renderDocument(now, role, d.bootID, map[string]any{"error": truncateString(err.Error(), 512)}, nil)
		}
		out[AnnotationPrefix+dm.Name] = string(b)
	}
	return out, errors.Join(errs...)
}

// LeftOutDocument renders the document written in place of a domain's
// when it does not fit on the Node (the reporter's choice): self-contained
// as every document is (schemaVersion, updatedAt, role, bootID), with
// "leftOut" saying why instead of the domain's fields. doc is the document
// left out: of the tamper domain's, the operator's clear it published
// (tamper.cleared, read back at start: ReportedClear) is kept, so that a
// restart while the document is left out does not lose the clear.
func LeftOutDocument(now time.Time, role Role, bootID, domain, doc, why string) string {
	fields := map[string]any{"leftOut": why}
	if domain == "tamper" {
		var d struct {
			Tamper struct {
				Cleared json.RawMessage `json:"cleared"`
			} `json:"tamper"`
		}
		if json.Unmarshal([]byte(doc), &d) == nil && len(d.Tamper.Cleared) > 0 && string(d.Tamper.Cleared) != "null" {
			fields["tamper"] = map[string]any{"cleared": d.Tamper.Cleared}
		}
	}
	b, _ := renderCapped(now, role, bootID, fields, nil, MaxListLen)
	return string(b)
}

// truncateString cuts s to at most n bytes (on a rune boundary), ending
// in "…" when cut (Cut).
func truncateString(s string, n int) string { return Cut(s, n, "…") }

// Cut cuts s to at most n bytes, ending in ell when cut, on a rune
// boundary. The cut steps back over at most the continuation bytes of one
// rune: in a string that is not valid UTF-8 (a name in Latin-1, whose "°"
// is the byte 0xB0), a run of such bytes is not a rune, and stepping back
// over all of it left nothing of the string but its start
// (TestShortenedInvalidUTF8KeepsItsStart, TestCutKeepsTheStartOfInvalidUTF8).
func Cut(s string, n int, ell string) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(ell), 0)
	for back := 1; back < utf8.UTFMax && cut-back >= 0; back++ {
		if utf8.RuneStart(s[cut-back+1]) {
			break
		}
		if b := s[cut-back]; utf8.RuneStart(b) {
			if b >= 0xC0 { // the lead byte of a rune of several bytes
				cut -= back
			}
			break
		}
	}
	return s[:cut] + ell
}

// renderDocument renders one domain's document: every list capped at
// MaxListLen entries, and when that is over MaxDocumentBytes, with its
// entries over MaxEntryBytes shortened (shortenEntries) and, when still
// over, at the largest cap under which it fits (a binary search: the size
// grows with the cap), so that a document a few entries over keeps all but
// those few. stale, when not empty, is written as "stale", whole: it counts
// toward the document's size, and is never cut (a few entries of at most
// MaxStaleErrorBytes of error each: one per check of the domain).
func renderDocument(now time.Time, role Role, bootID string, fields map[string]any, stale []Stale) ([]byte, error) {
	fields = utf8Fields(fields)
	b, err := renderCapped(now, role, bootID, fields, stale, MaxListLen)
	if err != nil || len(b) <= MaxDocumentBytes {
		return b, err
	}
	// Over: an oversized entry gives up its long strings first.
	if short, changed := shortenEntries(fields); changed {
		fields = short
		b, err = renderCapped(now, role, bootID, fields, stale, MaxListLen)
		if err != nil || len(b) <= MaxDocumentBytes {
			return b, err
		}
	}
	// fits is the largest cap known to fit (its document fit), over the
	// smallest known not to.
	fits, over := -1, MaxListLen
	var fit []byte
	overLen := len(b) // the size of the document at the cap over
	for over-fits > 1 {
		limit := fits + (over-fits)/2
		b, err := renderCapped(now, role, bootID, fields, stale, limit)
		if err != nil {
			return nil, err
		}
		if len(b) <= MaxDocumentBytes {
			fits, fit = limit, b
		} else {
			over, overLen = limit, len(b)
		}
	}
	if fit == nil {
		return nil, fmt.Errorf("document is %d bytes even without list entries (limit %d)", overLen, MaxDocumentBytes)
	}
	return fit, nil
}

// renderCapped renders a document with at most limit entries in each list,
// the problem entries kept first (cut).
func renderCapped(now time.Time, role Role, bootID string, fields map[string]any, stale []Stale, limit int) ([]byte, error) {
	doc := map[string]any{
		"schemaVersion": SchemaVersion,
		"updatedAt":     now.UTC().Format(time.RFC3339),
		"role":          role,
	}
	if bootID != "" {
		doc["bootID"] = bootID
	}
	if len(stale) > 0 {
		doc["stale"] = stale
	}
	for k, v := range fields {
		if sh, ok := v.(Shrinker); ok && limit < MaxListLen {
			v = sh.Shrink(limit)
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			// A list collected empty is [], an answer ("none"): null
			// reads as the absent field of "no data yet" (jq, a Go
			// client's slice).
			v = reflect.MakeSlice(rv.Type(), 0, 0).Interface()
		}
		if rv.Kind() == reflect.Slice && rv.Len() > limit {
			doc[k+"Truncated"] = rv.Len() - limit
			v = cut(rv, limit).Interface()
		}
		doc[k] = v
	}
	b, err := json.Marshal(doc)
	// A name in the report is anyone's (a file's): its C1 controls
	// and DEL as \u escapes, not raw into `kubectl describe node`.
	return PrintableJSON(b), err
}

// shortenEntries returns fields with every list entry over MaxEntryBytes
// (as the document writes it) shortened by shortenEntry; the values it
// changes are copies (fields and its lists are the Details' own), and
// changed reports whether there were any.
func shortenEntries(fields map[string]any) (out map[string]any, changed bool) {
	out = fields
	for k, v := range fields {
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Slice {
			continue
		}
		var list reflect.Value
		for i := range rv.Len() {
			e, ok := shortenEntry(rv.Index(i))
			if !ok {
				continue
			}
			if !list.IsValid() {
				list = reflect.MakeSlice(rv.Type(), rv.Len(), rv.Len())
				reflect.Copy(list, rv)
			}
			list.Index(i).Set(e)
		}
		if !list.IsValid() {
			continue
		}
		if !changed {
			out = maps.Clone(fields)
			changed = true
		}
		out[k] = list.Interface()
	}
	return out, changed
}

// shortenEntry returns a list entry over MaxEntryBytes with its strings
// cut to the longest length (not under minShortString bytes) at which the
// entry fits, ending in "…" (truncateString): the longest strings are cut,
// the short ones (a device, a state) kept whole. ok is false for an entry
// that is not over, or has no string to shorten.
func shortenEntry(e reflect.Value) (reflect.Value, bool) {
	if entrySize(e) <= MaxEntryBytes {
		return e, false
	}
	longest := longestString(e)
	if longest <= minShortString {
		return e, false
	}
	// The longest cap under which the entry fits, between minShortString
	// (used when none does) and longest (over: the entry as it is).
	lo, hi := minShortString, longest
	best, _ := shortenStrings(e, lo)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		c, _ := shortenStrings(e, mid)
		if entrySize(c) <= MaxEntryBytes {
			lo, best = mid, c
		} else {
			hi = mid
		}
	}
	return best, true
}

// entrySize is the size of a list entry as its document writes it.
func entrySize(e reflect.Value) int {
	b, err := json.Marshal(e.Interface())
	if err != nil {
		return 0 // the document's render reports it
	}
	return len(PrintableJSON(b))
}

// longestString is the length in bytes of the longest string in v.
func longestString(v reflect.Value) int {
	n := 0
	switch v.Kind() {
	case reflect.String:
		n = v.Len()
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				n = max(n, longestString(v.Field(i)))
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			n = max(n, longestString(v.Index(i)))
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			n = longestString(v.Elem())
		}
	}
	return n
}

// utf8Fields returns fields with every string that is not valid UTF-8 (a
// file's or a mount point's name is bytes, in whatever encoding its
// creator used) written as Printable writes its bytes that are not UTF-8:
// `\xNN`, as the condition's message names it. encoding/json wrote each
// such byte as U+FFFD, so that a Latin-1 "café" and "cafè" were one name
// in the document, and matched neither the message nor the file
// (TestTamperDocumentNamesFilesNotUTF8AsTheMessageDoes). The values it
// changes are copies: fields and its values are the Details' own.
func utf8Fields(fields map[string]any) map[string]any {
	out, copied := fields, false
	for k, v := range fields {
		if v == nil {
			continue
		}
		c, ok := mapStrings(reflect.ValueOf(v), escapeNotUTF8)
		if !ok {
			continue
		}
		if !copied {
			out, copied = maps.Clone(fields), true
		}
		out[k] = c.Interface()
	}
	return out
}

// escapeNotUTF8 writes every byte of s that is not part of valid UTF-8 as
// `\xNN` (Printable's form), the rest as it is; ok is false when s is
// valid UTF-8 (unchanged).
func escapeNotUTF8(s string) (string, bool) {
	if utf8.ValidString(s) {
		return s, false
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[s[i]>>4])
			b.WriteByte(hexDigits[s[i]&0xf])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String(), true
}

// shortenStrings returns v with every string in it (in its exported
// fields, lists, pointers) longer than n bytes cut to n (cutEscaped);
// what it changes is a copy, v is left as it is. changed reports whether
// any string was cut.
func shortenStrings(v reflect.Value, n int) (out reflect.Value, changed bool) {
	return mapStrings(v, func(s string) (string, bool) {
		if len(s) <= n {
			return s, false
		}
		return cutEscaped(s, n), true
	})
}

// cutEscaped is truncateString for a string whose bytes that are not
// UTF-8 utf8Fields wrote `\xNN`: the cut does not split a `\xNN` (a name
// ending "\xb…" or "\x…"), as a message's cap does not (CapMessage;
// TestShortenedNameNotUTF8KeepsWholeEscapes). A string of at most n bytes
// is s as it is, an escape at its end included
// (TestStaleErrorIsTheConditionsMessage).
func cutEscaped(s string, n int) string {
	if len(s) <= n {
		return s
	}
	c := truncateString(s, n)
	cut := len(c) - len("…")
	for k := 1; k <= 3 && k <= cut; k++ {
		if s[cut-k] == '\\' && s[cut-k+1] == 'x' {
			return s[:cut-k] + "…"
		}
	}
	return c
}

// mapStrings returns v with every string in it (in its exported fields,
// lists, map values, pointers) replaced by f's result where f reports a
// change; what it changes is a copy, v is left as it is. changed reports
// whether any string changed.
func mapStrings(v reflect.Value, f func(string) (string, bool)) (out reflect.Value, changed bool) {
	switch v.Kind() {
	case reflect.String:
		s, ok := f(v.String())
		if !ok {
			return v, false
		}
		c := reflect.New(v.Type()).Elem()
		c.SetString(s)
		return c, true
	case reflect.Map:
		var c reflect.Value
		for it := v.MapRange(); it.Next(); {
			e, ok := mapStrings(it.Value(), f)
			if !ok {
				continue
			}
			if !c.IsValid() {
				c = reflect.MakeMapWithSize(v.Type(), v.Len())
				for it2 := v.MapRange(); it2.Next(); {
					c.SetMapIndex(it2.Key(), it2.Value())
				}
			}
			c.SetMapIndex(it.Key(), e)
		}
		if c.IsValid() {
			return c, true
		}
	case reflect.Struct:
		var c reflect.Value
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				continue
			}
			f, ok := mapStrings(v.Field(i), f)
			if !ok {
				continue
			}
			if !c.IsValid() {
				c = reflect.New(v.Type()).Elem()
				c.Set(v)
			}
			c.Field(i).Set(f)
		}
		if c.IsValid() {
			return c, true
		}
	case reflect.Slice:
		var c reflect.Value
		for i := range v.Len() {
			e, ok := mapStrings(v.Index(i), f)
			if !ok {
				continue
			}
			if !c.IsValid() {
				c = reflect.MakeSlice(v.Type(), v.Len(), v.Len())
				reflect.Copy(c, v)
			}
			c.Index(i).Set(e)
		}
		if c.IsValid() {
			return c, true
		}
	case reflect.Pointer:
		if v.IsNil() {
			break
		}
		if e, ok := mapStrings(v.Elem(), f); ok {
			p := reflect.New(v.Type().Elem())
			p.Elem().Set(e)
			return p, true
		}
	case reflect.Interface:
		if v.IsNil() {
			break
		}
		if e, ok := mapStrings(v.Elem(), f); ok {
			c := reflect.New(v.Type()).Elem()
			c.Set(e)
			return c, true
		}
	}
	return v, false
}
