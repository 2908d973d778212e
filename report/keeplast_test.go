package report

import (
	"fmt"
	"testing"
	"time"
)

// A value kept with KeepLast is read after every Keep's value of the same
// save, whatever the map's order: the Event writer's pending occurrences
// after the kernel log cursor, so that a record the saved cursor counts as
// handled has its occurrence in the saved events.
func TestKeepLastRunsAfterTheOtherKeepers(t *testing.T) {
	s := NewStore("b")
	var order []string
	for i := range 8 {
		k := fmt.Sprint("k", i)
		s.Keep(k, func() any { order = append(order, k); return 0 })
	}
	s.KeepLast("last", func() any { order = append(order, "last"); return 0 })
	for range 20 {
		order = nil
		if _, _, err := s.EncodeWrite(time.Now()); err != nil {
			t.Fatal(err)
		}
		if len(order) != 9 || order[8] != "last" {
			t.Fatalf("keepers called in the order %v; want the KeepLast one after the 8 others", order)
		}
	}
}
