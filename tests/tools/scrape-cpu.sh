#!/bin/bash
# scrape-cpu.sh PID URL N [curl args...]: the CPU time (user+system, all
# threads, from /proc/PID/task/*/schedstat) process PID spends per request
# over N sequential `curl -s URL` requests, each a new connection.
# README, Cost: e.g. scrape-cpu.sh $(pidof autopilot-health) http://127.0.0.1:20257/metrics 200
set -euo pipefail
pid=$1 url=$2 n=$3
shift 3
cpu() { cat /proc/"$pid"/task/*/schedstat | while read -r ns _; do echo "$ns"; done | paste -sd+ | bc; }
a=$(cpu)
for _ in $(seq "$n"); do curl -s "$@" "$url" >/dev/null; done
b=$(cpu)
echo "$(( (b - a) / n / 1000 )) us per request ($url $*)"
