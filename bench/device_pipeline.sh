#!/usr/bin/env bash
# PushT stage by stage on the device, in one call (timeout_s 600): first `robotrl run --task Reach --preset smoke
# --device cuda` (every torch stage on the GPU at a tiny budget: the GPU paths of `train hil` and `distill`, which
# dev-2c cannot run), then from 1,032 PushT demos BC on the GPU at bench/device_bc.sh's 98% recipe (batch 1,024, lr
# 2e-4), and from its policy, side by side, the online stage with the scripted operator (`train hil --device cuda`)
# (with the sixteenth session's velocity anchor, --bc-coef 1.0) and the one-step distillation (`distill --device cuda`
# at batch DISTILL_BATCH: the student's share of the samples a GPU gives), each evaluated on the 500 held-out seeds;
# last the student's ONNX export, evaluated alike.
#   DEMOS          a PushT store to carry and use; by default the call records bench/device_bc.sh's 1,032 demos
#                  (200 from seed 0 with 8 envs, 832 from seed 1 with 64, noise 0.5) on the device's cores while
#                  the smoke run goes (the store is ~60 MB: too large to carry beside the wheels; DEMO_EPISODES
#                  "200 832" sets the two counts)
#   BC_STEPS, BC_BATCH, DISTILL_STEPS, DISTILL_BATCH, DAGGER_EPISODES, GATE_EPISODES, HIL_STEPS, EPISODES (held-out),
#   ENVS and STAGE_SECONDS (each stage's time limit) set the budget. BC_EPISODES (BC's own evaluation) is 0 by
#   default: the first call (2026-11-26, bench/RESULTS.md) spent BC's 200 s on 6,000 steps and lost its evaluation
#   (500 episodes take ~20 s there), and distill's on training; BC's policy comes back and is evaluated on dev-2c
#   (`robotrl eval --policy bc/policy --episodes 500 --num-envs 25`).
# $OUT gets stages.jsonl (each command's result.json or evaluation line), timing.txt, stderr.txt and policies.tar.*
# (the BC, online and one-step policies in 15 MB parts, a stage's checkpoint where its time ran out; `cat
# policies.tar.* | tar x` joins them). Carry .whl (bench/device_env.sh), and DEMOS where set. Dry run on dev-2c:
# NO_WHEELS=1 PYTHON=$PWD/.venv/bin/python DEVICE=cpu with small budgets and batches.
set -uo pipefail
OUT=${OUT:-/tmp/robotrl-device-pipeline}
mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
BC_STEPS=${BC_STEPS:-6000}
BC_BATCH=${BC_BATCH:-1024}
DISTILL_STEPS=${DISTILL_STEPS:-3500}
DISTILL_BATCH=${DISTILL_BATCH:-1024}
HIL_STEPS=${HIL_STEPS:-102400}
STAGE_SECONDS=${STAGE_SECONDS:-240}  # demos 2 min, BC 3.3 (6,000 steps), hil 2.3 beside distill 3.8: ~9.5 min
DAGGER_EPISODES=${DAGGER_EPISODES:-50}
GATE_EPISODES=${GATE_EPISODES:-100}
EPISODES=${EPISODES:-500}
BC_EPISODES=${BC_EPISODES:-0}
ENVS=${ENVS:-250}
source bench/device_env.sh
export OMP_NUM_THREADS=1
W=$(mktemp -d /tmp/device-pipeline.XXXX)
# an executable (timeout runs no shell function), run from / : python -c puts the working directory first on
# sys.path, and the repo's robotrl/ folder is not the package; so every path below is absolute
cat >"$W/robotrl" <<EOF
#!/usr/bin/env bash
cd / && exec "$PYTHON" -c 'import sys; from robotrl.cli import main; sys.argv[0] = "robotrl"; main()' "\$@"
EOF
chmod +x "$W/robotrl"
robotrl() { "$W/robotrl" "$@"; }
t0=$(date +%s)
mark() { echo "$1 at $(($(date +%s) - t0)) s" | tee -a "$OUT/timing.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/timing.txt" 2>/dev/null
result() { [ -f "$W/$1/result.json" ] && "$PYTHON" -c "import json, sys; r = json.load(open(sys.argv[1])); \
print(json.dumps({'stage': sys.argv[2], **r}))" "$W/$1/result.json" "$1" >>"$OUT/stages.jsonl"; }

if [ -n "${DEMOS:-}" ]; then
  DEMOS=$(realpath "$DEMOS")
else
  DEMOS="$W/demos.zarr"
  read -r DEMOS_A DEMOS_B <<<"${DEMO_EPISODES:-200 832}"
  (robotrl data record --task PushT --episodes "$DEMOS_A" --num-envs 8 --noise 0.5 --seed 0 --out "$DEMOS" &&
    robotrl data record --task PushT --episodes "$DEMOS_B" --num-envs 64 --noise 0.5 --seed 1 --out "$DEMOS") \
    >"$W/record.log" 2>&1 &
fi
timeout 120 "$W/robotrl" run --task Reach --preset smoke --device "$DEVICE" --run-dir "$W/smoke" --no-progress \
  >"$W/smoke.log" 2>&1 && mark "smoke passed" || mark "smoke FAILED (rc $?)"
wait
mark "demos ready"
timeout "$STAGE_SECONDS" "$W/robotrl" train bc --store "$DEMOS" --policy flow --success-only --device "$DEVICE" \
  --steps "$BC_STEPS" --batch-size "$BC_BATCH" --lr 2e-4 --eval-episodes "$BC_EPISODES" --eval-envs "$ENVS" \
  --checkpoint-every 1000 --run-dir "$W/bc" --no-progress >"$W/bc.log" 2>&1
mark "bc done (rc $?)"
result bc
BC="$W/bc/policy"
[ -d "$BC" ] || BC="$W/bc/checkpoint"
timeout "$STAGE_SECONDS" "$W/robotrl" train hil --policy "$BC" --demos "$DEMOS" --method flow_sde --num-envs 16 \
  --rollout-steps 160 --total-steps "$HIL_STEPS" --ema 0.8 --lr 3e-5 --bc-coef 1.0 --critic-warmup 1000 \
  --criterion stall --operator-fraction 0.5 --device "$DEVICE" --threads 4 --eval-episodes "$EPISODES" \
  --eval-envs "$ENVS" --run-dir "$W/hil" --no-progress >"$W/hil.log" 2>&1 &
timeout "$STAGE_SECONDS" "$W/robotrl" distill --teacher "$BC" --store "$DEMOS" --steps "$DISTILL_STEPS" \
  --batch-size "$DISTILL_BATCH" --dagger-rounds 2 --dagger-episodes "$DAGGER_EPISODES" \
  --gate-episodes "$GATE_EPISODES" --eval-episodes "$EPISODES" --eval-envs "$ENVS" --device "$DEVICE" --threads 4 \
  --run-dir "$W/distill" --no-progress >"$W/distill.log" 2>&1
mark "distill done (rc $?)"
wait
mark "hil done"
result hil
result distill
if [ -d "$W/distill/policy" ] && [ "$EPISODES" -gt 0 ]; then
  robotrl export --policy "$W/distill/policy" --format onnx >"$W/export.log" 2>&1
  robotrl eval --policy "$W/distill/policy-onnx" --episodes "$EPISODES" --num-envs "$ENVS" 2>>"$W/export.log" \
    | tail -n 1 | sed 's/^{/{"stage": "onnx", /' >>"$OUT/stages.jsonl"
  mark "onnx evaluated"
fi
tail -n 25 "$W"/*.log >"$OUT/stderr.txt"
keep=()
# at most 8 files of 16 MiB come back: three policies of ~17 MB in four parts, beside the three text files
[ -d "$W/bc/policy" ] && keep+=(bc/policy) || { [ -d "$W/bc/checkpoint" ] && keep+=(bc/checkpoint); }
for p in hil distill; do
  [ -d "$W/$p/policy" ] && keep+=("$p/policy") || { [ -d "$W/$p/checkpoint" ] && keep+=("$p/checkpoint"); }
done
for f in bc/metrics.jsonl hil/metrics.jsonl distill/metrics.jsonl smoke/summary.md; do [ -f "$W/$f" ] && keep+=("$f"); done
(cd "$W" && tar cf - "${keep[@]}") | split -b 15000000 - "$OUT/policies.tar."
cat "$OUT/timing.txt" "$OUT/stages.jsonl"
