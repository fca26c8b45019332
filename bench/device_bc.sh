#!/usr/bin/env bash
# PushT BC on the device's GPU in one call (~8 minutes: run it with timeout_s 600): the scripted expert's demos
# recorded on its CPU cores (200 episodes at noise 0.5 exactly as dev-2c's nominal2.zarr, plus ~800 more from other
# seeds), then three `bench/gpu_bc.py` processes side by side on the one GPU, each `robotrl train bc --device cuda`
# fitted to BC_SECONDS and evaluated on 500 held-out seeds: the 200-demo store and the ~1,000-demo store at batch 256
# and lr 1e-4, and the ~1,000-demo store at batch 1024 and lr 2e-4 (a small U-Net's step on a GPU costs about the
# same at either batch). $OUT gets runs.jsonl (one line per run), stderr.txt, and policies.tar.* (every run's policy,
# config and metrics, split in 15 MB parts: the device returns files of at most 16 MiB; `cat policies.tar.* | tar x`
# joins them).
# Carry .whl (bench/device_env.sh; brax, jaxopt, mujoco_mjx, ml_collections and trimesh are not needed here).
set -uo pipefail
OUT=${OUT:-/tmp/robotrl-device-bc}
mkdir -p "$OUT"
BC_SECONDS=${BC_SECONDS:-270}
DEMOS=${DEMOS:-200 800}  # the first store, and the episodes added for the second
source bench/device_env.sh
export OMP_NUM_THREADS=1
# from / : python -c puts the working directory first on sys.path, and the repo's robotrl/ folder is not the package
robotrl() { (cd / && "$PYTHON" -c 'import sys; from robotrl.cli import main; sys.argv[0] = "robotrl"; main()' "$@"); }
W=$(mktemp -d /tmp/device-bc.XXXX)
date +%s >"$W/t0"
bc() {  # name store batch lr: one gpu_bc.py process in the background
  # shellcheck disable=SC2086  # BC_ARGS: further gpu_bc.py options, word-split on purpose
  timeout $((BC_SECONDS + 150)) "$PYTHON" bench/gpu_bc.py --store "$W/$2.zarr" --run-dir "$W/bc-$1" \
    --seconds "$BC_SECONDS" --batch-size "$3" --lr "$4" ${BC_ARGS:-} >"$W/$1.jsonl" 2>"$W/$1.err" &
}
read -r DEMOS_A DEMOS_B <<<"$DEMOS"
robotrl data record --task PushT --episodes "$DEMOS_A" --num-envs 8 --noise 0.5 --seed 0 --out "$W/a.zarr" >"$W/rec-a.log" 2>&1
echo "$DEMOS_A demos at $(($(date +%s) - $(cat "$W/t0"))) s" | tee "$OUT/timing.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/timing.txt"
cp -r "$W/a.zarr" "$W/all.zarr"  # `record --out` appends to a store of the same spec
robotrl data record --task PushT --episodes "$DEMOS_B" --num-envs 64 --noise 0.5 --seed 1 --out "$W/all.zarr" \
  >"$W/rec-all.log" 2>&1
echo "all demos at $(($(date +%s) - $(cat "$W/t0"))) s" >>"$OUT/timing.txt"
bc a a 256 1e-4  # the three start together: each probe then measures the GPU shared three ways
bc all all 256 1e-4
bc all-b1024 all 1024 2e-4
wait
echo "trained and evaluated at $(($(date +%s) - $(cat "$W/t0"))) s" >>"$OUT/timing.txt"
cat "$W"/a.jsonl "$W"/all.jsonl "$W"/all-b1024.jsonl >"$OUT/runs.jsonl"
tail -n 30 "$W"/*.log "$W"/*.err >"$OUT/stderr.txt"
# the final EMA policy of each run, or its last checkpoint where the time limit cut the run
keep=()
for n in a all all-b1024; do
  [ -d "$W/bc-$n/policy" ] && keep+=("bc-$n/policy") || keep+=("bc-$n/checkpoint")
  keep+=("bc-$n/config.json" "bc-$n/metrics.jsonl")
done
(cd "$W" && tar cf - "${keep[@]}" 2>/dev/null) | split -b 15000000 - "$OUT/policies.tar."
cat "$OUT/timing.txt" "$OUT/runs.jsonl"
