#!/usr/bin/env bash
# The scripted LIBERO experts' success (benchmarks/libero_experts.py) on a GPU host's CPU cores: one worker per
# core (16 there, 2 here). EXPERT_SUITES (libero_90), EXPERT_EPISODES (20), EXPERT_ONLY (a regular expression);
# runs/experts/libero_experts.json is rewritten as each task finishes, so a run cut short keeps what is done.
#   source .libero/preamble.sh && bash benchmarks/gpu_experts.sh
# (.libero/ from python -m tools.libero_bundle --suites libero_90: 118 MiB for libero_90.)
set -uo pipefail
mkdir -p runs/experts
python3 -m benchmarks.libero_experts --suites ${EXPERT_SUITES:-libero_90} --episodes ${EXPERT_EPISODES:-20} \
  --workers "$(nproc)" ${EXPERT_ONLY:+--only "$EXPERT_ONLY"} --out runs/experts/libero_experts.json 2>&1 \
  | grep -v -i warning
