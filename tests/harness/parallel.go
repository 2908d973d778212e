package harness

import (
	"slices"
	"sync"
	"testing"
)

// MaxNamespaces is how many namespaced systemds the Parallel tests of one
// test process run at once. The tests that call Parallel mostly wait (a
// window in which nothing may spin, dpkg, a restart's delay); each
// namespace is a systemd, a journald, a dbus-daemon and the daemon.
const MaxNamespaces = 3

var (
	nsSlots = make(chan struct{}, MaxNamespaces)
	slotsMu sync.Mutex // a test taking two slots takes both at once

	locksMu sync.Mutex
	locks   = map[string]*sync.Mutex{}
)

// Parallel runs t beside the package's other Parallel tests (t.Parallel:
// after the serial tests, while nothing but Parallel tests run) and holds,
// until t ends, namespaces of the MaxNamespaces slots (the namespaced
// systemds t starts at once) and each named lock: a resource of the host
// that two tests must not use at once, e.g.
//   - "port20257": the shipped metrics port in the host's network
//     namespace, which a daemon on the shipped or embedded configuration
//     listens on.
//
// A test that writes kernel lines to the real /dev/kmsg that another
// daemon's default rules would act on, stops, restarts or re-configures
// the shared kube-apiserver, sets a package variable (kube.NodeStaleAfter
// and the like), reads a process-wide counter (kube.TLSHandshakes), or
// measures CPU time against wall time must stay serial (not call
// Parallel). A proxy of the test's own in front of the shared server
// (APIServer.StartProxy: its own port, refused and reopened alone) and
// Nodes named with Token are the test's own.
func Parallel(t *testing.T, namespaces int, names ...string) {
	t.Helper()
	t.Parallel()
	names = slices.Clone(names)
	slices.Sort(names) // one order for all: no two tests wait on each other
	names = slices.Compact(names)
	for _, n := range names {
		locksMu.Lock()
		m := locks[n]
		if m == nil {
			m = &sync.Mutex{}
			locks[n] = m
		}
		locksMu.Unlock()
		m.Lock()
		t.Cleanup(m.Unlock)
	}
	slotsMu.Lock()
	for range min(namespaces, MaxNamespaces) {
		nsSlots <- struct{}{}
		t.Cleanup(func() { <-nsSlots })
	}
	slotsMu.Unlock()
}
