#!/usr/bin/env bash
# RL in a world model end to end on the quickstart's two MetaWorld tasks, from a stage-1 run of them:
# demos -> world model -> its measures -> RL in imagination (no simulator steps) -> the policy before and after,
# in the simulator and in the world model.
#   bash benchmarks/world_model_quick.sh <stage-1 run> <results dir>
# Settings through the environment: WM_MINUTES (training time, 2), WM_EXTRA (world-model overrides), RL_ITERS (3),
# RL_EXTRA, EPISODES (evaluation episodes per task, 20), WORKERS (auto), ROOT (runs/world_model_quick).
set -euo pipefail
policy=$1 results=$2
root=${ROOT:-runs/world_model_quick}
workers=${WORKERS:-auto}
episodes=${EPISODES:-20}
mkdir -p "$results" "$root"
step() { echo "== $1 at ${SECONDS}s"; }

step collect
ript collect task=metaworld_quick num_workers="$workers" 2>&1 | tail -4

step world-model
ript world-model run_dir="$root/world_model" algo.model.width=32 algo.unroll=3 train.batch_size=64 train.lr=1e-3 \
  train.steps=100000 train.warmup_steps=100 train.stop_after_minutes="${WM_MINUTES:-2}" train.log_every=200 \
  train.val_every=1000 train.save_every=1000 progress=false ${WM_EXTRA:-} 2>&1 | grep -v Loading | tail -8

step world-model-eval
ript world-model-eval checkpoint="$root/world_model" out_dir="$results/world_model_eval" n_videos=4 2>&1 | tail -14

imagined=(environment=world_model environment.checkpoint="$root/world_model")
step rl
ript rl checkpoint="$policy" run_dir="$root/rl" "${imagined[@]}" rl.iterations="${RL_ITERS:-3}" eval.every=0 \
  rl.compile=false rl.num_workers="$workers" ${RL_EXTRA:-} 2>&1 | grep "rl iteration" | tail -20
cp "$root/rl/rl_history.json" "$results/rl_history.json"

for ckpt in "$policy:before" "$root/rl:after"; do
  path=${ckpt%:*} tag=${ckpt##*:}
  step "eval $tag"
  ript eval checkpoint="$path" out_dir="$results/eval_real_$tag" episodes_per_task="$episodes" num_workers="$workers" \
    n_videos=0 2>&1 | grep -A4 "^task"
  ript eval checkpoint="$path" out_dir="$results/eval_imagined_$tag" episodes_per_task="$episodes" \
    num_workers="$workers" n_videos=2 "${imagined[@]}" 2>&1 | grep -A4 "^task"
done
step done
