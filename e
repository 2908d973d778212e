autopilot-health reload: the daemon is not running (no control socket at /run/autopilot-health/control.sock): start it (systemctl start autopilot-health) and its configuration is read at start
Command exited with non-zero status 2
0.00s
