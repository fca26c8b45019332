#!/usr/bin/env bash
# Issue 7's Flow-Noise vs Flow-SDE vs denoising-MDP comparison on PickPlace, in one call on the device machine:
# its 16 CPU cores run every (method, seed) of bench/flow_rl.py as its own single-threaded process at once (the
# same bench, settings and BC start as on dev-2c; the learners are CPU torch, so the GPU is not used). $OUT gets
# runs.jsonl (the bench's lines of every process), metrics.jsonl (every run's metrics, tagged with its run, also
# when the time limit cut it: a cut run still returns its evaluation curve) and stderr.txt.
#   POLICY       the BC flow checkpoint every run starts from (carry it, e.g. .runs/pp-bc/policy)
#   BC_SUCCESS   its success on the same held-out episodes (measured once elsewhere: `bench/flow_rl.py --runs`)
#   METHODS, SEEDS, SECONDS_PER_RUN and any extra arguments (passed to every process) set the grid and budget.
# The device image lacks a few of robotrl's dependencies: carry .whl (bench/device_env.sh).
set -uo pipefail
OUT=${OUT:-/tmp/robotrl-flow-rl}
mkdir -p "$OUT"
source bench/device_env.sh
nproc | tee "$OUT/nproc.txt"
export OMP_NUM_THREADS=1
RUNS=$(mktemp -d /tmp/flow-rl-runs.XXXX)
mkdir -p "$RUNS"
for method in ${METHODS:-denoising_mdp flow_sde flow_noise}; do
  for seed in ${SEEDS:-0 1 2}; do
    timeout "${SECONDS_PER_RUN:-500}" "$PYTHON" bench/flow_rl.py --policy "$POLICY" --bc-success "$BC_SUCCESS" \
      --runs "$method" --seeds "$seed" --out-dir "$RUNS" "$@" >"$RUNS/$method-$seed.jsonl" 2>"$RUNS/$method-$seed.err" &
  done
done
wait
# few files come back from the device: one of each kind, every line tagged with its run
cat "$RUNS"/*.jsonl >"$OUT/runs.jsonl"
for d in "$RUNS"/*/; do
  [ -f "$d/metrics.jsonl" ] && sed "s/^{/{\"run_dir\": \"$(basename "$d")\", /" "$d/metrics.jsonl"
done >"$OUT/metrics.jsonl"
tail -n +1 "$RUNS"/*.err >"$OUT/stderr.txt"
cat "$OUT/runs.jsonl"
