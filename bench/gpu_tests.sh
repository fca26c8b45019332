#!/usr/bin/env bash
# The gpu lane (tests marked `gpu`, tests/test_gpu.py) on a GPU machine, in one call:
#   bash bench/gpu_tests.sh                        # here, with .venv (CUDA torch and CUDA JAX installed)
#   OUT=$OUT bash bench/gpu_tests.sh               # on the device tool's machine (carry .whl: bench/device_env.sh)
# Each learning claim the tests check goes to $OUT/claims.jsonl, pytest's report to $OUT/gpu_tests.log; record the
# figures in bench/RESULTS.md, section "Learning tests". ROBOTRL_GPU_TESTS_ON_CPU=1 dry-runs the lane on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/robotrl-gpu-tests}
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then
  PYTHON=.venv/bin/python
else  # the device image: its own Python with CUDA torch/JAX, robotrl and the missing dependencies from .whl
  source bench/device_env.sh
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -c "import pytest, pytest_timeout" 2>/dev/null || "$PYTHON" -m pip install -q --no-index \
    --find-links .whl --target /tmp/site pytest pytest-timeout || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
ROBOTRL_CLAIMS="$OUT/claims.jsonl" "$PYTHON" -m pytest tests/test_gpu.py -m gpu -o addopts="" -p no:cacheprovider \
  --timeout "${TIMEOUT:-900}" -q -rA "$@" 2>&1 | tee "$OUT/gpu_tests.log"
exit "${PIPESTATUS[0]}"
