#!/bin/bash
# Captures proc/self/mountinfo (beside this script) as a service with the
# shipped unit's sandboxing sees it: a real systemd (252) as PID 1 in fresh
# namespaces (as tests/harness/systemd-ns.sh, from
# ../shared/recipes/systemd-in-namespace) starts a oneshot unit with the
# settings of units/autopilot-health.service that shape its mounts
# (ProtectSystem=strict, ProtectHome=yes, PrivateTmp=yes, PrivateDevices=yes,
# ProtectKernel*=yes, ProtectControlGroups=yes, StateDirectory= and
# RuntimeDirectory=autopilot-health), which copies its own
# /proc/self/mountinfo into its state directory.
#
# The namespace's filesystems, so that "which filesystems were measured" is
# unambiguous (each on its own loop device):
#   /              tmpfs                                   (excluded: tmpfs)
#   /usr           host /usr, bind, per-mount ro           (the host's disk)
#   /var           ext4, read-write                        (must be measured)
#   /var/lib/data  ext4, read-write                        (must be measured)
#   /opt/sealed    ext4 mounted ro: superblock ro          (a sealed fs: not measured)
#   /home          ext4, read-write, covered in the service's namespace by
#                  ProtectHome='s inaccessible directory   (cannot be measured)
#   /run /tmp /var/tmp /dev ...  tmpfs, proc, sysfs        (excluded by type)
# Needs root, util-linux, e2fsprogs and systemd. Usage: capture.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

case "${1:-}" in
"")
    W=$(mktemp -d /tmp/capture-protectsystem.XXXXXX)
    CG=/sys/fs/cgroup/unified/capture-protectsystem-$$
    LOOPS=()
    cleanup() {
        [ -n "${PID1:-}" ] && kill -KILL "$PID1" 2>/dev/null || true
        [ -n "${STARTER:-}" ] && wait "$STARTER" 2>/dev/null || true
        for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
        [ -d "$CG" ] && find "$CG" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        rm -rf "$W"
    }
    trap cleanup EXIT
    for fs in var data sealed home; do
        truncate -s 32M "$W/$fs.img"
        mkfs.ext4 -q -L "$fs" "$W/$fs.img"
        LOOPS+=("$(losetup --find --show "$W/$fs.img")")
    done
    mkdir -p "$CG/payload" "$W/units"
    cat > "$W/units/capture.service" <<'EOF'
[Unit]
DefaultDependencies=no
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'cat /proc/self/mountinfo > /var/lib/autopilot-health/mountinfo.tmp && mv /var/lib/autopilot-health/mountinfo.tmp /var/lib/autopilot-health/mountinfo'
StateDirectory=autopilot-health
RuntimeDirectory=autopilot-health
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
PrivateDevices=yes
EOF
    printf '[Unit]\nWants=capture.service\n' > "$W/units/capture.target"
    ln -s capture.target "$W/units/default.target"
    export W CG LOOP_VAR=${LOOPS[0]} LOOP_DATA=${LOOPS[1]} LOOP_SEALED=${LOOPS[2]} LOOP_HOME=${LOOPS[3]}
    unshare --pid --fork --kill-child=SIGKILL --mount --uts --ipc --propagation private "$0" stage1 >"$W/console.log" 2>&1 </dev/null &
    STARTER=$!
    for _ in $(seq 300); do
        [ -s "$W/ctr.pid" ] && PID1=$(cat "$W/ctr.pid")
        if [ -n "${PID1:-}" ] && [ -s "/proc/$PID1/root/var/lib/autopilot-health/mountinfo" ]; then
            cp "/proc/$PID1/root/var/lib/autopilot-health/mountinfo" "$HERE/proc/self/mountinfo"
            echo "captured $HERE/proc/self/mountinfo"
            exit 0
        fi
        sleep 0.1
    done
    echo "no capture after 30 s; console:" >&2
    tail -c 3000 "$W/console.log" >&2
    exit 1
    ;;
stage1)
    echo 0 > "$CG/payload/cgroup.procs"
    read -r HOSTPID _ < /proc/self/stat
    echo "$HOSTPID" > "$W/ctr.pid.tmp"; mv "$W/ctr.pid.tmp" "$W/ctr.pid"
    exec unshare --cgroup "$0" stage2
    ;;
stage2)
    R=$W/rootfs
    mkdir -p "$R"
    mount --make-rprivate /
    mount -t tmpfs -o mode=755,size=16m rootfs "$R"
    mkdir -p $R/{usr,etc,proc,sys,dev,run,tmp,var,root,home,opt/sealed,oldroot}
    for d in bin sbin lib lib64; do ln -sfn usr/$d $R/$d; done
    mount --bind /usr $R/usr; mount -o remount,bind,ro $R/usr
    mount -t tmpfs -o mode=755,size=4m tmpfs $R/etc
    cp /etc/passwd /etc/group /etc/nsswitch.conf $R/etc/
    echo capture > $R/etc/hostname
    tr -d '-' < /proc/sys/kernel/random/uuid > $R/etc/machine-id
    mkdir -p $R/etc/systemd/system
    mount --bind "$W/units" $R/etc/systemd/system
    mount -t proc -o nosuid,nodev,noexec proc $R/proc
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $R/sys
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 $R/sys/fs/cgroup
    mount -t tmpfs -o mode=755,nosuid,size=4m tmpfs $R/dev
    mknod -m 666 $R/dev/null c 1 3; mknod -m 666 $R/dev/zero c 1 5; mknod -m 666 $R/dev/urandom c 1 9
    # PrivateDevices=yes copies these into the unit's /dev and binds /dev/pts
    # and /dev/shm there (the unit fails to start without them).
    mknod -m 666 $R/dev/full c 1 7; mknod -m 666 $R/dev/random c 1 8; mknod -m 666 $R/dev/tty c 5 0
    mkdir -p $R/dev/pts $R/dev/shm
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts $R/dev/pts
    ln -s pts/ptmx $R/dev/ptmx
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/dev/shm
    mount -t tmpfs -o mode=755,nosuid,nodev,size=16m tmpfs $R/run
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/tmp
    mount -o noatime "$LOOP_VAR" $R/var
    mkdir -p $R/var/lib/data $R/var/log $R/var/tmp; chmod 1777 $R/var/tmp
    mount -o noatime "$LOOP_DATA" $R/var/lib/data
    mount -o ro "$LOOP_SEALED" $R/opt/sealed
    mount -o noatime "$LOOP_HOME" $R/home
    cd $R
    pivot_root . oldroot
    umount -l /oldroot
    rmdir /oldroot
    exec env -i container=capture TERM=dumb /usr/lib/systemd/systemd --log-target=console --log-level=info --log-color=no
    ;;
esac
