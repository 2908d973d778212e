package kube

import (
	"fmt"
	"slices"
	"strings"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
)

// annotationsLimit is what kube-apiserver allows all of an object's
// annotations together, keys and values (apimachinery's
// TotalAnnotationSizeLimitB): a write that would leave more is refused,
// 422 "Too long: may not be more than 262144 bytes".
const annotationsLimit = 256 << 10

// fitOrder is the order in which the report's documents are given the
// Node's room when not all of them fit beside its other annotations: tamper
// first (a security finding, and its tamper.cleared is read back at start:
// report.ReportedClear), then services (the critical units the repairs
// act on), certs, storage, and disks last (the largest: up to 32 drives'
// SMART data).
var fitOrder = []string{"tamper", "services", "certs", "storage", "disks"}

// othersSize is what the Node's annotations other than the report's five
// take of annotationsLimit (a key of another writer's under the report's
// prefix, autopilot.syself.com/foo, counts as another's).
func othersSize(annotations map[string]string) int {
	n := 0
	for k, v := range annotations {
		if !isReportKey(k) {
			n += len(k) + len(v)
		}
	}
	return n
}

func isReportKey(k string) bool {
	name, ok := strings.CutPrefix(k, report.AnnotationPrefix)
	return ok && slices.Contains(fitOrder, name)
}

// fitReport chooses what a refresh writes of docs (the five documents, by
// annotation key) where the Node's other annotations take others bytes:
// in fitOrder, each document whole where it fits beside those chosen
// before and a stub for each domain after it, else its stub
// (stub(domain, its size), a small document saying why it was left out).
// Where not even the stubs fit, the last in fitOrder but tamper are
// removed (nil) until the rest do. The tamper document is never removed:
// its tamper.cleared is the Node's only record of an operator's clear,
// read back at start (report.ReportedClear), and without it a cleared
// finding comes back after a restart. Where not even its stub fits beside
// the whole documents chosen (the other stubs all removed), it is left out
// of the patch, the Node's tamper annotation as it is (tamperNow bytes, key
// and value, 0 where there is none) and asIs true, and the other stubs are
// removed until the rest fit beside it. left names the domains not written
// whole, in fitOrder. All five fit: docs as they are, left empty.
func fitReport(docs map[string]string, others, tamperNow int, stub func(domain string, size int) string) (out map[string]*string, left []string, asIs bool) {
	room := annotationsLimit - others
	out = make(map[string]*string, len(docs))
	cost := func(k, v string) int { return len(k) + len(v) }
	stubs := make(map[string]string, len(fitOrder))
	need := 0 // the documents chosen, and the stubs of those still to choose
	for _, dm := range fitOrder {
		k := report.AnnotationPrefix + dm
		stubs[dm] = stub(dm, len(docs[k]))
		need += cost(k, stubs[dm])
	}
	for _, dm := range fitOrder {
		k := report.AnnotationPrefix + dm
		v := docs[k]
		if grown := need - cost(k, stubs[dm]) + cost(k, v); grown <= room {
			need = grown
			out[k] = &v
			continue
		}
		s := stubs[dm]
		out[k] = &s
		left = append(left, dm)
	}
	if need <= room {
		return out, left, false
	}
	// Not even the stubs fit. The tamper stub, where the other stubs
	// removed leave it no room, gives way to the tamper annotation the Node
	// holds (fitOrder[0] is tamper).
	others5 := 0 // the stubs but tamper's
	for _, dm := range fitOrder[1:] {
		if slices.Contains(left, dm) {
			others5 += cost(report.AnnotationPrefix+dm, stubs[dm])
		}
	}
	if tk := report.AnnotationPrefix + fitOrder[0]; slices.Contains(left, fitOrder[0]) && need-others5 > room {
		need += tamperNow - cost(tk, stubs[fitOrder[0]])
		delete(out, tk)
		asIs = true
	}
	for i := len(fitOrder) - 1; i >= 1 && need > room; i-- {
		dm := fitOrder[i]
		k := report.AnnotationPrefix + dm
		if slices.Contains(left, dm) {
			need -= cost(k, stubs[dm])
			out[k] = nil
		}
	}
	return out, left, asIs
}

// leftOutWhy is what a stub says of a document of size bytes that did not
// fit (fitReport).
func leftOutWhy(size int) string {
	return fmt.Sprintf("not written: the document (%d bytes) does not fit on the Node beside its other annotations (%d bytes together); its fields are back at the first refresh with room",
		size, annotationsLimit)
}

// allOf is docs as a patch's values.
func allOf(docs map[string]string) map[string]*string {
	out := make(map[string]*string, len(docs))
	for k, v := range docs {
		out[k] = &v
	}
	return out
}

// fitted records what a refresh that landed left out (fitReport; none:
// the whole report), n the API server's answer: while documents are left
// out, the next refresh chooses by the room its answer shows (no read of
// the Node), and the journal says which once per change of them.
// asIs: the Node's tamper annotation was left as it is (fitReport), said
// in the journal once per change too.
func (r *Reporter) fitted(n *kubeapi.Node, left []string, room int, asIs bool) {
	r.fitShort = len(left) > 0
	r.m.setLeftOut(left, asIs)
	if r.fitShort && n != nil {
		r.fitOthers, r.fitTamper = othersSize(n.Metadata.Annotations), tamperSize(n.Metadata.Annotations)
	}
	for _, dm := range left {
		r.m.leftOut.WithLabelValues(dm).Inc()
	}
	key := strings.Join(left, ",")
	if asIs {
		key += " tamper as it is"
	}
	if key == r.leftOutLogged {
		return
	}
	r.leftOutLogged = key
	if len(left) == 0 {
		r.o.Log.Info("report documents fit on the Node again: the whole report written", "node", r.o.NodeName)
		return
	}
	if asIs {
		r.o.Log.Warn("report documents left out: they do not fit on the Node beside its other annotations (262144 bytes together), not even the tamper document's stub; the Node's tamper annotation is left as it is (neither written nor removed: its tamper.cleared is the record of an operator's clear), the other documents left out are small documents saying so (removed where not even that fits), the others are written whole",
			"node", r.o.NodeName, "left_out", left, "tamper_left_as_is", true, "room_bytes", room)
		return
	}
	r.o.Log.Warn("report documents left out: they do not fit on the Node beside its other annotations (262144 bytes together); each is a small document saying so (removed where not even that fits, but the tamper document: then the Node's is left as it is), the others are written whole",
		"node", r.o.NodeName, "left_out", left, "room_bytes", room)
}

// tamperSize is what the Node's tamper annotation takes, key and value (0
// where there is none): what stays where it is left as it is (fitReport).
func tamperSize(annotations map[string]string) int {
	k := report.AnnotationPrefix + fitOrder[0]
	if v, ok := annotations[k]; ok {
		return len(k) + len(v)
	}
	return 0
}
