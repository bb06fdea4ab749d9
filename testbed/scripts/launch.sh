#!/bin/sh
# testbed run: unpack the ranks' scripts (a tar.gz on stdin) into the run folder and start each rank detached
# under tb-rank.sh, so that it survives this SSH session (testbed.run.remote.launch).
# usage: launch.sh RUN_DIR ATTEMPT RANK...   (rank K runs rankK.aATTEMPT.sh)
dir=$1
attempt=$2
shift 2
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
cd -- "$dir" && tar xzf - || exit 1
for k in "$@"; do
  setsid nohup sh ./tb-rank.sh "$k" "rank$k.a$attempt.sh" > /dev/null 2>&1 < /dev/null &
done
exit 0
