//go:build integration

package tests

import "testing"

// NodeTampered under the packaged units with a protected path in /var/tmp:
// the helper's PrivateTmp=yes mounts a directory of its own over /tmp and
// /var/tmp in its mount namespace, so the scan cannot see the host's
// /var/tmp; the condition says so (Unknown, CheckFailed, naming the path
// and why) instead of vouching for what it cannot see. Before, the scan read
// the helper's empty /var/tmp, and NodeTampered was False, NodeIntact, with
// the host's files there never looked at.
func TestNodeTamperedPathInThePrivateTmpIsNotVouchedFor(t *testing.T) {
	_, nodeTampered := hiddenProtectedPath(t, "/var/tmp/autopilot-health-test", "/var/tmp/autopilot-health-test/a.conf",
		"/var/tmp/autopilot-health-test (hidden by the sandbox: /var/tmp is")
	sr, msg := nodeTampered()
	t.Logf("NodeTampered under the units: %s %s", sr, msg)
}
