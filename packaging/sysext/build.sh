#!/usr/bin/env bash
# Builds the systemd-sysext image of autopilot-health: how the daemon is
# baked into an image-based node OS (the OS image ships the .raw under
# /usr/lib/extensions or /var/lib/extensions; systemd-sysext merges it over
# /usr at boot). Contents, all under /usr:
#   /usr/bin/autopilot-health
#   /usr/lib/autopilot-health/autopilot-health-privileged   (the privileged helper)
#   /usr/lib/systemd/system/autopilot-health.{service,path}
#   /usr/lib/systemd/system/autopilot-health-privileged.{socket,service}
#   /usr/lib/systemd/system-preset/80-autopilot-health.preset   (enabled by default)
#   /usr/share/autopilot-health/config.toml   (the defaults, every key commented out;
#                                              copy to /etc/autopilot-health/ to change one)
#   /usr/lib/systemd/system/multi-user.target.d/10-autopilot-health.conf
#       (10-autopilot-health.conf beside this script: Upholds=autopilot-health.path,
#       which starts the daemon, once multi-user.target is active and the units
#       are reloaded after the merge; a sysext cannot enable a unit through /etc)
#   /usr/lib/extension-release.d/extension-release.autopilot-health   (ID=_any)
# The base image must merge and then reload: sysext-daemon-reload.service
# beside this script (systemd 252 does not reload after a merge).
# A squashfs image, reproducible: every file owned by root, every time
# SOURCE_DATE_EPOCH (default: the commit's time).
# Usage: packaging/sysext/build.sh BINARY OUTDIR [VERSION]   -> OUTDIR/autopilot-health.raw
#   VERSION       SYSEXT_VERSION_ID of the extension-release (default: the
#                 Debian package's version of the tree, packaging/deb/version.sh,
#                 in os-release's characters: 0-9 a-z . _ -, "~" and ":" as "_",
#                 "+" as ".")
#   HELPER=FILE   the privileged helper (default: autopilot-health-privileged beside BINARY)
#   GEN=FILE      a binary of the same tree that runs here (default: BINARY),
#                 which prints the default configuration (for a cross-built BINARY)
set -euo pipefail
bin=${1:?binary}; out=${2:?outdir}; ver=${3:-}
gen=${GEN:-$bin}
here=$(cd "$(dirname "$0")" && pwd); top=$(cd "$here/../.." && pwd)
helper=${HELPER:-$(dirname "$bin")/autopilot-health-privileged}
[ -f "$helper" ] || { echo "build.sh: no privileged helper at $helper (go build ./cmd/autopilot-health-privileged; HELPER=FILE)" >&2; exit 1; }
command -v mksquashfs >/dev/null || { echo "sysext: mksquashfs not found (Debian: squashfs-tools)" >&2; exit 1; }
if [ -z "$ver" ]; then
	# The Debian package's version of this tree (one source: deb/version.sh),
	# so that an extension and a package of one commit name the same version.
	ver=$(bash "$top/packaging/deb/version.sh" "$top")
fi
# os-release(5): a version is lower-case 0-9 a-z . _ - (a Debian version's
# "~", ":" and "+" are not).
ver=$(printf '%s' "$ver" | tr 'A-Z~:+' 'a-z__.' | tr -c '0-9a-z._-' '_')
# mksquashfs reads SOURCE_DATE_EPOCH itself: the image's time and every file's.
: "${SOURCE_DATE_EPOCH:=$(git -C "$top" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH
# ARCHITECTURE= in systemd's names (ConditionArchitecture=) for the binary's
# own architecture (ELF e_machine), never the build host's: no Go toolchain
# needed, and GOARCH of the environment does not count.
case $(od -An -tx1 -j16 -N4 "$bin" | tr -d ' \n') in
02003e00) arch=x86-64 ;;
0200b700) arch=arm64 ;;
*) echo "sysext: $bin is not a static ELF executable for amd64 or arm64" >&2; exit 1 ;;
esac
# The helper must be of the binary's architecture (ELF e_machine).
[ "$(od -An -tx1 -j16 -N4 "$helper" | tr -d ' \n')" = "$(od -An -tx1 -j16 -N4 "$bin" | tr -d ' \n')" ] ||
	{ echo "sysext: $helper is not an executable of $bin's architecture ($arch)" >&2; exit 1; }
root=$(mktemp -d); trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$bin" "$root/usr/bin/autopilot-health"
install -D -m 0755 "$helper" "$root/usr/lib/autopilot-health/autopilot-health-privileged"
for u in autopilot-health.service autopilot-health.path autopilot-health-refused.service autopilot-health-privileged.socket autopilot-health-privileged.service; do
	install -D -m 0644 "$top/units/$u" "$root/usr/lib/systemd/system/$u"
done
install -D -m 0644 /dev/stdin "$root/usr/lib/systemd/system-preset/80-autopilot-health.preset" <<<$'enable autopilot-health.service\nenable autopilot-health.path'
install -D -m 0644 "$here/10-autopilot-health.conf" "$root/usr/lib/systemd/system/multi-user.target.d/10-autopilot-health.conf"
mkdir -p "$root/usr/share/autopilot-health"
{
	echo "# autopilot-health configuration: the defaults the daemon runs with, every key"
	echo "# commented out. To change one, copy this file to /etc/autopilot-health/config.toml"
	echo "# and uncomment it; this checks it as the unit's daemon (with the privileged"
	echo "# helper) reads it:"
	echo "#   autopilot-health config validate --privileged-helper=/run/autopilot-health-privileged/helper.sock /etc/autopilot-health/config.toml"
	echo "#"
	"$gen" config default | sed -E 's/^([^#].*)$/# \1/'
} > "$root/usr/share/autopilot-health/config.toml"
chmod 0644 "$root/usr/share/autopilot-health/config.toml"
# The extension matches any host OS (it carries a static binary); the
# architecture must match the kernel's.
install -D -m 0644 /dev/stdin "$root/usr/lib/extension-release.d/extension-release.autopilot-health" <<EOR
ID=_any
ARCHITECTURE=$arch
NAME="autopilot-health"
SYSEXT_ID=autopilot-health
SYSEXT_VERSION_ID=$ver
EXTENSION_RELOAD_MANAGER=1
EOR
find "$root" -type d -exec chmod 0755 {} +
mkdir -p "$out"
rm -f "$out/autopilot-health.raw"
mksquashfs "$root" "$out/autopilot-health.raw" -quiet -noappend -all-root -no-xattrs -comp xz >/dev/null
echo "$out/autopilot-health.raw"
