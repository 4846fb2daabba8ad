#!/usr/bin/env bash
# The staged pipeline on a GPU host, one phase per command or several in a row: scripted demonstrations,
# stage 0, stage 1, the suite's standard evaluation, RL, the evaluation again. Stage 1 and RL stop after
# S1_MINUTES / RL_MINUTES and resume where they stopped when the same phase is run again.
#   TASK=<task config> bash benchmarks/gpu_pipeline.sh collect|stage0|stage1|eval|rl|eval_rl ...
# benchmarks/gpu_ml45_10.sh and benchmarks/gpu_libero_object.sh set TASK for ML45-10 and LIBERO-Object.
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
T="task=${TASK:?set TASK to a task config, e.g. metaworld_ml45_10}"
RUN=runs/$TASK
for phase in "$@"; do
echo "== $phase at ${SECONDS}s"
case "$phase" in
  collect) ript collect $T num_workers=16 episodes_per_job=${COLLECT_PER_JOB:-10} ;;
  stage0)  ript stage0 $T run_dir=$RUN/stage0 train.steps=${S0_STEPS:-3000} progress=false ${S0_EXTRA:-} ;;
  stage1)
    resume=false; [ -e $RUN/stage1/checkpoints/last ] && resume=true
    ript stage1 $T run_dir=$RUN/stage1 stage0_checkpoint=$RUN/stage0 train.steps=${S1_STEPS:-10000} \
      train.save_every=1000 train.val_every=1000 train.log_every=200 train.stop_after_minutes=${S1_MINUTES:-8} \
      resume=$resume progress=false ${S1_EXTRA:-} ;;
  eval)    ript eval checkpoint=$RUN/stage1 num_workers=16 out_dir=$RUN/eval ${EVAL_EXTRA:-} ;;
  rl)
    resume=false; [ -e $RUN/rl/checkpoints/last ] && resume=true
    ript rl checkpoint=$RUN/stage1 run_dir=$RUN/rl rl.iterations=${RL_ITERS:-15} rl.num_workers=16 eval.every=0 \
      rl.stop_after_minutes=${RL_MINUTES:-7} resume=$resume ${RL_EXTRA:-} ;;
  eval_rl) ript eval checkpoint=$RUN/rl num_workers=16 out_dir=$RUN/eval_rl ${EVAL_EXTRA:-} ;;
  *) echo "usage: TASK=... $0 collect|stage0|stage1|eval|rl|eval_rl ..." >&2; exit 2 ;;
esac
done
