#!/usr/bin/env bash
# Prints the Debian version of the package built from the git tree at $1, so
# that versions only go up: a release tag v1.2.3 is 1.2.3, a pre-release
# v1.2.3-rc1 is 1.2.3~rc1 (before 1.2.3), N commits after a tag are
# <tag>+N.g<hash> (after it), and a tree with no tag is
# 0.0.0~git<commit time, UTC, YYYYMMDDHHMMSS>.<hash> (ordered by commit time,
# not by hash). A tree with uncommitted changes gets +dirty.
# Usage: version.sh TOPDIR
#        version.sh --from DESCRIBE COMMIT_TIME SHORT_HASH DIRTY(0|1)   (tests)
set -euo pipefail
if [ "${1:-}" = --from ]; then
	describe=$2; ct=$3; short=$4; dirty=$5
else
	top=${1:?topdir}
	describe=$(git -C "$top" describe --tags --match 'v[0-9]*' 2>/dev/null || true)
	ct=$(git -C "$top" log -1 --format=%ct 2>/dev/null || echo 0)
	short=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
	dirty=0
	[ -z "$(git -C "$top" status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=1
fi
v=
if [ -n "$describe" ]; then
	v=$(printf '%s\n' "${describe#v}" | sed -E \
		-e 's/^([0-9][0-9.]*)-((rc|alpha|beta)[0-9.]*)-([0-9]+)-g([0-9a-f]+)$/\1~\2+\4.g\5/' \
		-e 's/^([0-9][0-9.]*)-((rc|alpha|beta)[0-9.]*)$/\1~\2/' \
		-e 's/^([0-9][0-9.]*)-([0-9]+)-g([0-9a-f]+)$/\1+\2.g\3/')
	case $v in
	*[!0-9A-Za-z.+~]*) echo "version.sh: tag $describe does not map to a Debian version" >&2; exit 1 ;;
	esac
fi
if [ -z "$v" ]; then
	v="0.0.0~git$(date -u -d "@$ct" +%Y%m%d%H%M%S).$short"
fi
[ "$dirty" = 0 ] || v="$v+dirty"
echo "$v"
