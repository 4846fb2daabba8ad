#!/usr/bin/env bash
# Session 15's lease (nvidia-h200-x2: two H200s, 32 cores): the simulator floor with many processes at once
# (benchmarks/render_floor.py: collection's and a rollout's render pattern, 1-32 processes, one or two EGL
# devices), then benchmarks/gpu_scaling.sh (collection with 16 workers, stage 1 and RL on one GPU and on two).
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_session15.sh
#   bash benchmarks/gpu_background.sh poll 560 runs/scaling runs/results     # back to back until CHAIN_EXIT
set -uo pipefail
export RES=runs/results
mkdir -p $RES
phase() { echo "== $1 at ${SECONDS}s"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
phase "render floor, default EGL device"
python3 -m benchmarks.render_floor --procs 1,16,32 --render-every 1,8 --seconds 5 --out $RES/render_default.json \
  2>&1 | grep "^render"
python3 -m benchmarks.render_floor --procs 1,32 --render-every 0 --seconds 4 --out $RES/render_physics.json \
  2>&1 | grep "^render"
phase "render floor, two EGL devices"
python3 -m benchmarks.render_floor --procs 16,32 --render-every 1,8 --seconds 5 --egl-devices 0,1 \
  --out $RES/render_two_devices.json 2>&1 | grep "^render"
phase "scaling"
RL_ITERS=${RL_ITERS:-4} RL_GROUPS=${RL_GROUPS:-32} RL_EGL0=${RL_EGL0:-1} bash benchmarks/gpu_scaling.sh
phase "session chain done"
