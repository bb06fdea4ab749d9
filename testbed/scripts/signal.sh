#!/bin/sh
# testbed run: send a signal to ranks' process groups (testbed.run.ranks.signal_ranks); a rank without a pid
# file (not started, or its folder gone) is skipped.
# usage: signal.sh RUN_DIR SIGNAL RANK...   (SIGNAL: TERM, KILL, SEGV...)
dir=$1
sig=$2
shift 2
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
cd -- "$dir" 2> /dev/null || exit 0
for k in "$@"; do
  p=$(cat "rank$k.pid" 2> /dev/null)
  [ -n "$p" ] && kill -s "$sig" -- "-$p" 2> /dev/null
done
exit 0
