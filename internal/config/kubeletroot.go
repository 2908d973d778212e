package config

import (
	"path/filepath"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
)

// DefaultKubeletRootDir is the kubelet's --root-dir when it is not given
// (kubelet's defaultRootDir), kubelet_root_dir's default.
const DefaultKubeletRootDir = "/var/lib/kubelet"

// PodVolumeDirs are the host directories below which the kubelet mounts
// pods' volumes: <kubelet_root_dir>/pods, and <kubelet_root_dir>/plugins,
// below which CSI drivers stage them (.../globalmount). The kernel log
// monitor takes a read-only line of a device mounted only there for a
// pod's volume (kmsg.Options.PodVolumeDirs).
func (c *Config) PodVolumeDirs() []string {
	return []string{filepath.Join(c.KubeletRootDir, "pods"), filepath.Join(c.KubeletRootDir, "plugins")}
}

// validKubeletRootDir says whether dir is a value kubelet_root_dir takes:
// an absolute path other than / (Parse has cleaned it, as host_root).
func validKubeletRootDir(dir string) bool {
	return filepath.IsAbs(dir) && filepath.Clean(dir) == dir && dir != "/"
}

// deriveFromKubeletRootDir moves what the defaults say of the kubelet's
// directory to kubelet_root_dir where the file does not set it itself
// (md: what the file defines): DiskUsageHigh's mount_points_exclude names
// the pods' volumes below <dir>/pods and CSI's staging mounts below
// <dir>/plugins/kubernetes.io/csi/.../globalmount, not below
// /var/lib/kubelet. A mount_points_exclude the file sets is its own. The
// kubelet's certificates (--cert-dir, /var/lib/kubelet/pki whatever
// --root-dir is) and kubeadm's files (/var/lib/kubelet/config.yaml,
// kubeadm-flags.env) do not move with --root-dir, so nothing naming them
// is derived. A bad kubelet_root_dir derives nothing: validate refuses it.
func (c *Config) deriveFromKubeletRootDir(md toml.MetaData) {
	dir := c.KubeletRootDir
	if dir == DefaultKubeletRootDir || !validKubeletRootDir(dir) {
		return
	}
	if !md.IsDefined("checks", "DiskUsageHigh", "mount_points_exclude") {
		c.Checks.DiskUsageHigh.MountPointsExclude = mountPointsExcludeFor(c.Checks.DiskUsageHigh.MountPointsExclude, dir)
	}
}

// mountPointsExcludeFor is the defaults' mount_points_exclude def with the
// kubelet's directory dir in place of /var/lib/kubelet. The defaults'
// expression names the directory as var/lib/kubelet/ after its leading
// ^/( (see default.toml).
func mountPointsExcludeFor(def, dir string) string {
	if dir == DefaultKubeletRootDir {
		return def
	}
	return strings.ReplaceAll(def, "var/lib/kubelet/", regexp.QuoteMeta(strings.TrimPrefix(dir, "/"))+"/")
}

// DefaultMountPointsExclude reports whether DiskUsageHigh's
// mount_points_exclude is the default's for kubelet_root_dir (the file
// does not set it, or sets it to that very expression): then the check
// also leaves out what lies below where the host's links lead the pod
// volume directories, matched as named below them (a kubelet moved to a
// data disk by a link, /var/lib/kubelet -> /data/kubelet, whose pods'
// volumes the mount table names /data/kubelet/pods/...). One the operator
// writes is kept as written, and matched as the mount table names the
// mount points only.
func (c *Config) DefaultMountPointsExclude() bool {
	return c.Checks.DiskUsageHigh.MountPointsExclude == mountPointsExcludeFor(Default().Checks.DiskUsageHigh.MountPointsExclude, c.KubeletRootDir)
}
