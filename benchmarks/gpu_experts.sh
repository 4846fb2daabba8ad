#!/usr/bin/env bash
# The scripted LIBERO experts' success (benchmarks/libero_experts.py) on a GPU host's CPU cores: one worker per
# core (16 there, 2 here). EXPERT_SUITES (libero_90), EXPERT_EPISODES (20), EXPERT_ONLY (a regular expression);
# runs/experts/libero_experts.json is rewritten as each task finishes, so a poll brings back what is done.
#   bash benchmarks/gpu_background.sh start .libero/preamble.sh benchmarks/gpu_experts.sh
#   bash benchmarks/gpu_background.sh poll 560 runs/experts runs/experts
# A libero_90 bundle (python -m benchmarks.libero_gpu_bundle --suites libero_90) is 118 MiB: carry it over three
# calls, each under the 64 MiB limit with the working tree (the wheels, the GL loader, the preamble and a first
# piece of site.tar.xz under runs/; then the other pieces), and join the pieces into .libero/site.tar.xz first.
set -uo pipefail
mkdir -p runs/experts
python3 -m benchmarks.libero_experts --suites ${EXPERT_SUITES:-libero_90} --episodes ${EXPERT_EPISODES:-20} \
  --workers "$(nproc)" ${EXPERT_ONLY:+--only "$EXPERT_ONLY"} --out runs/experts/libero_experts.json 2>&1 \
  | grep -v -i warning
