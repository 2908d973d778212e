package systemd

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	godbus "github.com/godbus/dbus/v5"
)

// godbusCondition is a Conditions (or Asserts) entry as systemd sends it,
// (sbbsi).
type godbusCondition struct {
	Type            string
	Trigger, Negate bool
	Parameter       string
	State           int32
}

// A unit's Conditions and Asserts (a(sbbsi)) are decoded, in both byte
// orders, as systemd 252 answered them for a unit whose
// ConditionPathExists= was not met (TestRepairOfAUnitWhoseConditionIsNotMet
// in tests/); a truncated array is an error, not a crash.
func TestParseConditions(t *testing.T) {
	sent := []godbusCondition{
		{"ConditionPathExists", true, true, "/nonexistent-b", 1},
		{"ConditionPathExists", true, false, "/nonexistent-a", -1},
		{"ConditionPathExists", false, false, "/usr/bin/kubelet", -1},
	}
	want := []Condition{
		{"ConditionPathExists", true, true, "/nonexistent-b", 1},
		{"ConditionPathExists", true, false, "/nonexistent-a", -1},
		{"ConditionPathExists", false, false, "/usr/bin/kubelet", -1},
	}
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		b := encodeReply(t, order, godbus.TypeMethodReply, 9, 8, "", godbus.MakeVariant(sent))
		v, err := parseVariant(parse(t, b))
		if err != nil || v.sig != "a(sbbsi)" || !reflect.DeepEqual(v.conds, want) {
			t.Errorf("%v: %+v, %v; want %+v", order, v, err, want)
		}
		if v, err := parseVariant(parse(t, encodeReply(t, order, godbus.TypeMethodReply, 9, 8, "", godbus.MakeVariant([]godbusCondition{})))); err != nil || len(v.conds) != 0 {
			t.Errorf("%v: none: %+v, %v", order, v, err)
		}
		m := parse(t, b)
		// The array's length says 8 bytes more than the body holds.
		bad := m
		bad.body = append([]byte(nil), m.body...)
		n := order.Uint32(bad.body[12:]) // after the signature (1+8+1 bytes) and padding
		order.PutUint32(bad.body[12:], n+8)
		if _, err := parseVariant(bad); !errors.Is(err, errBadMessage) {
			t.Errorf("%v: an array longer than the body: %v", order, err)
		}
	}
}

// Unmet names the condition that failed a check as systemd makes it: the
// first one not triggering that was not met (systemd stops there: the
// states after it are an earlier check's), else the triggering ones, none
// of which was met; a list never checked names none.
func TestUnmet(t *testing.T) {
	c := func(typ, param string, trigger, negate bool, state int32) Condition {
		return Condition{Type: typ, Trigger: trigger, Negate: negate, Parameter: param, State: state}
	}
	for _, tc := range []struct {
		list []Condition
		want string
	}{
		{[]Condition{c("ConditionPathExists", "/usr/bin/kubelet", false, false, -1)}, "ConditionPathExists=/usr/bin/kubelet"},
		// systemd 252's own answer: a trigger met, one not, and the
		// non-triggering one not met.
		{[]Condition{c("ConditionPathExists", "/b", true, true, 1), c("ConditionPathExists", "/a", true, false, -1), c("ConditionPathExists", "/usr/bin/kubelet", false, false, -1)}, "ConditionPathExists=/usr/bin/kubelet"},
		// The first not met; the one after it keeps an earlier check's
		// state.
		{[]Condition{c("ConditionPathIsMountPoint", "/var/lib/kubelet", false, true, -1), c("ConditionFileNotEmpty", "/etc/k", false, false, -1)}, "ConditionPathIsMountPoint=!/var/lib/kubelet"},
		{[]Condition{c("ConditionFileNotEmpty", "/etc/k", false, false, 1), c("ConditionPathExists", "/a", true, false, -1), c("ConditionPathExists", "/b", true, true, -1)}, "ConditionPathExists=|/a or ConditionPathExists=|!/b"},
		{[]Condition{c("AssertPathExists", "/usr/bin/kubelet", false, false, -1)}, "AssertPathExists=/usr/bin/kubelet"},
		{[]Condition{c("ConditionPathExists", "/usr/bin/kubelet", false, false, 0)}, ""},
		{[]Condition{c("ConditionPathExists", "/usr/bin/kubelet", false, false, 1)}, ""},
		{nil, ""},
	} {
		if got := Unmet(tc.list); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.list, got, tc.want)
		}
	}
}
