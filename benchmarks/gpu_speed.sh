#!/usr/bin/env bash
# One-GPU speed measurements, one part after another (the most important first, in case the host's time runs out):
#   chain    the 10-task ML45 chain end to end, each phase timed (collect -> stage 0 -> stage 1 -> eval -> RL -> eval)
#   profile  rollout throughput of the runner: lock-step or two groups, 1 / 2 / 4 envs per worker (PROFILE="g,e ...")
#   resume   exact resume on the GPU with the fast step on (benchmarks/gpu_resume.sh; needs the chain's data)
#   resume10 collects 10 demos per task, then exact resume with deterministic kernels and without (short runs)
#   train    stage-0/1 training speed at batch 512 and 1024
#   bench    the one-report benchmark (benchmarks/bench.py: every figure against its floor and target;
#            BENCH_EXTRA passes arguments on, e.g. "--overrides task.render.image_size=128")
#   rl       a short ML45-10 chain (DEMOS per task, stage 0/1 of S0_SHORT/S1_SHORT steps), then RL_SHORT RL
#            iterations with the old one-for-one draw (rl.oversample=1) and with rl.oversample=auto, same checkpoint
#            (OVERSAMPLES="auto" runs only the second)
#   bash benchmarks/gpu_speed.sh chain profile resume
#   (as a detached job: bash tools/detached_job.sh start .whl/preamble.sh benchmarks/gpu_speed.sh chain ...)
# The MiniLM text model is not on the GPU host: carry data/metaworld/lang_cache.safetensors (made on a CPU
# machine, see docs/install.md), which stage 1 reads instead.
set -uo pipefail
here=$(dirname "$0")
phase() { echo "== $1 at ${SECONDS}s"; }
W="workers.envs_per_worker=${ENVS_PER_WORKER:-2}"
export S0_STEPS=${S0_STEPS:-3000} S1_STEPS=${S1_STEPS:-8000} S1_MINUTES=${S1_MINUTES:-20} RL_ITERS=${RL_ITERS:-37}
export RL_MINUTES=${RL_MINUTES:-9} EVAL_EXTRA="$W"
export RL_EXTRA="rl.task_weighting=informative rl.lr=2e-5 rl.train_prior_only=false rl.micro_batch=256 $W"
for part in "$@"; do
  case "$part" in
    chain)
      for p in collect stage0 stage1 eval rl eval_rl; do
        phase "chain: $p"
        bash "$here/gpu_ml45_10.sh" "$p" 2>&1 | tr '\r' '\n' | grep -v -E '^\s*(collect|rollout|eval):\s+[0-9]+%'
      done ;;
    profile)
      for v in ${PROFILE:-1,1 1,2 1,4 2,4}; do
        groups=${v%,*} per=${v#*,}
        phase "profile_rollout groups=$groups envs_per_worker=$per"
        python3 -m benchmarks.profile_rollout --workers 16 --groups "$groups" --envs-per-worker "$per" \
          --episodes 64 --steps 200 --overrides task.render.image_size=128 2>&1 | grep -v -i warn | head -16
      done ;;
    resume)
      phase "resume on the GPU"; bash "$here/gpu_resume.sh" 2>&1 | grep -E "^==|stopped at|tensors|error|Error" ;;
    resume10)
      phase "collect 10 demos per task"
      python3 -m ript.cli collect task=metaworld_ml45_10 task.demos_per_task=10 num_workers=16 episodes_per_job=5 \
        2>&1 | tr '\r' '\n' | grep -v -E '^\s*collect:\s+[0-9]+%' | tail -3
      for det in ${DETERMINISTIC:-true false}; do
        phase "resume on the GPU, train.deterministic=$det"
        EXTRA="task.demos_per_task=10 train.deterministic=$det" S0_STEPS=600 S1_STEPS=300 S0_STOP_MIN=0 \
          S1_STOP_MIN=0 bash "$here/gpu_resume.sh" 2>&1 | grep -E "^==|stopped at|tensors|rror"
      done ;;
    rl)
      R=runs/rl_speed; rm -rf $R
      T="task=metaworld_ml45_10 task.demos_per_task=${DEMOS:-20}"
      phase "rl: collect"
      python3 -m ript.cli collect $T num_workers=16 episodes_per_job=5 2>&1 | tr '\r' '\n' | grep -E "steps/s|average"
      phase "rl: stage0"
      python3 -m ript.cli stage0 $T run_dir=$R/stage0 train.steps=${S0_SHORT:-1000} progress=false ${S0_SHORT_EXTRA:-} 2>&1 | tail -1
      phase "rl: stage1"
      python3 -m ript.cli stage1 $T run_dir=$R/stage1 stage0_checkpoint=$R/stage0 train.steps=${S1_SHORT:-1500} \
        train.val_every=${S1_SHORT:-1500} progress=false ${S1_SHORT_EXTRA:-} 2>&1 | grep -E "val|done" | tail -2
      for over in ${OVERSAMPLES:-1 auto}; do
        phase "rl: rl.oversample=$over"
        python3 -m ript.cli rl checkpoint=$R/stage1 run_dir=$R/rl_$over rl.iterations=${RL_SHORT:-3} \
          rl.num_workers=16 eval.every=0 rl.stop_after_minutes=${RL_SHORT_MIN:-1.5} rl.oversample=$over \
          rl.task_weighting=informative rl.lr=2e-5 rl.train_prior_only=false rl.micro_batch=256 ${RL_SHORT_EXTRA:-} \
          2>&1 | grep -E "rl iteration|rror"
      done ;;
    bench)
      phase "bench"
      python3 -m benchmarks.bench --workers ${BENCH_WORKERS:-4,16} --out runs/bench.json ${BENCH_EXTRA:-} 2>&1 | grep -v -i warn \
        | sed -n '/^figure/,$p'
      cp runs/bench.json "${RESULTS_DIR:-runs}/bench.json" 2>/dev/null || true ;;
    train)
      for b in 512 1024; do
        phase "train_speed batch $b"
        python3 -m benchmarks.train_speed --variants bf16+cl+tf32+compile+graphs --batch "$b" 2>&1 | grep -v -i warn | tail -6
      done ;;
    *) echo "unknown part $part (chain, profile, resume, resume10, rl, bench, train)" >&2; exit 2 ;;
  esac
done
phase "all done"
