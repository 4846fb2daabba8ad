#!/usr/bin/env bash
# Session 15's leases (nvidia-h200-x2: two H200s, 32 cores), in parts:
#   render     the simulator floor with many processes (benchmarks/render_floor.py): 1-32 processes, collection's
#              and a rollout's render pattern, one or two EGL devices
#   renderers  one mujoco.Renderer readback per camera (before) vs all cameras side by side in one readback (now)
#   cudatest   the CUDA-only tests (tests/test_policy_cuda.py: CUDA-graph policy, compiled RL update)
#   collect    ML45-10 x 50 demos with 16 workers rendering on one GPU, then on both (on a two-GPU host)
#   profile    rollout throughput of the runner (benchmarks/profile_rollout.py, untrained prior, 16 x 4 envs)
#   scaling    benchmarks/gpu_scaling.sh: stage 1 and RL, one GPU vs two (SCALING_* pass its variables on)
#   loop       stage 0 and stage 1 in the real training loop (ML45-10 x 50 demos, 2,000 steps each, the default
#              step), samples/s from their logs (benchmarks/train_compare.py)
#   checks     stage-0/1 step with the host sync of before and GuardedStep's device check, back to back
#   train      stage-0/1 training step speed at 128 px, batch 256 (benchmarks/train_speed.py, the default step)
#   short      one GPU: ML45-10 with 20 demos per task (collection speed), stage 0 1,000 / stage 1 1,200 eager
#              steps, the 200-episode evaluation (its speed), RL with the default compiled update for SHORT_RL_MIN
#              minutes (rollout speed; the compiled update in the real loop)
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_session15.sh render scaling
#   bash benchmarks/gpu_background.sh poll 560 runs/scaling runs/results     # back to back until CHAIN_EXIT
set -uo pipefail
export RES=runs/results
mkdir -p $RES
phase() { echo "== $1 at ${SECONDS}s"; }
floor() { python3 -m benchmarks.render_floor "$@" 2>&1 | grep -E "render every|rror"; }
collect() {  # <data dir> <label>
  python3 -m ript.cli collect task=metaworld_ml45_10 task.data_dir=$1 num_workers=16 episodes_per_job=5 2>&1 \
    | tr '\r' '\n' | grep -E "steps/s|rror" | tee $RES/collect_$2.log
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
for part in "$@"; do
  case "$part" in
    render)
      phase "render floor, default EGL device"
      floor --procs 1,16,32 --render-every 1,8 --seconds 5 --out $RES/render_default.json
      floor --procs 1,32 --render-every 0 --seconds 4 --out $RES/render_physics.json
      phase "render floor, two EGL devices"
      floor --procs 16,32 --render-every 1,8 --seconds 5 --egl-devices 0,1 --out $RES/render_two_devices.json ;;
    renderers)
      for r in separate side-by-side; do
        phase "render floor, $r"
        floor --procs 1,16 --render-every 1,8 --seconds 5 --renderer $r --egl-devices 0 --out $RES/render_$r.json
      done
      phase "render floor, side-by-side, two EGL devices"
      floor --procs 32 --render-every 1 --seconds 5 --egl-devices 0,1 --out $RES/render_side_two.json ;;
    cudatest)
      phase "CUDA tests"
      python3 -m pytest -q -p no:cacheprovider tests/test_policy_cuda.py 2>&1 | tail -15 | tee $RES/cuda_tests.log ;;
    collect)
      phase "collect, 16 workers rendering on GPU 0"
      MUJOCO_EGL_DEVICE_ID=0 collect runs/collect_gpu0 gpu0
      if [ "$(nvidia-smi -L | wc -l)" -gt 1 ]; then
        phase "collect, 16 workers rendering on both GPUs"
        collect runs/collect_gpu01 gpu01
      fi ;;
    profile)
      phase "profile_rollout, 16 workers x 4 envs"
      python3 -m benchmarks.profile_rollout --workers 16 --groups 1 --envs-per-worker 4 --episodes 64 --steps 200 \
        --overrides task.render.image_size=128 2>&1 | grep -v -i warn | head -16 | tee $RES/profile_rollout.log ;;
    scaling)
      phase "scaling"
      RL_ITERS=${SCALING_RL_ITERS:-4} RL_GROUPS=${SCALING_RL_GROUPS:-32} RL_EGL0=${SCALING_RL_EGL0:-0} \
        RL_ONLY=${SCALING_RL_ONLY:-0} S1_STEPS=${SCALING_S1_STEPS:-1000} S1_EXTRA=${SCALING_S1_EXTRA:-} \
        bash benchmarks/gpu_scaling.sh ;;
    loop)
      R=runs/loop T=task=metaworld_ml45_10
      phase "loop: collect"
      python3 -m ript.cli collect $T num_workers=16 episodes_per_job=5 2>&1 | tr '\r' '\n' | grep -E "steps/s|rror"
      phase "loop: stage0"
      python3 -m ript.cli stage0 $T run_dir=$R/stage0 train.steps=2000 train.log_every=100 progress=false 2>&1 | tail -1
      phase "loop: stage1"
      python3 -m ript.cli stage1 $T run_dir=$R/stage1 stage0_checkpoint=$R/stage0 train.steps=2000 train.log_every=100 \
        train.val_every=1000 progress=false 2>&1 | grep -E "val|rror"
      python3 -m benchmarks.train_compare $R/stage0 $R/stage1 --out $RES/loop.json ;;
    checks)
      phase "train_speed: the step before (host sync every step) and now, on one host"
      v=bf16+cl+tf32+compile+graphs
      python3 -m benchmarks.train_speed --variants $v+sync,$v,$v+sync --steps 40 --out $RES/train_speed_sync.json \
        2>&1 | grep -E "^bf16" ;;
    train)
      phase "train_speed, batch 256, 128 px"
      python3 -m benchmarks.train_speed --variants bf16+cl+tf32+compile+graphs --batch 256 --out $RES/train_speed.json \
        2>&1 | grep -E "^bf16" ;;
    short)
      R=runs/short T="task=metaworld_ml45_10 task.demos_per_task=20"
      phase "short: collect"
      python3 -m ript.cli collect $T num_workers=16 episodes_per_job=5 2>&1 | tr '\r' '\n' | grep -E "steps/s|rror" \
        | tee $RES/short_collect.log
      phase "short: stage0"
      python3 -m ript.cli stage0 $T run_dir=$R/stage0 train.steps=1000 train.compile=false progress=false 2>&1 | tail -1
      phase "short: stage1"
      python3 -m ript.cli stage1 $T run_dir=$R/stage1 stage0_checkpoint=$R/stage0 train.steps=1200 train.val_every=1200 \
        train.compile=false progress=false 2>&1 | grep -E "val|rror" | tail -2
      phase "short: eval"
      python3 -m ript.cli eval checkpoint=$R/stage1 num_workers=16 out_dir=$R/eval 2>&1 | tr '\r' '\n' \
        | grep -E "steps/s|average|rror" | tee $RES/short_eval.log
      cp $R/eval/results.json $RES/short_eval.json 2>/dev/null
      phase "short: rl"
      python3 -m ript.cli rl checkpoint=$R/stage1 run_dir=$R/rl rl.iterations=20 rl.num_workers=16 eval.every=0 \
        rl.stop_after_minutes=${SHORT_RL_MIN:-4} rl.task_weighting=informative rl.lr=2e-5 rl.train_prior_only=false \
        2>&1 | grep -E "rl iteration|rror|compile" | tee $RES/short_rl.log ;;
    *) echo "unknown part $part (render, renderers, cudatest, collect, profile, scaling, loop, checks, train, short)" >&2; exit 2 ;;
  esac
done
phase "session chain done"
