#!/bin/bash
# Captures the journalctl forms that kmsg replay refuses (export, verbose,
# json-seq, json-sse, json-pretty) with this machine's real journalctl (Debian 12, systemd
# 252; run as root from this directory: bash capture.sh), as ../capture.sh
# captures the forms it reads: 2 records written to /dev/kmsg, read by a
# systemd-journald in a private mount namespace, their texts substituted
# after the capture (see ../capture.sh for why).
set -euo pipefail
tok=aphfix$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
w() { printf '<%s>%s\n' "$1" "$2" > /dev/kmsg; } # one open per line (ratelimit)
w 3 "$tok-hung"
w 2 "$tok-ro"
export tok tmp
unshare --mount --propagation private bash -c '
	set -euo pipefail
	mount -t tmpfs tmpfs /run; mkdir -p /var/log/journal; mount -t tmpfs tmpfs /var/log/journal
	/lib/systemd/systemd-journald & J=$!
	until journalctl -k -q -o cat 2>/dev/null | grep -q "$tok-ro"; do sleep 0.2; done
	for o in ${forms:-export verbose json-seq json-sse json-pretty}; do
		journalctl -k -q -o $o MESSAGE=$tok-hung MESSAGE=$tok-ro > $tmp/journal-$o
	done
	kill $J'
for o in ${forms:-export verbose json-seq json-sse json-pretty}; do
	sed -e "s/$tok-hung/INFO: task kubelet:2291 blocked for more than 122 seconds./" \
		-e "s/$tok-ro/EXT4-fs (sda1): Remounting filesystem read-only/" < $tmp/journal-$o > journal-$o.txt
done
