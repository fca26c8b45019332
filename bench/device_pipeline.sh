#!/usr/bin/env bash
# PushT as one chain on the device, in one call (timeout_s 600): 648 scripted demos recorded on the device's cores
# (DEMO_EPISODES "200 432": 432 from 64 envs whose episodes end together give 448) -> BC on the GPU at
# bench/device_bc.sh's recipe (batch 1,024, lr 2e-4) -> the online stage from BC's policy with the scripted
# operator (`train hil --device cuda`: Flow-SDE PPO with the sixteenth session's velocity anchor, --bc-coef 1.0, the
# stall criterion, HIL_ENVS envs) -> the one-step distillation of the ONLINE stage's policy (`distill --device cuda`
# at batch DISTILL_BATCH), so that the student carries what RL changed -> its ONNX export. Each stage waits for the
# one before (the chain the issue asks for; the seventeenth session ran online and distill side by side from BC).
# The defaults are the twentieth session's call (bench/RESULTS.md, "PushT in one chain on a GPU"): 546 s on h100,
# the online stage cut by its 160 s at 296,960 of 307,200 env steps (~2,100 env steps/s).
#   SMOKE=1        first `robotrl run --task Reach --budget smoke --device cuda` beside the demos (every torch stage's
#                  GPU path at a tiny budget); 0 skips it
#   DEMOS          a PushT store to carry and use instead of recording one
#   BC_STEPS, BC_BATCH, HIL_STEPS, HIL_ENVS, HIL_MINIBATCH, DISTILL_STEPS, DISTILL_BATCH, DAGGER_EPISODES,
#   GATE_EPISODES, THREADS, and BC_SECONDS / HIL_SECONDS / DISTILL_SECONDS (each stage's time limit; a stage cut by
#   its limit hands on its last checkpoint) set the budget.
#   EPISODES       held-out episodes each stage evaluates on the device (default 0: the policies come back and are
#                  evaluated on dev-2c with `robotrl policy eval --policy P --eval-episodes 500 --eval-envs 25`, off the device's
#                  clock), in ENVS (250) envs
# $OUT gets stages.jsonl (each command's result.json), timing.txt, stderr.txt and policies.tar.* (the BC, online and
# one-step policies with their metrics in 15 MB parts, ~17 MB a policy; `cat policies.tar.* | tar x` joins them; the
# ONNX export, as large again, stays behind: `robotrl policy export` remakes it from the student). Carry .whl
# (bench/device_env.sh), and DEMOS where set. Dry run on dev-2c: NO_WHEELS=1 PYTHON=$PWD/.venv/bin/python DEVICE=cpu
# SMOKE=0 DEMO_EPISODES="4 4" BC_STEPS=20 BC_BATCH=16 HIL_STEPS=2560 HIL_ENVS=4 DISTILL_STEPS=10 DISTILL_BATCH=16
# DAGGER_EPISODES=2 GATE_EPISODES=2 THREADS=2 ENVS=4 bash bench/device_pipeline.sh
set -uo pipefail
OUT=${OUT:-/tmp/robotrl-device-pipeline}
mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
SMOKE=${SMOKE:-1}
BC_STEPS=${BC_STEPS:-4000}
BC_BATCH=${BC_BATCH:-1024}
BC_SECONDS=${BC_SECONDS:-150}
HIL_STEPS=${HIL_STEPS:-307200}
HIL_ENVS=${HIL_ENVS:-64}
HIL_MINIBATCH=${HIL_MINIBATCH:-256}
HIL_SECONDS=${HIL_SECONDS:-160}
DISTILL_STEPS=${DISTILL_STEPS:-2200}
DISTILL_BATCH=${DISTILL_BATCH:-1024}
DISTILL_SECONDS=${DISTILL_SECONDS:-150}
DAGGER_EPISODES=${DAGGER_EPISODES:-50}
GATE_EPISODES=${GATE_EPISODES:-100}
EPISODES=${EPISODES:-0}
ENVS=${ENVS:-250}
THREADS=${THREADS:-12}
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
# a stage's policy, or its last checkpoint where its time limit cut it
saved() { if [ -d "$W/$1/policy" ]; then echo "$W/$1/policy"; elif [ -d "$W/$1/checkpoint" ]; then
  echo "$W/$1/checkpoint"; fi; }
stage() { local name=$1 seconds=$2; shift 2
  timeout "$seconds" "$W/robotrl" "$@" --run-dir "$W/$name" --no-progress >"$W/$name.log" 2>&1
  mark "$name done (rc $?)"; result "$name"; }

if [ -n "${DEMOS:-}" ]; then
  DEMOS=$(realpath "$DEMOS")
else
  DEMOS="$W/demos.zarr"
  read -r DEMOS_A DEMOS_B <<<"${DEMO_EPISODES:-200 432}"
  (robotrl data record --task PushT --episodes "$DEMOS_A" --num-envs 8 --noise 0.5 --seed 0 --out "$DEMOS" &&
    robotrl data record --task PushT --episodes "$DEMOS_B" --num-envs 64 --noise 0.5 --seed 1 --out "$DEMOS") \
    >"$W/record.log" 2>&1 &
fi
if [ "$SMOKE" = 1 ]; then
  timeout 120 "$W/robotrl" run --task Reach --budget smoke --device "$DEVICE" --run-dir "$W/smoke" --no-progress \
    >"$W/smoke.log" 2>&1 && mark "smoke passed" || mark "smoke FAILED (rc $?)"
fi
wait
mark "demos ready"
stage bc "$BC_SECONDS" train bc --store "$DEMOS" --success-only --device "$DEVICE" --steps "$BC_STEPS" \
  --batch-size "$BC_BATCH" --lr 2e-4 --eval-episodes "$EPISODES" --eval-envs "$ENVS" --checkpoint-every 500
BC=$(saved bc)
[ -n "$BC" ] && stage hil "$HIL_SECONDS" train hil --policy "$BC" --demos "$DEMOS" --method flow_sde \
  --num-envs "$HIL_ENVS" --rollout-steps 160 --minibatch-size "$HIL_MINIBATCH" --total-steps "$HIL_STEPS" --ema 0.8 \
  --lr 3e-5 --bc-coef 1.0 --critic-warmup 3 --criterion stall --operator-fraction 0.5 --device "$DEVICE" \
  --threads "$THREADS" --eval-episodes "$EPISODES" --eval-envs "$ENVS"
TEACHER=$(saved hil)
[ -n "$TEACHER" ] && stage distill "$DISTILL_SECONDS" policy distill --teacher "$TEACHER" --store "$DEMOS" \
  --steps "$DISTILL_STEPS" --batch-size "$DISTILL_BATCH" --dagger-rounds 2 --dagger-episodes "$DAGGER_EPISODES" \
  --gate-episodes "$GATE_EPISODES" --eval-episodes "$EPISODES" --eval-envs "$ENVS" --device "$DEVICE" \
  --threads "$THREADS" --checkpoint-every 500
if [ -d "$W/distill/policy" ]; then
  robotrl policy export --policy "$W/distill/policy" --format onnx >"$W/export.log" 2>&1 && mark "onnx exported"
fi
tail -n 25 "$W"/*.log >"$OUT/stderr.txt"
keep=()
for p in bc hil distill; do d=$(saved "$p"); [ -n "$d" ] && keep+=("${d#"$W/"}"); done
for f in bc/metrics.jsonl hil/metrics.jsonl distill/metrics.jsonl distill/result.json smoke/summary.md; do
  [ -f "$W/$f" ] && keep+=("$f"); done
(cd "$W" && tar cf - "${keep[@]}") | split -b 15000000 - "$OUT/policies.tar."
cat "$OUT/timing.txt" "$OUT/stages.jsonl"
