#!/usr/bin/env bash
# The claims too long for the default suite (tests marked `slow`: longer training budgets, 200-seed expert checks,
# MJX programs whose CPU compile takes minutes), on demand:
#   bash bench/slow_tests.sh                 # all of them, two xdist workers (about an hour on a 2-core machine)
#   bash bench/slow_tests.sh tests/test_online.py
# Each learning claim they check goes to $OUT/claims.jsonl (tests/conftest.py's `claim`); the spread over seeds is
# bench/learning_tests.py --slow.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/slow-tests}
mkdir -p "$OUT"
ROBOTRL_CLAIMS="$OUT/claims.jsonl" .venv/bin/pytest -m "slow and not gpu" -p no:cacheprovider -q -rA "$@" 2>&1 \
  | tee "$OUT/slow_tests.log"
exit "${PIPESTATUS[0]}"
