#!/bin/bash
# Eight `processes` appender workers create one new store at the same moment, RUNS times;
# prints every worker's count/exit status per run and any worker's stderr (BENCHMARKS.md,
# "The run that counted 0 events"). Usage: create-race-loop.sh PROCESSES_BINARY RUNS SECONDS
set -u
bin=$1; runs=$2; seconds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for run in $(seq 1 "$runs"); do
  rm -rf "$work/db"
  pids=()
  for p in 0 1 2 3 4 5 6 7; do
    "$bin" --worker appender "$work/db" "$p" 8 "$seconds" shared >"$work/out.$p" 2>"$work/err.$p" &
    pids+=($!)
  done
  line="run $run:"
  for p in 0 1 2 3 4 5 6 7; do
    wait "${pids[$p]}"; status=$?
    line="$line $(cat "$work/out.$p")/$status"
    if [ -s "$work/err.$p" ]; then echo "run $run worker $p: $(head -c 400 "$work/err.$p")"; fi
  done
  echo "$line"
done
