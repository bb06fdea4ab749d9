#!/bin/sh
# testbed run: unpack the ranks' scripts (a tar.gz on stdin) into the run folder and start each rank detached
# under tb-rank.sh, so that it survives this SSH session (testbed.run.ranks.launch).
# usage: launch.sh RUN_DIR ATTEMPT RANK... [-- LAUNCHER...]   (rank K runs rankK.aATTEMPT.sh)
# With a LAUNCHER (a batch scheduler's step command, e.g. srun --overlap --jobid=J ...), tb-rank.sh starts under
# it; its messages go to rankK.launch, and a launcher that ends before the rank starts fails the launch with them.
dir=$1
attempt=$2
shift 2
ranks=
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  ranks="$ranks $1"
  shift
done
[ $# -gt 0 ] && shift
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
cd -- "$dir" && tar xzf - || exit 1
if [ $# -eq 0 ]; then
  for k in $ranks; do
    setsid nohup sh ./tb-rank.sh "$k" "rank$k.a$attempt.sh" > /dev/null 2>&1 < /dev/null &
  done
  exit 0
fi
pids=
for k in $ranks; do
  rm -f "rank$k.start"
  setsid nohup "$@" sh ./tb-rank.sh "$k" "rank$k.a$attempt.sh" > /dev/null 2> "rank$k.launch" < /dev/null &
  pids="$pids $k:$!"
done
# wait (bounded: 60 s) until each rank started, or its launcher ended without starting it
rc=0
for kp in $pids; do
  k=${kp%%:*}
  p=${kp#*:}
  n=0
  while [ ! -f "rank$k.start" ]; do
    if ! kill -0 "$p" 2> /dev/null; then
      [ -f "rank$k.start" ] && break
      echo "rank $k did not start under '$1': $(tail -n 3 "rank$k.launch" 2> /dev/null | tr '\n' ' ')" >&2
      rc=1
      break
    fi
    n=$((n + 1))
    if [ "$n" -ge 300 ]; then
      echo "rank $k had not started under '$1' after 60 s: $(tail -n 3 "rank$k.launch" 2> /dev/null | tr '\n' ' ')" >&2
      rc=1
      break
    fi
    sleep 0.2 2> /dev/null || sleep 1
  done
done
exit $rc
