#!/bin/bash
# idle-faults.sh OUTDIR [PID]: the idle daemon's page faults, each with its call chain, and the
# runtime's madvise calls (the scavenger returning memory), grouped by cause (README, Cost: "The idle
# daemon's page faults"). Without PID it waits for the daemon of BenchmarkIdleOnAHealthyNode (the
# /usr/bin/autopilot-health run beside the container's containerd and stand-in tunnel agent; with
# TESTPID, the one that descends from that process, where other benchmarks run beside it), then
# SETTLE seconds (360: past the trims of the binary's pages at the first pass and a minute on, and
# past the first 5-minute point after them, which touches the 5-minute checks' code once), and
# records DUR seconds (300). As root, while the benchmark runs with a window long enough:
#   IDLE_WINDOW=12m go test -tags integration -timeout 30m ./tests -run '^$' -bench IdleOnAHealthyNode -benchtime=1x &
#   tests/tools/idle-faults.sh /tmp/faults
set -uo pipefail
out=${1:?usage: idle-faults.sh OUTDIR [PID]} pid=${2:-}
mkdir -p "$out"
if [ -z "$pid" ]; then
	. "$(dirname "$0")/idle-daemon.sh"
	pid=$(idle_daemon) || exit 1
	sleep "${SETTLE:-360}"
fi
cp /proc/"$pid"/exe "$out/bin" && cp /proc/"$pid"/maps "$out/maps" || exit 1
f0=$(awk '{print $10}' /proc/"$pid"/stat)
echo "pid $pid $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >"$out/info"
perf record -q -e page-faults -e syscalls:sys_enter_madvise -c 1 -g -d -p "$pid" -o "$out/perf.data" -- sleep "${DUR:-300}" 2>/dev/null
f1=$(awk '{print $10}' /proc/"$pid"/stat)
echo "minflt $((f1 - f0)) in ${DUR:-300} s, ending $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/info"
perf script -i "$out/perf.data" -F time,event,addr,ip,sym,trace 2>/dev/null >"$out/script.txt"
cat "$out/info"
python3 - "$out" <<'PY'
import collections, re, subprocess, sys
d = sys.argv[1]
secs = []
for line in subprocess.run(['readelf', '-SW', d + '/bin'], capture_output=True, text=True).stdout.splitlines():
    m = re.match(r'\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)', line)
    if m and int(m.group(2), 16):
        secs.append((int(m.group(2), 16), int(m.group(2), 16) + int(m.group(3), 16), m.group(1)))
maps = []
for line in open(d + '/maps'):
    f = line.split()
    lo, hi = (int(x, 16) for x in f[0].split('-'))
    maps.append((lo, hi))
# The Go heap's arenas (heap spans and goroutine stacks): 64 MiB-aligned reservations below the
# libraries' addresses.
arenas = [lo for lo, hi in maps if lo % (64 << 20) == 0 and lo < 0x7f0000000000]
def where(a):
    for lo, hi, n in secs:
        if lo <= a < hi:
            return 'binary ' + n
    if any(a0 <= a < a0 + (64 << 20) for a0 in arenas):
        return 'heap arena'
    return 'runtime off-heap'
def cause(st):
    s = ' '.join(st)
    if 'runtime.shrinkstack' in s:
        return 'stack shrunk by the collector'
    if 'runtime.gcBgMarkWorker' in s or 'runtime.gcDrain' in s or 'runtime.bgsweep' in s or 'runtime.markroot' in s:
        return 'garbage collector'
    if 'runtime.newstack' in s or 'runtime.copystack' in s:
        return 'stack grown (newstack/copystack)'
    if 'runtime.malg' in s or 'runtime.newproc' in s:
        return 'new goroutine'
    if 'runtime.mallocgc' in s:
        return 'allocation (mallocgc)'
    if st and st[0].startswith('runtime.mem'):
        return 'first write to new memory (' + st[0] + ')'
    return 'touched by ' + (st[0] if st else '?')
def goroutine(st):
    for f in reversed(st):
        if not f.startswith(('runtime.', '[unknown]', 'sync.(*WaitGroup).Go')):
            return f
    return st[-1] if st else '?'
samples, cur = [], None
for line in open(d + '/script.txt'):
    if not line.strip():
        cur = None
        continue
    if not line.startswith((' ', '\t')):
        t = re.search(r'(\d+\.\d+):', line)
        a = re.search(r'page-faults:\s+([0-9a-f]+)', line)
        r = re.search(r'start: (0x[0-9a-f]+), len_in: (0x[0-9a-f]+)', line)
        cur = {'madvise': 'madvise' in line, 't': float(t.group(1)) if t else 0, 'addr': int(a.group(1), 16) if a else 0, 'st': [],
               'range': (int(r.group(1), 16), int(r.group(1), 16) + int(r.group(2), 16)) if r else None}
        samples.append(cur)
    elif cur is not None:
        f = line.split(None, 1)
        cur['st'].append(re.sub(r'\+0x[0-9a-f]+$', '', f[1].rsplit(' (', 1)[0].strip()) if len(f) > 1 else '?')
faults = [s for s in samples if not s['madvise']]
mad = [s for s in samples if s['madvise']]
print(f'{len(faults)} page faults, {len(mad)} madvise calls returning {sum(s["range"][1] - s["range"][0] for s in mad if s["range"]) >> 10} KiB')
# A fault on the heap in a range the runtime returned earlier in the trace (the scavenger's
# madvise): memory faulted back in.
returned, back, heap = [], 0, 0
for s in samples:
    if s['madvise']:
        if s['range']:
            returned.append(s['range'])
    elif where(s['addr']) == 'heap arena':
        heap += 1
        back += any(lo <= s['addr'] < hi for lo, hi in returned)
print(f'{heap} of them on the heap arena, {back} in a range returned earlier in the trace')
print('\nby where and cause:')
for (w, c), n in collections.Counter((where(s['addr']), cause(s['st'])) for s in faults).most_common():
    print(f'  {n:4d}  {w:22s} {c}')
print('\nby where, cause and goroutine (its outermost frame outside the runtime):')
for (w, c, g), n in collections.Counter((where(s['addr']), cause(s['st']), goroutine(s['st'])) for s in faults).most_common():
    print(f'  {n:4d}  {w:22s} {c:40s} {g}')
if samples:
    t0 = samples[0]['t']
    print('\nby 10 s from the first event (faults, madvise):')
    b = collections.Counter((int((s['t'] - t0) // 10) * 10, s['madvise']) for s in samples)
    for k in sorted({k for k, _ in b}):
        print(f'  {k:4d} s  {b[(k, False)]:4d} {b[(k, True)]:4d}')
PY
