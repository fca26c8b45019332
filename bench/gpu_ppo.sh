#!/usr/bin/env bash
# Issue 6's GPU must-show in one device call (~7 minutes on an H200): PPO on Brax's ant, Brax's own learner then
# ours with the same settings, then ours on the MJX Quadruped. Each bench runs under its own time limit and tees
# its JSON lines to $OUT, so a cut run still returns its curve; extra arguments go to both (e.g. --seed 1).
# The device image lacks brax, mujoco and a few of robotrl's dependencies: carry .whl (bench/device_env.sh).
set -uo pipefail
OUT=${OUT:-/tmp/robotrl-gpu-ppo}
mkdir -p "$OUT"
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${ANT_SECONDS:-400}" python3 bench/ppo_mjx.py --benches ant --total-steps "${ANT_STEPS:-20000000}" "$@" 2>&1 \
  | grep --line-buffered -v -i -e warp -e warnings.warn -e "not actively being maintained" | tee "$OUT/ant.jsonl"
timeout "${QUADRUPED_SECONDS:-140}" python3 bench/ppo_mjx.py --benches quadruped \
  --total-steps "${QUADRUPED_STEPS:-10000000}" "$@" 2>&1 | grep --line-buffered -v -i warp | tee "$OUT/quadruped.jsonl"
