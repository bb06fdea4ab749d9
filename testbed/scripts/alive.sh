#!/bin/sh
# testbed run: what a host says of itself when a run probes it (testbed.run.liveness.probe_command builds the
# call, parse_report reads its output).
# usage: alive.sh [RUN_DIR]
# prints "key value" lines: boot (its boot id), up (seconds since it booted), load (1-minute load average), agent
# (seconds since the dead-man's agent last wrote its status, when that file is readable here) and log (seconds since
# a rank log of the run in RUN_DIR was last written, when there is one)
now=$(date +%s)
echo "boot $(cat /proc/sys/kernel/random/boot_id 2> /dev/null || echo -)"
echo "up $(cut -d ' ' -f 1 /proc/uptime 2> /dev/null || echo -)"
echo "load $(cut -d ' ' -f 1 /proc/loadavg 2> /dev/null || echo -)"
status=/var/lib/testbed-deadman/status.json
if [ -r "$status" ]; then
  t=$(stat -c %Y "$status" 2> /dev/null) && echo "agent $((now - t))"
fi
dir=${1:-}
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
if [ -n "$dir" ] && cd -- "$dir" 2> /dev/null; then
  newest=$(stat -c %Y rank*.out rank*.err 2> /dev/null | sort -n | tail -n 1)
  if [ -n "$newest" ]; then echo "log $((now - newest))"; fi
fi
exit 0
