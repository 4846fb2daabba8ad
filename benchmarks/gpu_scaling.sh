#!/usr/bin/env bash
# One GPU vs two (torchrun, NCCL) on a two-GPU host: stage-1 training throughput (per-GPU batch 256)
# and RL iteration time at equal total rollouts, on 10 ML45 tasks x 50 scripted demos.
#   bash benchmarks/gpu_scaling.sh
# RL_ONLY=1 skips the two-GPU stage 1 (S1_STEPS / S1_EXTRA shorten the one stage-1 run the RL runs start from).
# RL at equal total rollouts: one sampling round of exactly B groups of K (rl.oversample=1), split over ranks;
# RL_EGL0=1 adds a two-GPU run whose workers all render on the first GPU (MUJOCO_EGL_DEVICE_ID=0).
# COLLECT_WORKERS (default 16) and RES (results folder, default $RESULTS_DIR or .) as named.
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
ript2() { torchrun --standalone --nproc_per_node=2 -m ript.cli "$@"; }
T=task=metaworld_ml45_10
RUN=runs/scaling
RES=${RES:-${RESULTS_DIR:-.}}
S1="$T stage0_checkpoint=$RUN/stage0 lang.encoder=task_id train.steps=${S1_STEPS:-1000} train.log_every=100
    train.val_every=100000 train.save_every=100000 progress=false ${S1_EXTRA:-}"
RL="rl.iterations=${RL_ITERS:-2} rl.num_workers=${RL_WORKERS:-16} rl.max_episode_steps=200 rl.max_sampling_rounds=1
    rl.oversample=1 rl.groups_per_iteration=${RL_GROUPS:-16} eval.every=0"
echo "== collect at ${SECONDS}s"
[ -e $RUN/stage0 ] || ript collect $T num_workers=${COLLECT_WORKERS:-16} episodes_per_job=5 2>&1 | tr '\r' '\n' \
  | grep -E "steps/s|rror"
echo "== stage0 at ${SECONDS}s"
[ -e $RUN/stage0 ] || ript stage0 $T run_dir=$RUN/stage0 train.steps=1000 progress=false ${S0_EXTRA:-}
echo "== stage1 1 GPU at ${SECONDS}s"; [ -e $RUN/s1_1gpu ] || ript stage1 $S1 run_dir=$RUN/s1_1gpu
if [ "${RL_ONLY:-0}" = 1 ]; then  # the RL comparison only: its stage-1 checkpoint just needs to exist
  echo "== two-GPU stage 1 skipped (RL_ONLY=1)"
else
  echo "== stage1 2 GPUs at ${SECONDS}s"; rm -rf $RUN/s1_2gpu; ript2 stage1 $S1 run_dir=$RUN/s1_2gpu train.batch_size=512
  python3 -m benchmarks.train_compare $RUN/s1_1gpu $RUN/s1_2gpu --out $RES/scaling_stage1.json
fi
echo "== rl 1 GPU at ${SECONDS}s"  # its workers render on its GPU only, as on a one-GPU host
MUJOCO_EGL_DEVICE_ID=0 ript rl checkpoint=$RUN/s1_1gpu run_dir=$RUN/rl_1gpu $RL 2>&1 | grep -E "rl iteration|rror"
echo "== rl 2 GPUs at ${SECONDS}s"; ript2 rl checkpoint=$RUN/s1_1gpu run_dir=$RUN/rl_2gpu $RL 2>&1 | grep -E "rl iteration|rror"
runs="$RUN/rl_1gpu $RUN/rl_2gpu"
if [ "${RL_EGL0:-0}" = 1 ]; then
  echo "== rl 2 GPUs, rendering on GPU 0 only, at ${SECONDS}s"
  MUJOCO_EGL_DEVICE_ID=0 ript2 rl checkpoint=$RUN/s1_1gpu run_dir=$RUN/rl_2gpu_egl0 $RL 2>&1 | grep -E "rl iteration|rror"
  runs="$runs $RUN/rl_2gpu_egl0"
fi
echo "== summary at ${SECONDS}s"
python3 -m benchmarks.train_compare $runs --out $RES/scaling_rl.json --tags time/,rollout/
