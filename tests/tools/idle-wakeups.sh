#!/bin/bash
# idle-wakeups.sh LABEL: runs BenchmarkIdleOnAHealthyNode (IDLE_WINDOW=${WIN:-150s}) and counts the
# daemon's thread wake-ups over 60 s from PRE (60) seconds after its start (`perf record -a -e
# sched:sched_wakeup`), each placed against the 10 s grid of its checks (README, Cost). As root:
#   WIN=10m PRE=180 tests/tools/idle-wakeups.sh base
set -u
L=$1; cd "$(dirname "$0")/../.."
IDLE_WINDOW=${WIN:-150s} go test -tags integration -count=1 -timeout 20m ./tests -run '^$' -bench IdleOnAHealthyNode -benchtime=1x > /tmp/idle-$L.log 2>&1 &
B=$!
for i in $(seq 1 600); do P=$(pgrep -f 'bin/autopilot-health run|autopilot-health run' | head -1); [ -n "$P" ] && break; sleep 1; done
sleep ${PRE:-60}; P=$(pgrep -f 'autopilot-health run' | head -1); echo "daemon pid $P"
perf record -q -a -e sched:sched_wakeup -o /tmp/perf-$L.data sleep 60 >/dev/null 2>&1
perf script -i /tmp/perf-$L.data -F comm,tid,time,event,trace 2>/dev/null > /tmp/perf-$L.txt
TIDS=$(ls /proc/$P/task | tr '\n' ' ')
python3 - "$TIDS" /tmp/perf-$L.txt <<'PY'
import sys,re,collections
tids=set(sys.argv[1].split()); ts=[]
for line in open(sys.argv[2]):
    m=re.search(r'pid=(\d+)',line)
    if not m or m.group(1) not in tids: continue
    t=float(re.search(r'\s(\d+\.\d+):',line).group(1)); ts.append((t,line))
print("wakeups of the daemon's threads:",len(ts))
bins=collections.Counter(int((t%10)*10) for t,_ in ts)
g=max(bins,key=bins.get)/10.0
off=[(round((t-g)%10,2)) for t,_ in ts if (t-g)%10>0.15]
print("grid phase %.1f; off-grid (>150 ms after a point):"%g,len(off), sorted(off))
for t,l in ts:
    if (t-g)%10>0.15: print("  +%.3f"%((t-g)%10), l.strip()[:150])
PY
wait $B; grep -E 'ms/min|waits|Idle' /tmp/idle-$L.log | tail -3
