#!/bin/sh
# testbed rank wrapper, uploaded into each run folder (testbed.run.ranks.upload) and started detached by
# launch.sh: runs one rank and records how it ended.
# usage: tb-rank.sh K SCRIPT
# writes rankK.start, rankK.pid (the rank's process group), rankK.out and rankK.err (appended across attempts),
# rankK.end and rankK.exit (the exit status; 128+N when killed by signal N)
k=$1
script=$2
cd "$(dirname "$0")" || exit 1
if [ -n "${SLURM_STEP_ID:-}" ]; then
  # started as a step of a Slurm job (launch.sh's launcher): the rank gets none of the step's variables, or an
  # MPI inside it would take this one-task step for its own launch; TESTBED_SLURM_JOB names the job
  TESTBED_SLURM_JOB=$SLURM_JOB_ID
  export TESTBED_SLURM_JOB
  for v in $(env | sed -n -e 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p' -e 's/^\(PMIX\{0,1\}_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
  done
fi
rm -f "rank$k.exit" "rank$k.end" "rank$k.pid"
date +%s.%N > "rank$k.start"
setsid sh "./$script" >> "rank$k.out" 2>> "rank$k.err" < /dev/null &
pid=$!
echo "$pid" > "rank$k.pid"
wait "$pid"
rc=$?
date +%s.%N > "rank$k.end"
echo "$rc" > "rank$k.exit.tmp" && mv "rank$k.exit.tmp" "rank$k.exit"
