#!/usr/bin/env bash
# The estimators compared: RLOO vs GRPO vs PPO-GAE (sparse) vs PPO-GAE (dense) from one stage-1 checkpoint, at
# equal env steps (rl.max_env_steps), on ten harder ML45 tasks where the prior leaves headroom. The RL runs
# share the host PARALLEL at a time (WORKERS env workers each), then each final checkpoint is evaluated.
# (Four at once trained 57-76 s per iteration on one shared H100, against 6-8 s for one alone.)
#   bash benchmarks/gpu_estimators.sh            # docs/rl.md shows its result
# Knobs: DEMOS (per task, 20), S0/S1 (training steps, 1000/1200), BUDGET (env steps per RL run, 300000),
# EVAL_EPS (episodes per task, 10), HORIZON (RL episode limit, 250), PARALLEL (RL runs at once, 2), WORKERS (per
# RL run, 16 / PARALLEL), B (groups per iteration, 16), ONLY (labels), RL_COMPILE (false: runs of a few minutes
# do not earn back the ~70 s of compiling), RL_EXTRA (more RL overrides);
# R (runs folder), TASK_EXTRA / TRAIN_EXTRA (more overrides: a CPU dry run at 32 px with algo=quest_small).
set -uo pipefail
ript() { python3 -m ript.cli "$@"; }
R=${R:-runs/est}
T="task=metaworld_ml45_hard10 task.demos_per_task=${DEMOS:-20} ${TASK_EXTRA:-}"
EVAL="episodes_per_task=${EVAL_EPS:-10} num_workers=${EVAL_WORKERS:-16} n_videos=0"
phase() { echo "== $1 at ${SECONDS}s"; }
quiet() { tr '\r' '\n' | grep -v -E "%\|" ; }

phase collect
[ -e $R/stage0 ] || ript collect $T num_workers=${EVAL_WORKERS:-16} episodes_per_job=5 2>&1 | quiet | grep -E "steps/s|%$|demos \(" | tail -14
phase stage0
[ -e $R/stage0 ] || ript stage0 $T run_dir=$R/stage0 train.steps=${S0:-1000} train.compile=false progress=false ${TRAIN_EXTRA:-} 2>&1 | tail -1
phase stage1
[ -e $R/stage1 ] || ript stage1 $T run_dir=$R/stage1 stage0_checkpoint=$R/stage0 train.steps=${S1:-1200} \
  train.val_every=${S1:-1200} train.compile=false progress=false ${TRAIN_EXTRA:-} 2>&1 | grep -E "val|done" | tail -2
phase "eval stage 1"
ript eval checkpoint=$R/stage1 out_dir=$R/eval_stage1 overwrite=true $EVAL 2>&1 | quiet | grep -E "average|env steps/s"
O=${RESULTS_DIR:-runs}
mkdir -p $O
cp $R/eval_stage1/results.json $O/eval_stage1.json 2>/dev/null
# what has finished so far, in $O (a run cut short still leaves the finished runs' histories and logs)
keep() { for v in $LABELS; do cp $R/rl_$v/rl_history.json $O/rl_history_$v.json 2>/dev/null
  cp $R/rl_$v.log $O/ 2>/dev/null; cp $R/rl_$v/eval_final/results.json $O/eval_final_$v.json 2>/dev/null; done; }

PARALLEL=${PARALLEL:-2}
COMMON="checkpoint=$R/stage1 rl.iterations=1000 rl.max_env_steps=${BUDGET:-300000}
  rl.num_workers=${WORKERS:-$((16 / PARALLEL))} rl.max_episode_steps=${HORIZON:-250}
  rl.groups_per_iteration=${B:-16} rl.rollouts_per_group=8 rl.oversample=1
  rl.max_sampling_rounds=3 rl.train_prior_only=false rl.micro_batch=256 rl.lr=2e-5 eval.every=0 rl.compile=${RL_COMPILE:-false} ${RL_EXTRA:-}"
declare -A VARIANT=(
  [rloo]="rl.advantage=rloo"
  [grpo]="rl.advantage=grpo"
  [gae_sparse]="rl.advantage=gae rl.reward=sparse rl.normalize_advantages=true"
  [gae_dense]="rl.advantage=gae rl.reward=dense rl.reward_scale=0.01 rl.normalize_advantages=true"
)
LABELS=${ONLY:-rloo grpo gae_sparse gae_dense}
phase "rl: $LABELS, $PARALLEL at a time"
n=0
for v in $LABELS; do
  rm -rf $R/rl_$v
  ript rl $COMMON run_dir=$R/rl_$v ${VARIANT[$v]} >$R/rl_$v.log 2>&1 &
  n=$((n + 1)); [ $((n % PARALLEL)) -eq 0 ] && { wait; keep; }
done
wait; keep
for v in $LABELS; do echo "-- $v"; grep -E "rl iteration|rror|done" $R/rl_$v.log | tail -5; done
phase "eval the RL runs"
for v in $LABELS; do
  ript eval checkpoint=$R/rl_$v out_dir=$R/rl_$v/eval_final overwrite=true $EVAL 2>&1 | quiet | grep -E "average"
  keep
done
phase report
args=""; for v in $LABELS; do args="$args $v=$R/rl_$v"; done
python3 -m benchmarks.compare_estimators --start $R/eval_stage1/results.json $args --out $O/estimators
phase "all done"
