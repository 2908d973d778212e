# idle-daemon.sh, sourced by the idle tools (idle-faults.sh, kernel-entries.sh):
# idle_daemon waits up to 600 s for the daemon of BenchmarkIdleOnAHealthyNode
# and prints its PID: the /usr/bin/autopilot-health run beside the
# container's containerd and stand-in tunnel agent, or, with TESTPID set, the
# one that descends from that process (where other benchmarks run beside
# it). It fails, saying so, when none came.
idle_daemon() {
	local p pp q
	for _ in $(seq 600); do
		for p in $(pgrep -f '^/usr/bin/autopilot-health run'); do
			if [ -n "${TESTPID:-}" ]; then
				q=$p
				while [ "$q" -gt 1 ] && [ "$q" != "$TESTPID" ]; do q=$(awk '{print $4}' /proc/"$q"/stat 2>/dev/null) || break; done
				[ "$q" = "$TESTPID" ] && { echo "$p"; return 0; }
				continue
			fi
			pp=$(awk '{print $4}' /proc/"$p"/stat 2>/dev/null) || continue
			if pgrep -P "$pp" -f '^/usr/bin/containerd' >/dev/null && pgrep -P "$pp" -f '^/bin/sleep infinity' >/dev/null; then
				echo "$p"
				return 0
			fi
		done
		sleep 1
	done
	echo "no daemon" >&2
	return 1
}
