#!/bin/bash
# Captures the replay fixtures with this machine's real dmesg, journalctl and
# /dev/kmsg (Debian 12: util-linux 2.38.1, systemd 252; run as root from this
# directory: bash capture.sh). Each fixture holds, in the tool's genuine
# output form:
#   - 3 records the kernel itself logged (facility kern): an ext4 image on a
#     loop device is attached, mounted and unmounted;
#   - 4 records this script writes to /dev/kmsg (facility user, as user space
#     writes): a hung kubelet, a read-only remount, a verity corruption and a
#     harmless NIC line.
# The 4 written lines get placeholder texts that are substituted after the
# capture, for one reason: the kernel log is machine-wide, and the integration
# tiers' daemons (kernel_only = false, from_boot_start) would read a real
# hung-kubelet line from the ring buffer and set KernelDeadlock in every later
# test until reboot. Only the message text differs from what the tool
# printed; prefixes, timestamps, priorities and JSON fields are as captured.
#
# journalctl -k needs a journal that read the kernel log: a systemd-journald
# is started in a private mount namespace (tmpfs /run and /var/log/journal),
# reads /dev/kmsg from the boot's start, and journalctl reads its journal.
set -euo pipefail
tok=aphfix$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
tmp=$(mktemp -d); trap 'umount -q $tmp/mnt 2>/dev/null || true; rm -rf $tmp' EXIT
truncate -s 8M $tmp/img; mkfs.ext4 -q -F $tmp/img; mkdir $tmp/mnt
uuid=$(blkid -o value -s UUID $tmp/img)
mount -o loop $tmp/img $tmp/mnt; umount $tmp/mnt
w() { printf '<%s>%s\n' "$1" "$2" > /dev/kmsg; } # one open per line (ratelimit)
w 3 "$tok-hung"
w 2 "$tok-ro"
w 3 "$tok-verity"
w 6 "$tok-benign"
sub() {
	sed -e "s/$tok-hung/INFO: task kubelet:2291 blocked for more than 122 seconds./" \
		-e "s/$tok-ro/EXT4-fs (sda1): Remounting filesystem read-only/" \
		-e "s/$tok-verity/device-mapper: verity: 7:1: data block 5 is corrupted/" \
		-e "s/$tok-benign/e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex/"
}
# The lines of this capture, and the line before the first (the loop
# device's "detected capacity change", and reltime's "[Mon D HH:MM]" line).
pick() { awk -v u="$uuid" -v t="$tok" 'index($0, u) || index($0, t) { if (!n++) print prev; print; next } { prev = $0 }'; }
cap() { # file, command...
	local f=$1; shift
	"$@" > $tmp/out || [ $? = 124 ] # timeout's status
	pick < $tmp/out | sub > "$f"
}
cap dmesg.txt dmesg
cap dmesg-T.txt dmesg -T
cap dmesg-x.txt dmesg -x
cap dmesg-T-x.txt dmesg -T -x
cap dmesg-iso.txt dmesg --time-format iso
cap dmesg-r.txt dmesg -r
cap dmesg-reltime.txt dmesg --time-format reltime
cap dmesg-delta.txt dmesg --time-format delta
cap dmesg-t.txt dmesg -t
# cat /dev/kmsg blocks at the end of the log: read it for a second.
cap kmsg-raw.txt timeout 1 cat /dev/kmsg
export tok uuid tmp
export -f pick
unshare --mount --propagation private bash -c '
	set -euo pipefail
	mount -t tmpfs tmpfs /run; mkdir -p /var/log/journal; mount -t tmpfs tmpfs /var/log/journal
	/lib/systemd/systemd-journald & J=$!
	until journalctl -k -q -o cat 2>/dev/null | grep -q "$tok-benign"; do sleep 0.2; done
	for o in short short-iso short-precise short-monotonic short-delta short-full short-iso-precise short-unix json cat; do
		journalctl -k -q -o $o > $tmp/out
		pick < $tmp/out > $tmp/journal-$o
	done
	kill $J'
for o in short short-iso short-precise short-monotonic short-delta short-full short-iso-precise short-unix json cat; do
	sub < $tmp/journal-$o > journal-$o.txt
done
