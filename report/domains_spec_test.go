package report

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// The spec's "Reading conditions and the health report": five annotation
// keys under autopilot.syself.com/, one per domain, each a self-contained
// JSON document carrying updatedAt and role ("controlplane | worker") plus
// that one domain's fields. Written out here again rather than read from
// Domains, so that a renamed key, a renamed field or a sixth key fails: the
// other report tests iterate Domains, and would follow it.
func TestReportDomainsMatchSpec(t *testing.T) {
	spec := map[string][]string{
		"storage":  {"filesystems", "volumeGroups"},
		"disks":    {"disks"},
		"certs":    {"certs"},
		"tamper":   {"tamper"},
		"services": {"services"},
	}
	if AnnotationPrefix != "autopilot.syself.com/" {
		t.Errorf("annotation prefix %q, the spec's is autopilot.syself.com/", AnnotationPrefix)
	}
	if len(Domains) != len(spec) {
		t.Errorf("%d report domains, the spec has five", len(Domains))
	}
	d := NewDetails()
	for _, dm := range Domains {
		fields, ok := spec[dm.Name]
		if !ok {
			t.Errorf("report domain %s is not one of the spec's", dm.Name)
			continue
		}
		for _, f := range fields {
			// The spec's fields are the domain's; it may carry more
			// (services also has operabilityServices: NodeServiceDown's).
			if !slices.Contains(dm.Fields, f) {
				t.Errorf("report domain %s lacks the spec's field %s (has %v)", dm.Name, f, dm.Fields)
				continue
			}
			d.Set(Detail{Domain: dm.Name, Field: f, Value: []string{"x"}})
		}
	}
	if RoleControlPlane != "controlplane" || RoleWorker != "worker" {
		t.Errorf("roles %q and %q, the spec's are controlplane and worker", RoleControlPlane, RoleWorker)
	}
	now := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	for _, role := range []Role{RoleControlPlane, RoleWorker} {
		docs, err := d.Documents(now, role)
		if err != nil {
			t.Fatal(err)
		}
		for name, fields := range spec {
			key := "autopilot.syself.com/" + name
			v, ok := docs[key]
			if !ok {
				t.Errorf("%s: no %s annotation", role, key)
				continue
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(v), &doc); err != nil {
				t.Errorf("%s: %v: %s", key, err, v)
				continue
			}
			if at, err := time.Parse(time.RFC3339, asString(doc["updatedAt"])); err != nil || !at.Equal(now) {
				t.Errorf("%s: updatedAt %v, want %s: %s", key, doc["updatedAt"], now.Format(time.RFC3339), v)
			}
			if doc["role"] != string(role) {
				t.Errorf("%s: role %v, want %s", key, doc["role"], role)
			}
			for _, f := range fields {
				if _, ok := doc[f]; !ok {
					t.Errorf("%s: no %s: %s", key, f, v)
				}
			}
		}
		for key := range docs {
			if !strings.HasPrefix(key, "autopilot.syself.com/") || spec[strings.TrimPrefix(key, "autopilot.syself.com/")] == nil {
				t.Errorf("%s: annotation %s is not one of the spec's five", role, key)
			}
		}
	}
}

func asString(v any) string { s, _ := v.(string); return s }
