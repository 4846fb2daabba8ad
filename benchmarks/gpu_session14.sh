#!/usr/bin/env bash
# Session 14's lease (H100): the RL update eager vs compiled (benchmarks/rl_update_speed.py), one PPO-GAE
# iteration of OpenVLA-OFT-7B and of OpenVLA-7B with the value head (random weights, official layouts), then
# issue 18's estimator comparison with the runs one after another (benchmarks/gpu_estimators.sh, PARALLEL=1).
# Results go to runs/results as each part ends, so a poll brings back whatever finished.
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_session14.sh
#   bash benchmarks/gpu_background.sh poll 560 runs/est runs/results     # back to back until CHAIN_EXIT
set -uo pipefail
RES=runs/results
mkdir -p $RES
phase() { echo "== $1 at ${SECONDS}s"; }
phase "rl update speed"
python3 -m benchmarks.rl_update_speed --decisions 1024 --image-size 128 --critic --updates 1 \
  --variants eager,compiled --out $RES/rl_update_speed.json 2>&1 | grep -E "^(eager|compiled) " | cut -c1-400
for model in oft openvla; do
  phase "7B $model PPO-GAE iteration"
  steps=$([ $model = oft ] && echo 96 || echo 24)
  python3 -m benchmarks.oft_gpu_rl --model $model --advantage gae --folder /tmp/${model}7b_mw --steps $steps \
    --out $RES/h100_${model}7b_gae_iteration.json 2>&1 | grep -v -E "%\|" | tail -4
  rm -rf /tmp/${model}7b_mw
done
phase "estimators"
# each RL run stops at BUDGET env steps or after RL_MINUTES, whichever comes first (the lease is 30 minutes)
PARALLEL=1 WORKERS=16 BUDGET=${BUDGET:-200000} RL_EXTRA="rl.stop_after_minutes=${RL_MINUTES:-3.2}" \
  OUT=$RES/estimators bash benchmarks/gpu_estimators.sh
phase "session chain done"
