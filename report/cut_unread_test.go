package report

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// unreadEntry is a list entry that is a problem when over its threshold
// or not read (Unread).
type unreadEntry struct {
	Name   string
	Over   bool
	NoRead bool
}

func (e unreadEntry) Problem() bool { return e.Over || e.NoRead }
func (e unreadEntry) Unread() bool  { return e.NoRead && !e.Over }

// A list with more problem entries than room keeps those over their
// thresholds (what a condition's True is about) before those that are
// problems only for not having been read, then the unread ones in list
// order, then the others; the kept entries in list order. Fails when cut
// ranks them alike (the first problems in list order: nothing over its
// threshold kept of 40 unread entries listed before it).
func TestCutKeepsProblemsBeforeUnreadOnes(t *testing.T) {
	names := func(v reflect.Value) string {
		var out []string
		for i := range v.Len() {
			out = append(out, v.Index(i).Interface().(unreadEntry).Name)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name  string
		n     int
		over  []int
		unrd  []int
		limit int
		want  string
	}{
		{"unread fill the room before the over one", 8, []int{7}, []int{0, 1, 2, 3, 4, 5}, 3, "e0 e1 e7"},
		{"unread before the healthy", 8, []int{6}, []int{5, 7}, 4, "e0 e5 e6 e7"},
		{"more over than room", 6, []int{3, 4, 5}, []int{0}, 2, "e3 e4"},
		{"no unread: as before", 6, []int{4}, nil, 3, "e0 e1 e4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := make([]unreadEntry, tc.n)
			for i := range es {
				es[i].Name = fmt.Sprintf("e%d", i)
			}
			for _, i := range tc.over {
				es[i].Over = true
			}
			for _, i := range tc.unrd {
				es[i].NoRead = true
			}
			if got := names(cut(reflect.ValueOf(es), tc.limit)); got != tc.want {
				t.Errorf("kept %q, want %q", got, tc.want)
			}
		})
	}
}
