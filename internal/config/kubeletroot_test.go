package config

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// kubelet_root_dir defaults to the kubelet's own default, and the pod
// volume directories are below it.
func TestKubeletRootDirDefault(t *testing.T) {
	c := Default()
	if c.KubeletRootDir != "/var/lib/kubelet" {
		t.Errorf("kubelet_root_dir = %q, want /var/lib/kubelet", c.KubeletRootDir)
	}
	if want := []string{"/var/lib/kubelet/pods", "/var/lib/kubelet/plugins"}; !slices.Equal(c.PodVolumeDirs(), want) {
		t.Errorf("PodVolumeDirs %q, want %q", c.PodVolumeDirs(), want)
	}
}

// A kubelet run with --root-dir=/data/kubelet: the pod volume directories
// and DiskUsageHigh's default exclusion of pods' volumes follow it; a
// mount_points_exclude the file sets is kept as written; the kubelet's
// certificates (--cert-dir is /var/lib/kubelet/pki whatever --root-dir is)
// and kubeadm's files do not move.
func TestKubeletRootDirDerives(t *testing.T) {
	c, err := Parse("config.toml", []byte(`kubelet_root_dir = "/data/kube.let"`), Default())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/data/kube.let/pods", "/data/kube.let/plugins"}; !slices.Equal(c.PodVolumeDirs(), want) {
		t.Errorf("PodVolumeDirs %q, want %q", c.PodVolumeDirs(), want)
	}
	mp := regexp.MustCompile(c.Checks.DiskUsageHigh.MountPointsExclude)
	for p, excluded := range map[string]bool{
		"/data/kube.let/pods/0b1c/volumes/kubernetes.io~csi/pvc-1/mount":                 true,
		"/data/kube.let/plugins/kubernetes.io/csi/driver.longhorn.io/3f2a9c/globalmount": true,
		"/data/kube.let/plugins/kubernetes.io/csi/pv/pvc-1/globalmount":                  true,
		// The dot is quoted: not any character.
		"/data/kubeXlet/pods/0b1c/volumes/kubernetes.io~csi/pvc-1/mount":   false,
		"/var/lib/kubelet/pods/0b1c/volumes/kubernetes.io~csi/pvc-1/mount": false,
		"/data/kube.let": false, "/data": false, "/": false, "/proc": true, "/var/lib/containerd/x": true,
		// The pods directory's own mount (a disk for pods' emptyDirs) is
		// measured, what lies below it is the pods'; so is plugins/ itself.
		"/data/kube.let/pods": false, "/data/kube.let/pods/0b1c": true, "/data/kube.let/plugins": false,
	} {
		if mp.MatchString(p) != excluded {
			t.Errorf("mount_points_exclude %q matches %s: %v, want %v", mp, p, !excluded, excluded)
		}
	}
	def := Default()
	if c.Detect.KubeletClientCert != def.Detect.KubeletClientCert || !slices.Equal(c.Checks.CertRenewalFailing.Certificates, def.Checks.CertRenewalFailing.Certificates) ||
		!slices.Equal(c.Checks.NodeTampered.Paths, def.Checks.NodeTampered.Paths) {
		t.Errorf("kubelet_root_dir moved the certificates or kubeadm's files: %q %q %q", c.Detect.KubeletClientCert, c.Checks.CertRenewalFailing.Certificates, c.Checks.NodeTampered.Paths)
	}

	// Set by the file: its own, whatever kubelet_root_dir is.
	c, err = Parse("config.toml", []byte("kubelet_root_dir = \"/data/kubelet\"\n[checks.DiskUsageHigh]\nmount_points_exclude = \"^/(proc|var/lib/kubelet/pods)($|/)\"\n"), Default())
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Checks.DiskUsageHigh.MountPointsExclude; got != "^/(proc|var/lib/kubelet/pods)($|/)" {
		t.Errorf("mount_points_exclude set in the file became %q", got)
	}

	// The stock expression copied into the file (what `config default`
	// prints), now's or the one before, which left out the pods directory
	// itself: the default, derived for kubelet_root_dir. Before, it was
	// kept as written and the pods' volumes below /data/kubelet were
	// measured as the node's disks.
	for _, stock := range []string{Default().Checks.DiskUsageHigh.MountPointsExclude, oldStockMountPointsExclude} {
		c, err = Parse("config.toml", []byte("kubelet_root_dir = \"/data/kubelet\"\n[checks.DiskUsageHigh]\nmount_points_exclude = "+strconvQuote(stock)+"\n"), Default())
		if err != nil {
			t.Fatal(err)
		}
		mp := regexp.MustCompile(c.Checks.DiskUsageHigh.MountPointsExclude)
		if !mp.MatchString("/data/kubelet/pods/0b1c/volumes/kubernetes.io~csi/pvc-1/mount") || mp.MatchString("/data/kubelet/pods") ||
			!mp.MatchString("/data/kubelet/plugins/kubernetes.io/csi/pv/pvc-1/globalmount") || mp.MatchString("/var/lib/kubelet/pods/0b1c") {
			t.Errorf("stock %q copied with kubelet_root_dir /data/kubelet: mount_points_exclude %q, want the default derived for /data/kubelet", stock, mp)
		}
	}

	// The default root: the defaults, unchanged.
	c, err = Parse("config.toml", []byte(`kubelet_root_dir = "/var/lib/kubelet"`), Default())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Checks.DiskUsageHigh.MountPointsExclude, Default().Checks.DiskUsageHigh.MountPointsExclude; got != want || !strings.Contains(got, "var/lib/kubelet/pods") {
		t.Errorf("mount_points_exclude %q, want the default %q", got, want)
	}
}

// A reload that changes kubelet_root_dir is refused (needs a restart): the
// kernel log monitor takes its pod volume directories at its start, and
// Reconfigure does not change them.
func TestKubeletRootDirNeedsARestart(t *testing.T) {
	c, err := Parse("config.toml", []byte(`kubelet_root_dir = "/data/kubelet"`), Default())
	if err != nil {
		t.Fatal(err)
	}
	var restart []string
	for _, k := range Diff(Default(), c) {
		if NeedsRestart(k) {
			restart = append(restart, k)
		}
	}
	if !slices.Equal(restart, []string{"kubelet_root_dir"}) {
		t.Errorf("keys that need a restart in %q: %q, want kubelet_root_dir", Diff(Default(), c), restart)
	}
}

// A trailing slash or a "/./" is cleaned, as host_root is, not refused: an
// operator's "/data/kubelet/" names the same directory.
func TestKubeletRootDirCleaned(t *testing.T) {
	c, err := Parse("config.toml", []byte(`kubelet_root_dir = "/data/./kubelet/"`), Default())
	if err != nil {
		t.Fatal(err)
	}
	if c.KubeletRootDir != "/data/kubelet" {
		t.Errorf("kubelet_root_dir = %q, want /data/kubelet", c.KubeletRootDir)
	}
	if dirs := c.PodVolumeDirs(); len(dirs) != 2 || dirs[0] != "/data/kubelet/pods" || dirs[1] != "/data/kubelet/plugins" {
		t.Errorf("pod volume dirs %q", dirs)
	}
}

// DefaultMountPointsExclude: true for the defaults and for the exclusion
// derived from a kubelet_root_dir (DiskUsageHigh then also follows the
// links of the pod volume directories), false for one the file sets to
// anything else (the operator's, kept as written).
func TestDefaultMountPointsExclude(t *testing.T) {
	if !Default().DefaultMountPointsExclude() {
		t.Error("the defaults: not the default mount_points_exclude")
	}
	for _, tc := range []struct {
		file string
		want bool
	}{
		{`kubelet_root_dir = "/data/kube.let"`, true},
		{"[checks.DiskUsageHigh]\nspace_percent = 80\n", true},
		{"[checks.DiskUsageHigh]\nmount_points_exclude = \"^/(proc|var/lib/kubelet/pods)($|/)\"\n", false},
		// The stock expression for /var/lib/kubelet copied into the file
		// where the kubelet is elsewhere: the default, derived (before,
		// false: kept as written, the links not followed).
		{"kubelet_root_dir = \"/data/kubelet\"\n[checks.DiskUsageHigh]\nmount_points_exclude = " + strconvQuote(Default().Checks.DiskUsageHigh.MountPointsExclude) + "\n", true},
		// The one before, which left out the pods directory itself, as
		// operators copied it: the default, for either root.
		{"kubelet_root_dir = \"/data/kubelet\"\n[checks.DiskUsageHigh]\nmount_points_exclude = " + strconvQuote(oldStockMountPointsExclude) + "\n", true},
		{"[checks.DiskUsageHigh]\nmount_points_exclude = " + strconvQuote(oldStockMountPointsExclude) + "\n", true},
		// The stock expression with one more directory is the operator's.
		{"[checks.DiskUsageHigh]\nmount_points_exclude = " + strconvQuote(strings.Replace(oldStockMountPointsExclude, "run|", "run|srv|", 1)) + "\n", false},
	} {
		c, err := Parse("config.toml", []byte(tc.file), Default())
		if err != nil {
			t.Fatal(err)
		}
		if got := c.DefaultMountPointsExclude(); got != tc.want {
			t.Errorf("%q: DefaultMountPointsExclude %v, want %v", tc.file, got, tc.want)
		}
		// The default in effect is the stock one's: the pods directory's
		// own mount measured, whatever form the file copied.
		if tc.want && regexp.MustCompile(c.Checks.DiskUsageHigh.MountPointsExclude).MatchString(c.KubeletRootDir+"/pods") {
			t.Errorf("%q: mount_points_exclude %q leaves out %s/pods itself", tc.file, c.Checks.DiskUsageHigh.MountPointsExclude, c.KubeletRootDir)
		}
	}
}

// strconvQuote writes s as a TOML basic string.
func strconvQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// default.toml's mount_points_exclude is the stock expression the code
// takes a file's copy of for the default (isStockMountPointsExclude).
func TestStockMountPointsExcludeIsDefaultTOMLs(t *testing.T) {
	if got := Default().Checks.DiskUsageHigh.MountPointsExclude; got != stockMountPointsExclude {
		t.Errorf("default.toml's mount_points_exclude %q, the code's stock one %q", got, stockMountPointsExclude)
	}
}

// A stock mount_points_exclude copied into the file and taken as the
// default derived for kubelet_root_dir (TestKubeletRootDirDerives) is a
// value the daemon uses otherwise than written: Parse notes it (the file,
// the line that sets it, the value taken and why), which the daemon logs
// at start and reload (TestConfigNotesLoggedOnce). The stock expression as
// it is taken, and an expression of the operator's, are not noted.
func TestStockMountPointsExcludeTakenIsNoted(t *testing.T) {
	derived := mountPointsExcludeFor(stockMountPointsExclude, "/data/kubelet")
	for _, tc := range []struct {
		name, root, mp string
		why            []string // what the note says; none: no note
	}{
		{"earlier stock", "", oldStockMountPointsExclude, []string{"earlier version's stock expression"}},
		{"today's stock", "", stockMountPointsExclude, nil},
		{"today's stock, another root", "/data/kubelet", stockMountPointsExclude, []string{"written for /var/lib/kubelet, and kubelet_root_dir is /data/kubelet"}},
		{"earlier stock, another root", "/data/kubelet", oldStockMountPointsExclude, []string{"earlier version's", "kubelet_root_dir is /data/kubelet"}},
		{"earlier stock derived, another root", "/data/kubelet", mountPointsExcludeFor(oldStockMountPointsExclude, "/data/kubelet"), []string{"earlier version's"}},
		{"today's stock derived, another root", "/data/kubelet", derived, nil},
		{"the operator's", "", `^/(proc|var/lib/kubelet/pods)($|/)`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := "# a comment\n"
			if tc.root != "" {
				file += "kubelet_root_dir = " + strconvQuote(tc.root) + "\n"
			}
			file += "[checks.DiskUsageHigh]\nspace_percent = 90\nmount_points_exclude = " + strconvQuote(tc.mp) + "\n"
			c, err := Parse("/etc/autopilot-health/config.toml", []byte(file), Default())
			if err != nil {
				t.Fatal(err)
			}
			notes := c.Notes()
			if tc.why == nil {
				if len(notes) != 0 {
					t.Errorf("notes %+v, want none", notes)
				}
				return
			}
			line := strings.Count(file, "\n")
			if len(notes) != 1 {
				t.Fatalf("notes %+v, want one", notes)
			}
			n := notes[0]
			if n.File != "/etc/autopilot-health/config.toml" || n.Line != line || n.Key != "checks.DiskUsageHigh.mount_points_exclude" ||
				n.Taken != c.Checks.DiskUsageHigh.MountPointsExclude || n.Taken == tc.mp {
				t.Errorf("note %+v, want the file, line %d, the key and the value taken (%q)", n, line, c.Checks.DiskUsageHigh.MountPointsExclude)
			}
			for _, w := range tc.why {
				if !strings.Contains(n.Why, w) {
					t.Errorf("the note says %q, want it to say %q", n.Why, w)
				}
			}
		})
	}
	// The defaults, and a file that does not set the key: nothing noted.
	if c, err := Parse("config.toml", []byte(`kubelet_root_dir = "/data/kubelet"`), Default()); err != nil || len(c.Notes()) != 0 || len(Default().Notes()) != 0 {
		t.Errorf("notes %+v (%v), defaults' %+v, want none", c.Notes(), err, Default().Notes())
	}
}
