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

// stockMountPointsExclude is default.toml's DiskUsageHigh
// mount_points_exclude (TestStockMountPointsExcludeIsDefaultTOMLs holds
// the two equal), written for /var/lib/kubelet: below the pods directory,
// not the directory itself, whose own mount (a disk for pods' emptyDirs)
// is measured.
const stockMountPointsExclude = `^/(dev|proc|sys|run|var/lib/kubelet/pods/.+|var/lib/kubelet/plugins/kubernetes\.io/csi/.+/globalmount|var/lib/containerd/.+|run/containerd)($|/)`

// oldStockMountPointsExclude is the stock mount_points_exclude before the
// pods directory's own mount was measured (pods($|/) left it out). An
// operator's file that copied it is taken for the stock default.
const oldStockMountPointsExclude = `^/(dev|proc|sys|run|var/lib/kubelet/pods|var/lib/kubelet/plugins/kubernetes\.io/csi/.+/globalmount|var/lib/containerd/.+|run/containerd)($|/)`

// isStockMountPointsExclude reports whether v, a mount_points_exclude a
// file sets, is the stock default copied: default.toml's expression (what
// `config default` prints and the package installs commented) or the one
// before it, as written for /var/lib/kubelet or for dir.
func isStockMountPointsExclude(v, dir string) bool {
	for _, s := range []string{stockMountPointsExclude, oldStockMountPointsExclude} {
		if v == s || v == mountPointsExcludeFor(s, dir) {
			return true
		}
	}
	return false
}

// deriveFromKubeletRootDir moves what the defaults say of the kubelet's
// directory to kubelet_root_dir where the file does not set it itself
// (md: what the file defines): DiskUsageHigh's mount_points_exclude names
// the pods' volumes below <dir>/pods and CSI's staging mounts below
// <dir>/plugins/kubernetes.io/csi/.../globalmount, not below
// /var/lib/kubelet. A mount_points_exclude the file sets is its own,
// unless it is the stock default copied (isStockMountPointsExclude): that
// is the default, derived for dir (before, an operator who copied
// default.toml's expression and set kubelet_root_dir had the
// /var/lib/kubelet pattern kept as written, the pods' volumes below dir
// measured as the node's disks). The kubelet's certificates (--cert-dir,
// /var/lib/kubelet/pki whatever --root-dir is) and kubeadm's files
// (/var/lib/kubelet/config.yaml, kubeadm-flags.env) do not move with
// --root-dir, so nothing naming them is derived. A bad kubelet_root_dir
// derives nothing: validate refuses it.
func (c *Config) deriveFromKubeletRootDir(md toml.MetaData) {
	dir := c.KubeletRootDir
	if !validKubeletRootDir(dir) {
		return
	}
	mp := &c.Checks.DiskUsageHigh.MountPointsExclude
	switch {
	case !md.IsDefined("checks", "DiskUsageHigh", "mount_points_exclude"):
		*mp = mountPointsExcludeFor(*mp, dir)
	case isStockMountPointsExclude(*mp, dir):
		written := *mp
		*mp = mountPointsExcludeFor(stockMountPointsExclude, dir)
		if why := stockTakenWhy(written, dir); why != "" {
			c.notes = append(c.notes, Note{Key: "checks.DiskUsageHigh.mount_points_exclude", Taken: *mp, Why: why})
		}
	}
}

// stockTakenWhy says why written, a stock mount_points_exclude copied into
// the file (isStockMountPointsExclude), is taken as the default derived
// for dir, "" when that is written itself.
func stockTakenWhy(written, dir string) string {
	if written == mountPointsExcludeFor(stockMountPointsExclude, dir) {
		return ""
	}
	var why []string
	if written == oldStockMountPointsExclude || written == mountPointsExcludeFor(oldStockMountPointsExclude, dir) {
		why = append(why, "it is an earlier version's stock expression, with pods($|/), which left out the pods directory's own mount (a disk for pods' emptyDirs); today's default measures that mount and leaves out what lies below it")
	}
	if dir != DefaultKubeletRootDir && (written == stockMountPointsExclude || written == oldStockMountPointsExclude) {
		why = append(why, "it is written for /var/lib/kubelet, and kubelet_root_dir is "+dir+": derived for it as the default is")
	}
	return "the stock expression copied is taken as the default: " + strings.Join(why, "; ")
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
// does not set it, or sets the stock expression, isStockMountPointsExclude,
// which Parse derives for kubelet_root_dir): then the check
// also leaves out what lies below where the host's links lead the pod
// volume directories, matched as named below them (a kubelet moved to a
// data disk by a link, /var/lib/kubelet -> /data/kubelet, whose pods'
// volumes the mount table names /data/kubelet/pods/...). One the operator
// writes is kept as written, and matched as the mount table names the
// mount points only.
func (c *Config) DefaultMountPointsExclude() bool {
	return c.Checks.DiskUsageHigh.MountPointsExclude == mountPointsExcludeFor(stockMountPointsExclude, c.KubeletRootDir)
}
