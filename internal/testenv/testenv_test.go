package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSkipHelper is Skip called by a test, run by TestSkipFailsUnderCI in
// a process of its own.
func TestSkipHelper(t *testing.T) {
	if os.Getenv("TESTENV_SKIP_HELPER") == "" {
		t.Skip("run by TestSkipFailsUnderCI")
	}
	Skip(t, "no frobnicator here (apt install frob)")
	t.Error("Skip returned")
}

// Skip skips where CI is not "true", and fails the test, with the reason,
// where it is: README's promise that a unit test which needs a part of the
// machine is never skipped in CI.
func TestSkipFailsUnderCI(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		fail     bool
		want     string
		inResult string
	}{
		{"true", true, "CI=true and this test cannot run: no frobnicator here (apt install frob)", "--- FAIL: TestSkipHelper"},
		{"", false, "no frobnicator here (apt install frob)", "--- SKIP: TestSkipHelper"},
		{"false", false, "no frobnicator here (apt install frob)", "--- SKIP: TestSkipHelper"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipHelper$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "TESTENV_SKIP_HELPER=1", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.fail {
			t.Errorf("CI=%q: exit %v, want failed=%v:\n%s", tc.ci, err, tc.fail, out)
		}
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), tc.inResult) || strings.Contains(string(out), "Skip returned") {
			t.Errorf("CI=%q: output lacks %q and %q:\n%s", tc.ci, tc.inResult, tc.want, out)
		}
	}
}
