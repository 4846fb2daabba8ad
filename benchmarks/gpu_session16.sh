#!/usr/bin/env bash
# Session 16's lease (issue 17, checkpoint selection), in parts:
#   select   ten harder ML45 tasks x 50 demos, stage 0 3,000 steps, stage 1 8,000 steps evaluated in the simulator
#            every 1,000 steps on selection layouts (eval.seed=1, 10 episodes per task); then the standard
#            protocol (seed 0, 20 episodes per task) on checkpoints/best and on the last step: does keeping the
#            best evaluated step beat the last one on layouts it was not chosen on?
#   cudatest the CUDA-only tests (tests/test_policy_cuda.py)
#   hostdata stage 1 (1,000 steps) with the dataset on the GPU and kept in host memory (data.on_device=false)
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_session16.sh select
#   bash benchmarks/gpu_background.sh poll 560 runs/select runs/results     # back to back until CHAIN_EXIT
set -uo pipefail
export RES=runs/results
mkdir -p $RES
phase() { echo "== $1 at ${SECONDS}s"; }
ript() { python3 -m ript.cli "$@" 2>&1 | tr '\r' '\n' | grep -v -E '^\s*(collect|rollout|eval|stage[01]):\s+[0-9]+%'; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
for part in "$@"; do
  case "$part" in
    select)
      R=runs/select T="task=metaworld_ml45_hard10"
      phase "select: collect"
      ript collect $T num_workers=16 episodes_per_job=10 | grep -E "steps/s|rror|average"
      phase "select: stage0"
      ript stage0 $T run_dir=$R/stage0 train.steps=3000 progress=false | grep -E "done|rror"
      phase "select: stage1 (evaluated every 1,000 steps on selection layouts)"
      ript stage1 $T run_dir=$R/stage1 stage0_checkpoint=$R/stage0 train.steps=${SELECT_S1_STEPS:-8000} \
        train.val_every=1000 train.save_every=1000 eval.every=1000 eval.episodes_per_task=10 eval.seed=1 \
        eval.n_videos=0 progress=false | grep -E "val ce|best|average|rror|done"
      for which in best last; do
        phase "select: standard protocol on $which"
        ck=$R/stage1/checkpoints/$which
        ript eval checkpoint=$ck num_workers=16 out_dir=$R/eval_$which n_videos=0 | grep -E "average|steps/s|rror"
        cp $R/eval_$which/results.json $RES/select_eval_$which.json
      done
      for d in $R/stage1/eval/step*; do cp $d/results.json $RES/select_$(basename $d).json; done
      python3 -m benchmarks.train_compare $R/stage1 --out $RES/select_stage1_curves.json >/dev/null 2>&1 || true ;;
    cudatest)
      phase "CUDA tests"
      python3 -m pytest -q -p no:cacheprovider tests/test_policy_cuda.py 2>&1 | tail -4 | tee $RES/cuda_tests.log ;;
    hostdata)
      # stage 1 with the dataset on the GPU and served from host memory (data.on_device=false), same steps
      R=runs/hostdata T="task=metaworld_ml45_10 task.demos_per_task=20"
      phase "hostdata: collect"
      ript collect $T num_workers=16 episodes_per_job=5 | grep -E "steps/s|rror"
      ript stage0 $T run_dir=$R/stage0 train.steps=300 train.compile=false progress=false | grep -E "done|rror"
      for where in true false; do
        phase "hostdata: stage1 data.on_device=$where"
        ript stage1 $T run_dir=$R/stage1_$where stage0_checkpoint=$R/stage0 train.steps=1000 train.log_every=100 \
          train.val_every=1000 data.on_device=$where progress=false | grep -E "val ce|rror|host memory"
      done
      python3 -m benchmarks.train_compare $R/stage1_true $R/stage1_false --out $RES/hostdata.json 2>&1 | tail -4 ;;
    *) echo "unknown part $part (select, cudatest, hostdata)" >&2; exit 2 ;;
  esac
done
phase "session chain done"
