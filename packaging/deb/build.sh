#!/usr/bin/env bash
# Builds the Debian package of autopilot-health for the OS image:
#   /usr/bin/autopilot-health
#   /lib/systemd/system/autopilot-health.service
#   /lib/systemd/system-preset/80-autopilot-health.preset   (enabled by default)
#   /etc/autopilot-health/config.toml                        (conffile; every key commented out)
# Usage: packaging/deb/build.sh BINARY OUTDIR [VERSION]
set -euo pipefail
bin=${1:?binary}; out=${2:?outdir}; ver=${3:-}
here=$(cd "$(dirname "$0")" && pwd); top=$(cd "$here/../.." && pwd)
if [ -z "$ver" ]; then
	ver=$(git -C "$top" describe --tags --match 'v[0-9]*' 2>/dev/null | sed 's/^v//; s/-/+/g') ||
		ver="0.0.0~git$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
root=$(mktemp -d); trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$bin" "$root/usr/bin/autopilot-health"
install -D -m 0644 "$top/units/autopilot-health.service" "$root/lib/systemd/system/autopilot-health.service"
install -D -m 0644 /dev/stdin "$root/lib/systemd/system-preset/80-autopilot-health.preset" <<<"enable autopilot-health.service"
mkdir -p "$root/etc/autopilot-health" "$root/DEBIAN"
{
	echo "# autopilot-health configuration. Every key below is commented out: the daemon"
	echo "# runs with its embedded defaults (the values shown). Uncomment what you change;"
	echo "# 'autopilot-health config validate /etc/autopilot-health/config.toml' checks it."
	echo "#"
	"$bin" config default | sed -E 's/^([^#].*)$/# \1/'
} > "$root/etc/autopilot-health/config.toml"
chmod 0644 "$root/etc/autopilot-health/config.toml"
echo "/etc/autopilot-health/config.toml" > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/control" <<EOC
Package: autopilot-health
Version: $ver
Architecture: $arch
Maintainer: Syself <support@syself.com>
Section: admin
Priority: optional
Depends: systemd, dbus
Description: Syself Autopilot node health daemon
 Checks the node continuously and reports problems as Kubernetes
 NodeConditions, events, Prometheus metrics (port 20257) and
 autopilot.syself.com/* health report annotations; restarts kubelet and
 containerd in place over D-Bus. It never cordons, drains, taints or deletes.
EOC
cat > "$root/DEBIAN/postinst" <<'EOS'
#!/bin/sh
set -e
if [ "$1" = "configure" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
	systemctl preset autopilot-health.service >/dev/null || true
	systemctl restart autopilot-health.service >/dev/null || true
fi
EOS
cat > "$root/DEBIAN/prerm" <<'EOS'
#!/bin/sh
set -e
# On removal the daemon stops; the conditions it set stay on the Node (stale),
# as they do whenever the daemon is not running.
if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
	systemctl stop autopilot-health.service >/dev/null || true
fi
EOS
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
mkdir -p "$out"
deb="$out/autopilot-health_${ver}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
