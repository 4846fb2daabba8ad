#!/usr/bin/env bash
# Installs ript and everything it needs on a Debian-like machine: the EGL/Mesa libraries MuJoCo renders
# headless with, a CPU build of torch where no torch is installed (a GPU build already there is kept),
# and the package itself in editable mode with its test, LIBERO, W&B, LeRobot-format and Ray extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  pkgs="libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri libglx-mesa0"
  if ! dpkg -s $pkgs >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  fi
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  # the registry's torch==2.13.0 is a CPU wheel; an unpinned torch would pull several GB of CUDA packages
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[dev,libero,wandb,lerobot,ray]"
"$PY" -c "import torch, ript; print(f'ript {ript.__version__} installed (torch {torch.__version__})')"
