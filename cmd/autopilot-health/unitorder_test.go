package main

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// unitDeps returns the units a unit file's [Unit] section names in key
// (After=, Before=, Wants=), all lines together, as systemd merges them.
func unitDeps(t *testing.T, path, key string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	section := ""
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[") {
			section = l
			continue
		}
		if v, ok := strings.CutPrefix(l, key+"="); ok && section == "[Unit]" {
			out = append(out, strings.Fields(v)...)
		}
	}
	return out
}

// At shutdown systemd stops units in the reverse of their start order. The
// daemon is ordered before kubelet (so kubelet stops first) and writes its
// last pending change to the API server on SIGTERM: it must be ordered
// after network.target, so that it stops before the network goes down
// (systemd.special(7)); unordered, the network's own stop (a DHCP lease
// released, ifdown) runs beside the daemon's last write. Not after
// network-online.target: the daemon starts before the network is up and
// runs standalone until it is.
func TestUnitStopsBeforeTheNetwork(t *testing.T) {
	const unit = "../../units/autopilot-health.service"
	after := unitDeps(t, unit, "After")
	if !slices.Contains(after, "network.target") {
		t.Errorf("%s is not ordered After=network.target (After=%v): at shutdown the network may go down while the daemon writes its last change", unit, after)
	}
	if slices.Contains(after, "network-online.target") {
		t.Errorf("%s waits for network-online.target at start (After=%v)", unit, after)
	}
	if before := unitDeps(t, unit, "Before"); !slices.Contains(before, "kubelet.service") {
		t.Errorf("%s is not ordered Before=kubelet.service (Before=%v)", unit, before)
	}
}

// The daemon talks to systemd over the system bus, and at shutdown it
// must: until its SIGTERM it asks systemd whether the system is shutting
// down (SystemState) before recording a change, and its checks read the
// units. dbus.service is a plain service (Debian's has default
// dependencies and no ordering against this daemon): unordered, its stop
// waits only for the units ordered after it, not for this daemon, which
// waits for kubelet's stop (its graceful shutdown can take minutes), and
// every read in between fails: the checks that read units turn
// Unknown (CheckFailed), the hold at shutdown cannot tell the system is
// stopping, and the last write on SIGTERM carries both. After=dbus.service
// makes the bus stop after the daemon (After= alone: it does not pull dbus
// in, and at boot it is up long before).
func TestUnitStopsBeforeTheBus(t *testing.T) {
	const unit = "../../units/autopilot-health.service"
	after := unitDeps(t, unit, "After")
	for _, u := range []string{"dbus.socket", "dbus.service"} {
		if !slices.Contains(after, u) {
			t.Errorf("%s is not ordered After=%s (After=%v): at shutdown the bus may stop while the daemon still reads systemd", unit, u, after)
		}
	}
}

// The privileged helper's service is PartOf= the daemon's: a stop or
// restart of the daemon (systemctl, a package's remove or upgrade) stops
// it too. Ordered After= it, the daemon stops first and the helper once
// the daemon has exited; unordered, both stop at once, a helper request in
// flight fails while the daemon still runs, and the daemon's last write
// takes the check's CheckFailed to the Node. The order itself, in a real
// systemd: tests/stoporder_test.go.
func TestUnitStopsBeforeItsHelper(t *testing.T) {
	const unit = "../../units/autopilot-health.service"
	const helper = "autopilot-health-privileged.service"
	if after := unitDeps(t, unit, "After"); !slices.Contains(after, helper) {
		t.Errorf("%s is not ordered After=%s (After=%v): a stop or restart of the daemon stops the helper beside it", unit, helper, after)
	}
	if before := unitDeps(t, "../../units/"+helper, "Before"); slices.Contains(before, "autopilot-health.service") {
		t.Errorf("%s is ordered Before= the daemon as well: an ordering cycle", helper)
	}
}
