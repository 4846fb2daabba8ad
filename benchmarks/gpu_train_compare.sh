#!/usr/bin/env bash
# Validation curves of stages 0 and 1 at equal steps, eager (as before the fast step) vs the default fast step
# (torch.compile + CUDA graphs, channels-last, bf16), on 10 ML45 tasks x 50 scripted demos; then a summary table.
#   bash benchmarks/gpu_train_compare.sh
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
T=task=metaworld_ml45_10
RUN=runs/train_compare
EAGER="train.compile=false train.channels_last=false"
S0="train.steps=${S0_STEPS:-3000} train.val_every=500 train.log_every=100 progress=false"
S1="lang.encoder=task_id train.steps=${S1_STEPS:-3000} train.val_every=500 train.log_every=100 train.save_every=1000 progress=false"
echo "== collect at ${SECONDS}s"; [ -e data/metaworld_ml45_10/reach-v3.hdf5 ] || ript collect $T num_workers=16 episodes_per_job=10
echo "== stage0 eager at ${SECONDS}s"; [ -e $RUN/stage0_eager/checkpoints/last ] || ript stage0 $T run_dir=$RUN/stage0_eager $S0 $EAGER
echo "== stage0 fast at ${SECONDS}s"; [ -e $RUN/stage0_fast/checkpoints/last ] || ript stage0 $T run_dir=$RUN/stage0_fast $S0
echo "== stage1 eager at ${SECONDS}s"; ript stage1 $T run_dir=$RUN/stage1_eager stage0_checkpoint=$RUN/stage0_fast $S1 $EAGER
echo "== stage1 fast at ${SECONDS}s"; ript stage1 $T run_dir=$RUN/stage1_fast stage0_checkpoint=$RUN/stage0_fast $S1
echo "== summary at ${SECONDS}s"
python3 -m benchmarks.train_compare $RUN/stage0_eager $RUN/stage0_fast $RUN/stage1_eager $RUN/stage1_fast \
  --out ${RESULTS_DIR:-.}/train_compare.json
