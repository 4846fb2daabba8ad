#!/usr/bin/env bash
# Issue 16's one-GPU measurements in one lease, most important first (the lease ends after 30 minutes held):
#  1. the 10-task ML45 chain end to end, each phase timed (collect -> stage 0 -> stage 1 -> eval -> RL -> eval);
#  2. rollout throughput of the runner: lock-step vs two groups, one or two envs per worker;
#  3. the resume tests on the GPU (compile + CUDA graphs + TF32 + channels-last are on there by default);
#  4. stage-1 training speed at larger batches.
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_speed.sh
#   bash benchmarks/gpu_background.sh poll 560 runs/metaworld_ml45_10     # back to back until CHAIN_EXIT
set -uo pipefail
here=$(dirname "$0")
phase() { echo "== $1 at ${SECONDS}s"; }
W="workers.envs_per_worker=${ENVS_PER_WORKER:-2}"
export S0_STEPS=${S0_STEPS:-3000} S1_STEPS=${S1_STEPS:-8000} S1_MINUTES=${S1_MINUTES:-20} RL_ITERS=${RL_ITERS:-37}
export RL_MINUTES=${RL_MINUTES:-9} EVAL_EXTRA="$W"
export RL_EXTRA="rl.task_weighting=informative rl.lr=2e-5 rl.train_prior_only=false rl.micro_batch=256 $W"
for p in collect stage0 stage1 eval rl eval_rl; do
  phase "chain: $p"
  bash "$here/gpu_ml45_10.sh" "$p" 2>&1 | tr '\r' '\n' | grep -v -E '^\s*(collect|rollout|eval):\s+[0-9]+%'
done
phase "chain done"
for v in "1 1" "2 1" "2 2" "1 2"; do
  set -- $v
  phase "profile_rollout groups=$1 envs_per_worker=$2"
  python3 -m benchmarks.profile_rollout --workers 16 --groups "$1" --envs-per-worker "$2" --episodes 64 \
    --steps 200 --overrides task.render.image_size=128 2>&1 | grep -v -i warn | head -16
done
phase "resume tests on the GPU"
python3 -m pytest -q -x -p no:cacheprovider tests/test_pipeline.py -k resume 2>&1 | tail -5
for b in 512 1024; do
  phase "train_speed batch $b"
  python3 -m benchmarks.train_speed --variants bf16+cl+tf32+compile+graphs --batch "$b" 2>&1 | grep -v -i warn | tail -6
done
phase "all done"
