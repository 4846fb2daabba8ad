#!/usr/bin/env bash
# One GPU vs two (torchrun, NCCL) on the nvidia-h200-x2 host: stage-1 training throughput (per-GPU batch 256)
# and RL iteration time at equal total rollouts, on 10 ML45 tasks x 50 scripted demos.
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_scaling.sh
# RL_ONLY=1 skips the two-GPU stage 1 (S1_STEPS / S1_EXTRA shorten the one stage-1 run the RL runs start from).
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
ript2() { torchrun --standalone --nproc_per_node=2 -m ript.cli "$@"; }
T=task=metaworld_ml45_10
RUN=runs/scaling
S1="$T stage0_checkpoint=$RUN/stage0 lang.encoder=task_id train.steps=${S1_STEPS:-1000} train.log_every=100
    train.val_every=100000 train.save_every=100000 progress=false ${S1_EXTRA:-}"
RL="rl.iterations=${RL_ITERS:-2} rl.num_workers=${RL_WORKERS:-16} rl.max_episode_steps=200 rl.max_sampling_rounds=1 eval.every=0"
echo "== collect at ${SECONDS}s"; [ -e $RUN/stage0 ] || ript collect $T num_workers=$(nproc) episodes_per_job=10
echo "== stage0 at ${SECONDS}s"; [ -e $RUN/stage0 ] || ript stage0 $T run_dir=$RUN/stage0 train.steps=1000 progress=false
echo "== stage1 1 GPU at ${SECONDS}s"; [ -e $RUN/s1_1gpu ] || ript stage1 $S1 run_dir=$RUN/s1_1gpu
if [ "${RL_ONLY:-0}" = 1 ]; then  # the RL comparison only: its stage-1 checkpoint just needs to exist
  echo "== two-GPU stage 1 skipped (RL_ONLY=1)"
else
echo "== stage1 2 GPUs at ${SECONDS}s"; rm -rf $RUN/s1_2gpu; ript2 stage1 $S1 run_dir=$RUN/s1_2gpu train.batch_size=512
fi
echo "== rl 1 GPU at ${SECONDS}s"; ript rl checkpoint=$RUN/s1_1gpu run_dir=$RUN/rl_1gpu $RL
echo "== rl 2 GPUs at ${SECONDS}s"; ript2 rl checkpoint=$RUN/s1_1gpu run_dir=$RUN/rl_2gpu $RL
echo "== summary at ${SECONDS}s"
[ -e $RUN/s1_2gpu ] && python3 -m benchmarks.train_compare $RUN/s1_1gpu $RUN/s1_2gpu --out ${OUT:-.}/scaling_stage1.json
python3 -m benchmarks.train_compare $RUN/rl_1gpu $RUN/rl_2gpu --out ${OUT:-.}/scaling_rl.json --tags time/
