#!/usr/bin/env bash
# The GPU acceptance run of the staged pipeline: 10 ML45 train tasks x 50 scripted demos, stage 0, stage 1,
# then 20 evaluation episodes per task. Each phase fits one 10-minute device command; stage 1 is split
# into several commands with stop_after_minutes + resume=true.
#   bash benchmarks/gpu_ml45_10.sh collect|stage0|stage1|eval|rl|eval_rl
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
T="task=metaworld_ml45_10"
RUN=runs/metaworld_ml45_10
case "$1" in
  collect) ript collect $T num_workers=16 episodes_per_job=10 ;;
  stage0)  ript stage0 $T run_dir=$RUN/stage0 train.steps=${S0_STEPS:-3000} progress=false ${S0_EXTRA:-} ;;
  stage1)
    resume=false; [ -e $RUN/stage1/checkpoints/last ] && resume=true
    ript stage1 $T run_dir=$RUN/stage1 stage0_checkpoint=$RUN/stage0 train.steps=${S1_STEPS:-10000} \
      train.save_every=1000 train.val_every=1000 train.log_every=200 train.stop_after_minutes=${S1_MINUTES:-8} \
      resume=$resume progress=false ${S1_EXTRA:-} ;;
  eval)    ript eval checkpoint=$RUN/stage1 episodes_per_task=20 num_workers=16 out_dir=$RUN/eval ${EVAL_EXTRA:-} ;;
  rl)
    resume=false; [ -e $RUN/rl/checkpoints/last ] && resume=true
    ript rl checkpoint=$RUN/stage1 run_dir=$RUN/rl rl.iterations=${RL_ITERS:-15} rl.num_workers=16 eval.every=0 \
      rl.stop_after_minutes=${RL_MINUTES:-7} resume=$resume ${RL_EXTRA:-} ;;
  eval_rl) ript eval checkpoint=$RUN/rl episodes_per_task=20 num_workers=16 out_dir=$RUN/eval_rl ;;
  *) echo "usage: $0 collect|stage0|stage1|eval|rl|eval_rl" >&2; exit 2 ;;
esac
