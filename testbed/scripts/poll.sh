#!/bin/sh
# testbed run: the state of a run's ranks on this host (testbed.run.ranks.poll_command builds the call,
# parse_poll reads its output).
# usage: poll.sh [-t RANK BYTES] RUN_DIR RANK... [-- NAME RANK REGEX ...]
# prints per rank "R rank exit alive start end" ("-" where not known yet; alive is 1 or 0), then "T NAME" for
# each extended REGEX found in the stdout or stderr of its RANK, then with -t a line "TAIL" followed by the last
# BYTES of RANK's stdout (to the end of the output); only "NODIR" when the run folder is gone.
tail_rank=
tail_bytes=
if [ "$1" = -t ]; then
  tail_rank=$2
  tail_bytes=$3
  shift 3
fi
dir=$1
shift
case $dir in \~) dir=$HOME ;; \~/*) dir=$HOME/${dir#\~/} ;; esac
cd -- "$dir" 2> /dev/null || { echo NODIR; exit 0; }
# each file holds one line: read by the shell itself, not by a cat per file (a poll reaches every host each second)
first() {
  v=
  { IFS= read -r v < "$1"; } 2> /dev/null || :
}
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  k=$1
  shift
  first "rank$k.exit"
  e=$v
  first "rank$k.pid"
  p=$v
  a=-
  if [ -n "$p" ]; then
    if kill -0 "$p" 2> /dev/null; then a=1; else a=0; fi
  fi
  first "rank$k.start"
  s=$v
  first "rank$k.end"
  n=$v
  echo "R $k ${e:--} $a ${s:--} ${n:--}"
done
[ $# -gt 0 ] && shift
while [ $# -ge 3 ]; do
  grep -E -q -e "$3" "rank$2.out" "rank$2.err" 2> /dev/null && printf 'T %s\n' "$1"
  shift 3
done
if [ -n "$tail_rank" ]; then
  echo TAIL
  tail -c "$tail_bytes" "rank$tail_rank.out" 2> /dev/null
fi
exit 0
