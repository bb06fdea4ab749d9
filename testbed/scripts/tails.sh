#!/bin/sh
# testbed run: the end of each rank's stdout on this host, for the live status line of `testbed run`
# (testbed.run.runner.rank_lines builds the call and reads its output).
# usage: tails.sh RUN_DIR BYTES RANK...
# prints, per rank, a line "@@testbed-rank RANK" then the last BYTES of its stdout; nothing when the run folder is gone.
dir=$1
bytes=$2
shift 2
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
cd -- "$dir" 2> /dev/null || exit 0
for k in "$@"; do
  printf '\n@@testbed-rank %s\n' "$k"
  tail -c "$bytes" "rank$k.out" 2> /dev/null
done
exit 0
