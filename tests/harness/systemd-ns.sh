#!/bin/bash
# Runs a real systemd as PID 1 in fresh pid/mount/uts/ipc/cgroup namespaces
# (the network namespace is shared, so the test reaches the units' loopback
# ports). Written from ../shared/recipes/systemd-in-namespace.
# Usage: systemd-ns.sh start|cleanup   with
#   NS_DIR     scratch dir (rootfs mount point, logs, ctr.pid)
#   NS_UNITS   becomes /etc/systemd/system (read-write: tests add units)
#   NS_CGROUP  a cgroup2 directory to run in (delegated subtree)
# and optionally
#   NS_KEEP_SYSLOG=1  PID 1 keeps CAP_SYSLOG (a unit reading /dev/kmsg needs
#                     it: a unit never regains what PID 1 lacks); by default
#                     it is dropped from PID 1's bounding set
#   NS_DATA=DIR       DIR (a host directory) is bound read-write at /data, the
#                     first mount after the root, so a check measuring
#                     filesystems finds it before any other mount of its device
#   NS_USR=DIR        DIR is laid over the host's /usr (read-only overlay), so
#                     DIR/bin/x is /usr/bin/x inside
#   NS_LOOP=1         /dev/loop-control and /dev/loop0..63 exist inside (a disk
#                     image can be attached: systemd-sysext)
#   NS_SHARED=1       every mount inside is shared, as on a booted host (systemd
#                     makes / shared at boot, but not in a container): a mount
#                     made in a unit's own mount namespace (systemd-sysext's
#                     merge) propagates to PID 1's
#   NS_USR_RW=DIR     /usr is writable instead: an overlay of the host's /usr
#                     whose writes land in DIR/upper (dpkg installs there)
# The root is a tmpfs: every disk filesystem inside is one of the mounts above.
set -euo pipefail
D=${NS_DIR:?}; UNITS=${NS_UNITS:?}; CG=${NS_CGROUP:?}
R=$D/rootfs; LOGS=$D/logs
NS_KEEP_SYSLOG=${NS_KEEP_SYSLOG:-}; NS_DATA=${NS_DATA:-}; NS_USR=${NS_USR:-}; NS_SHARED=${NS_SHARED:-}; NS_LOOP=${NS_LOOP:-}; NS_USR_RW=${NS_USR_RW:-}
export D UNITS CG R LOGS NS_KEEP_SYSLOG NS_DATA NS_USR NS_SHARED NS_LOOP NS_USR_RW

case "${1:-}" in
start)
    mkdir -p "$CG/payload" "$LOGS" $R
    export HOST_PIDNS=$(readlink /proc/self/ns/pid)
    exec script -qfec "unshare --pid --fork --kill-child=SIGKILL --mount --uts --ipc --propagation private $0 stage1" "$LOGS/console.log"
    ;;
stage1)
    [ "$$" -eq 1 ] || { echo "stage1: not PID 1" >&2; exit 1; }
    [ "$(readlink /proc/self/ns/pid)" != "$HOST_PIDNS" ] || { echo "stage1: same pid ns as host" >&2; exit 1; }
    echo 0 > "$CG/payload/cgroup.procs"
    read -r HOSTPID _ < /proc/self/stat
    echo "$HOSTPID" > "$LOGS/ctr.pid.tmp"; mv "$LOGS/ctr.pid.tmp" "$LOGS/ctr.pid"
    exec unshare --cgroup "$0" stage2
    ;;
stage2)
    CONSOLE=$(tty || true)
    mount --make-rprivate /
    mount -t tmpfs -o mode=755,size=16m rootfs $R
    mkdir -p $R/{usr,etc,proc,sys,dev,run,tmp,var,root,oldroot}
    for d in bin sbin lib lib64; do ln -sfn usr/$d $R/$d; done
    if [ -n "$NS_DATA" ]; then mkdir -p $R/data; mount --bind "$NS_DATA" $R/data; fi
    if [ -n "$NS_USR_RW" ]; then
        mkdir -p "$NS_USR_RW/upper" "$NS_USR_RW/work"
        mount -t overlay -o lowerdir=/usr,upperdir="$NS_USR_RW/upper",workdir="$NS_USR_RW/work" overlay $R/usr
    elif [ -n "$NS_USR" ]; then
        mount -t overlay -o ro,lowerdir="$NS_USR":/usr overlay $R/usr
    else
        mount --bind /usr $R/usr; mount -o remount,bind,ro $R/usr
    fi
    mount -t tmpfs -o mode=755,size=16m tmpfs $R/etc
    cp /etc/passwd /etc/group /etc/nsswitch.conf $R/etc/
    echo ns-systemd > $R/etc/hostname
    tr -d '-' < /proc/sys/kernel/random/uuid > $R/etc/machine-id
    ln -s ../usr/lib/os-release $R/etc/os-release
    mkdir -p $R/etc/systemd/system
    mount --bind $UNITS $R/etc/systemd/system
    mount -t proc -o nosuid,nodev,noexec proc $R/proc
    for f in sys sysrq-trigger; do [ -e $R/proc/$f ] || continue; mount --bind $R/proc/$f $R/proc/$f; mount -o remount,bind,ro $R/proc/$f; done
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $R/sys
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 $R/sys/fs/cgroup
    mount -t tmpfs -o mode=755,nosuid,size=4m tmpfs $R/dev
    mknod -m 666 $R/dev/null c 1 3; mknod -m 666 $R/dev/zero c 1 5; mknod -m 666 $R/dev/full c 1 7
    mknod -m 666 $R/dev/random c 1 8; mknod -m 666 $R/dev/urandom c 1 9; mknod -m 666 $R/dev/tty c 5 0
    mknod -m 644 $R/dev/kmsg c 1 11
    if [ "$NS_LOOP" = 1 ]; then
        mknod -m 600 $R/dev/loop-control c 10 237
        for i in $(seq 0 63); do mknod -m 600 $R/dev/loop$i b 7 $i; done
    fi
    mkdir -p $R/dev/pts $R/dev/shm
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts $R/dev/pts
    ln -s pts/ptmx $R/dev/ptmx
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/dev/shm
    if [ -c "$CONSOLE" ]; then touch $R/dev/console; mount --bind "$CONSOLE" $R/dev/console; fi
    ln -s /proc/self/fd $R/dev/fd; ln -s /proc/self/fd/0 $R/dev/stdin; ln -s /proc/self/fd/1 $R/dev/stdout; ln -s /proc/self/fd/2 $R/dev/stderr
    mount -t tmpfs -o mode=755,nosuid,nodev,size=64m tmpfs $R/run
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/tmp
    mount -t tmpfs -o mode=755,nosuid,nodev tmpfs $R/var
    mkdir -p $R/var/lib $R/var/log $R/var/cache $R/var/tmp; chmod 1777 $R/var/tmp; ln -s ../run $R/var/run
    cd $R
    pivot_root . oldroot
    umount -l /oldroot
    [ "$NS_SHARED" != 1 ] || mount --make-rshared /
    DROP=-sys_module,-sys_time,-sys_rawio,-sys_pacct,-wake_alarm,-block_suspend,-mac_admin,-mac_override,-audit_control,-audit_read,-bpf,-perfmon,-checkpoint_restore
    [ "$NS_KEEP_SYSLOG" = 1 ] || DROP=$DROP,-syslog
    exec env -i container=autopilot-health-test TERM=dumb \
        setpriv --bounding-set $DROP \
        /usr/lib/systemd/systemd --log-target=console --log-level=info --log-color=no --log-time=yes
    ;;
cleanup)
    [ -d "$CG" ] && find "$CG" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ ! -d "$CG" ] || { echo "cgroup $CG still busy" >&2; exit 1; }
    ;;
*) echo "usage: $0 start|cleanup" >&2; exit 2;;
esac
