#!/usr/bin/env bash
# The whole suite with CPU-bound processes beside it (2 by default: one per core on the 2-core machines the
# suite is run on), the way a shared CI machine loads it. Not part of CI. Usage:
#   scripts/stress-test.sh [HOGS] [RUNS]   # e.g. scripts/stress-test.sh 2 3: three runs in a row, each timed
set -euo pipefail
cd "$(dirname "$0")/.."
hogs="${1:-2}"
runs="${2:-1}"
pids=()
stop_hogs() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for _ in $(seq "$hogs"); do
  (while :; do :; done) &
  pids+=("$!")
done
status=0
for run in $(seq "$runs"); do
  began=$(date +%s)
  if make test; then outcome=passed; else
    outcome=failed; status=1
    # The next run starts the chaos stacks afresh: keep this run's role logs for the diagnosis.
    kept=".ledgerlm/stress-failures/run-$run"
    mkdir -p "$kept"
    for stack in .ledgerlm/test-chaos-*; do
      [ -d "$stack/logs" ] && cp -r "$stack/logs" "$kept/$(basename "$stack")"
    done
    echo "stress run $run: role logs of the chaos stacks kept in $kept"
  fi
  echo "stress run $run/$runs: $outcome in $(( $(date +%s) - began )) s with $hogs CPU hogs (load $(cut -d' ' -f1-3 /proc/loadavg))"
done
exit "$status"
