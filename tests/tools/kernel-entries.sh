#!/bin/bash
# kernel-entries.sh OUTDIR [PID]: the kernel entries of the idle daemon
# (README, Cost: on a paravirtualized VM each one goes through the
# hypervisor): its minor faults over 60 s (field 10 of /proc/PID/stat), then
# its system calls over 120 s (`strace -f -c`), then, with DETAIL=SECONDS,
# every call with its descriptor over that long (`strace -f -tt -yy`), to
# tell where they come from. Without PID it waits for the daemon of
# BenchmarkIdleOnAHealthyNode (the /usr/bin/autopilot-health run beside the
# container's containerd and stand-in tunnel agent, or with TESTPID the one
# below that process: idle-daemon.sh) and SETTLE seconds
# (90) more. As root, while the benchmark runs with a window long enough:
#   IDLE_WINDOW=6m go test -tags integration -timeout 20m ./tests -run '^$' -bench IdleOnAHealthyNode -benchtime=1x &
#   DETAIL=60 tests/tools/kernel-entries.sh /tmp/counts
set -uo pipefail
out=${1:?usage: kernel-entries.sh OUTDIR [PID]} pid=${2:-}
mkdir -p "$out"
if [ -z "$pid" ]; then
	. "$(dirname "$0")/idle-daemon.sh"
	pid=$(idle_daemon) || exit 1
	sleep "${SETTLE:-90}"
fi
minflt() { awk '{print $10}' /proc/"$pid"/stat; }
echo "pid $pid $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >"$out/info"
f0=$(minflt)
sleep 60
f1=$(minflt)
echo "minflt_60s $((f1 - f0))" >>"$out/info"
strace -f -c -p "$pid" -o "$out/strace.txt" &
sp=$!
sleep 120
kill -INT "$sp"
wait "$sp" 2>/dev/null
f2=$(minflt)
echo "minflt_during_strace_120s $((f2 - f1))" >>"$out/info"
if [ -n "${DETAIL:-}" ]; then
	timeout -s INT "$DETAIL" strace -f -tt -yy -s 80 -p "$pid" -o "$out/detail.txt" 2>/dev/null
fi
cat "$out/info" "$out/strace.txt"
