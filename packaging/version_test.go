package packaging

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// debVersion runs deb/version.sh on a describe string, commit time, hash and
// dirty flag, as build.sh does on the tree.
func debVersion(t *testing.T, describe, ct, hash string, dirty bool) string {
	t.Helper()
	d := "0"
	if dirty {
		d = "1"
	}
	out, err := exec.Command("bash", "deb/version.sh", "--from", describe, ct, hash, d).CombinedOutput()
	if err != nil {
		t.Fatalf("version.sh %q: %v\n%s", describe, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Package versions only go up from one commit to the next, as apt
// needs to upgrade a fleet: by commit time without a tag (not by hash), a
// pre-release before its release, commits after a tag after it.
func TestDebianVersionsGoUp(t *testing.T) {
	if _, err := exec.LookPath("dpkg"); err != nil {
		testenv.Skip(t, "dpkg not installed")
	}
	seq := []string{
		debVersion(t, "", "1796240000", "b285f24", false),
		debVersion(t, "", "1796240000", "b285f24", true),
		debVersion(t, "", "1796245719", "9caaa68", false),
		debVersion(t, "v1.0.0-rc1", "1796250000", "aaaaaaa", false),
		debVersion(t, "v1.0.0-rc1-3-gabc1234", "1796260000", "abc1234", false),
		debVersion(t, "v1.0.0", "1796270000", "bbbbbbb", false),
		debVersion(t, "v1.0.0-2-gdef5678", "1796280000", "def5678", false),
		debVersion(t, "v1.0.1-rc1", "1796290000", "ccccccc", false),
		debVersion(t, "v1.0.1", "1796300000", "ddddddd", false),
	}
	if seq[0] != "0.0.0~git20261202193320.b285f24" || seq[5] != "1.0.0" || seq[3] != "1.0.0~rc1" {
		t.Errorf("versions: %q", seq)
	}
	for i := 1; i < len(seq); i++ {
		if err := exec.Command("dpkg", "--compare-versions", seq[i-1], "lt", seq[i]).Run(); err != nil {
			t.Errorf("%s is not before %s", seq[i-1], seq[i])
		}
	}
	if out, err := exec.Command("bash", "deb/version.sh", "--from", "v1.2.3_bad", "0", "x", "0").CombinedOutput(); err == nil {
		t.Errorf("a tag that is not a Debian version was accepted: %s", out)
	}
}
