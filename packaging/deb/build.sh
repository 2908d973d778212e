#!/usr/bin/env bash
# Builds the Debian package of autopilot-health for the OS image, for Debian 12
# (bookworm) and 13 (trixie), merged /usr:
#   /usr/bin/autopilot-health                                   (static; amd64 or arm64, read from its ELF header)
#   /usr/lib/autopilot-health/autopilot-health-privileged      (the privileged helper, static, the same architecture)
#   /usr/lib/systemd/system/autopilot-health.{service,path}
#   /usr/lib/systemd/system/autopilot-health-privileged.{socket,service}
#   /usr/lib/systemd/system-preset/80-autopilot-health.preset   (enabled by default)
#   /etc/autopilot-health/config.toml                           (conffile; every key commented out)
#   /usr/share/man/man8/autopilot-health.8.gz                   ("autopilot-health man": its own help and catalog)
#   /usr/share/doc/autopilot-health/{copyright,changelog.gz}
#   /usr/share/lintian/overrides/autopilot-health
# Usage: packaging/deb/build.sh BINARY OUTDIR [VERSION]
#   HELPER=FILE    the privileged helper (default: autopilot-health-privileged
#                  beside BINARY)
#   GEN=FILE       a binary of the same tree that runs here (default: BINARY),
#                  which prints the default configuration and the man page
#                  (for a cross-built BINARY)
#   SOURCE_DATE_EPOCH  every timestamp in the package (default: the commit's
#                  time), so two builds of one commit are byte-identical
set -euo pipefail
umask 022
export LC_ALL=C TZ=UTC
bin=${1:?binary}; out=${2:?outdir}; ver=${3:-}
gen=${GEN:-$bin}
here=$(cd "$(dirname "$0")" && pwd); top=$(cd "$here/../.." && pwd)
helper=${HELPER:-$(dirname "$bin")/autopilot-health-privileged}
[ -f "$helper" ] || { echo "build.sh: no privileged helper at $helper (go build ./cmd/autopilot-health-privileged; HELPER=FILE)" >&2; exit 1; }
if [ -z "$ver" ]; then
	ver=$(bash "$here/version.sh" "$top")
fi
commit=$(git -C "$top" rev-parse HEAD 2>/dev/null || echo unknown)
: "${SOURCE_DATE_EPOCH:=$(git -C "$top" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH

# The architecture is the binary's own (ELF e_machine), never the build host's.
case $(od -An -tx1 -j16 -N4 "$bin" | tr -d ' \n') in
02003e00) arch=amd64 ;;
0200b700) arch=arm64 ;;
*) echo "build.sh: $bin is not a static ELF executable for amd64 or arm64" >&2; exit 1 ;;
esac
# The helper must be of the same architecture.
if [ "$(od -An -tx1 -j16 -N4 "$helper" | tr -d ' \n')" != "$(od -An -tx1 -j16 -N4 "$bin" | tr -d ' \n')" ]; then
	echo "build.sh: $helper is not an executable of $bin's architecture ($arch)" >&2; exit 1
fi

root=$(mktemp -d); trap 'rm -rf "$root"' EXIT
doc=$root/usr/share/doc/autopilot-health
install -D -m 0755 "$bin" "$root/usr/bin/autopilot-health"
install -D -m 0755 "$helper" "$root/usr/lib/autopilot-health/autopilot-health-privileged"
for u in autopilot-health.service autopilot-health.path autopilot-health-refused.service autopilot-health-privileged.socket autopilot-health-privileged.service; do
	install -D -m 0644 "$top/units/$u" "$root/usr/lib/systemd/system/$u"
done
install -D -m 0644 /dev/stdin "$root/usr/lib/systemd/system-preset/80-autopilot-health.preset" <<<$'enable autopilot-health.service\nenable autopilot-health.path'
install -D -m 0644 "$here/copyright" "$doc/copyright"
install -D -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/autopilot-health"
mkdir -p "$root/etc/autopilot-health" "$root/usr/share/man/man8" "$root/DEBIAN"
{
	echo "# autopilot-health configuration. Every key below is commented out: the daemon"
	echo "# runs with its embedded defaults (the values shown). Uncomment what you change;"
	echo "# this checks it as the unit's daemon (with the privileged helper) reads it:"
	echo "#   autopilot-health config validate --privileged-helper=/run/autopilot-health-privileged/helper.sock /etc/autopilot-health/config.toml"
	echo "#"
	"$gen" config default | sed -E 's/^([^#].*)$/# \1/'
} > "$root/etc/autopilot-health/config.toml"
"$gen" man --date "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" | gzip -9n > "$root/usr/share/man/man8/autopilot-health.8.gz"
# A native package: one entry, this build's version and commit.
cat <<EOC | gzip -9n > "$doc/changelog.gz"
autopilot-health ($ver) unstable; urgency=medium

  * Built from commit $commit
    for Debian 12 (bookworm) and 13 (trixie).

 -- Syself <support@syself.com>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")
EOC

echo "/etc/autopilot-health/config.toml" > "$root/DEBIAN/conffiles"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$root/DEBIAN/"
# md5sums of every file but the conffiles (dpkg keeps theirs), as dh_md5sums.
(cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
# Installed-Size as dpkg-gencontrol counts it: KiB per file rounded up, 1 per other entry.
size=$(cd "$root" && find . -path ./DEBIAN -prune -o ! -path . -printf '%y %s\n' |
	awk '$1 == "f" { n += int(($2 + 1023) / 1024); next } { n++ } END { print n + 0 }')
cat > "$root/DEBIAN/control" <<EOC
Package: autopilot-health
Version: $ver
Architecture: $arch
Maintainer: Syself <support@syself.com>
Installed-Size: $size
Depends: systemd, dbus
Section: admin
Priority: optional
Homepage: https://syself.com/docs/hetzner/apalla/concepts/operations/self-healing-and-node-replacement
Description: Syself Autopilot node health daemon
 Checks the node continuously and reports problems as Kubernetes
 NodeConditions, events, Prometheus metrics (port 20257) and
 autopilot.syself.com/* health report annotations; restarts kubelet and
 containerd in place over D-Bus. It never cordons, drains, taints or deletes.
 .
 Built for Debian 12 (bookworm) and 13 (trixie) with merged /usr.
EOC
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

# Modes and times as the package states them, whatever the umask and the
# checkout: every directory 0755 (the root entry too), every timestamp
# SOURCE_DATE_EPOCH; owners are root (--root-owner-group).
find "$root" -type d -exec chmod 0755 {} +
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out"
deb="$out/autopilot-health_${ver}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --threads-max=1 --build "$root" "$deb" >/dev/null
echo "$deb"
