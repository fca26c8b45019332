#!/usr/bin/env bash
# Issue 6's GPU must-show in one device call (~7 minutes on an H200): PPO on Brax's ant, Brax's own learner then
# ours with the same settings, then ours on the MJX Quadruped. Each bench runs under its own time limit and tees
# its JSON lines to $OUT, so a cut run still returns its curve; extra arguments go to both (e.g. --seed 1).
# The device image lacks brax, mujoco and a few of robotrl's dependencies: they travel as Python 3.12 wheels in
# .whl/ (git-ignored; carry it), fetched here with
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl brax==0.14.2 mujoco==4.0.0 mujoco-core==4.0.0 \
#     mujoco-studio==4.0.0 mujoco-mjx==3.17.0 jaxopt==0.8.5 ml_collections==1.1.0 trimesh==5.2.0 \
#     gymnasium==1.4.0 farama-notifications zarr==3.1.6 numcodecs==0.16.6 donfig google-crc32c glfw pyopengl
set -uo pipefail
OUT=${OUT:-/tmp/robotrl-gpu-ppo}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
# robotrl.envs etc. map to top-level folders (pyproject package-dir): install the package rather than use $PWD.
python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/robotrl-site . || exit 1
export PYTHONPATH=/tmp/robotrl-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${ANT_SECONDS:-400}" python3 bench/ppo_mjx.py --benches ant --total-steps "${ANT_STEPS:-20000000}" "$@" 2>&1 \
  | grep --line-buffered -v -i -e warp -e warnings.warn -e "not actively being maintained" | tee "$OUT/ant.jsonl"
timeout "${QUADRUPED_SECONDS:-140}" python3 bench/ppo_mjx.py --benches quadruped \
  --total-steps "${QUADRUPED_STEPS:-10000000}" "$@" 2>&1 | grep --line-buffered -v -i warp | tee "$OUT/quadruped.jsonl"
