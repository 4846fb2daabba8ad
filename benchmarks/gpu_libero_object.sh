#!/usr/bin/env bash
# The GPU acceptance run on LIBERO-Object: scripted demonstrations (50 per task), stage 0, stage 1, the
# standard protocol (50 episodes per task from the packaged init states), RL, the standard protocol again.
# LIBERO travels to the offline GPU host as .libero/ (python -m benchmarks.libero_gpu_bundle); carry it and
# data/libero/libero_object/lang_cache.safetensors (the instructions' embeddings, made here), then
#   source .libero/preamble.sh && bash benchmarks/gpu_libero_object.sh collect|stage0|stage1|eval|rl|eval_rl ...
# Several phases run one after the other.
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
T="task=libero_object"
RUN=runs/libero_object
for phase in "$@"; do
echo "== $phase at ${SECONDS}s"
case "$phase" in
  collect) ript collect $T num_workers=16 episodes_per_job=5 ;;
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
  *) echo "usage: $0 collect|stage0|stage1|eval|rl|eval_rl" >&2; exit 2 ;;
esac
done
