#!/usr/bin/env bash
# Flow-Noise vs Flow-SDE x PPO vs GRPO from one flow-policy checkpoint, on a GPU host as a detached job
# (tools/detached_job.sh): the protocol's demos and flow policy first (its evaluations and RL left out), then four
# `ript rl` runs from that checkpoint with the same env-step budget (BUDGET, 60000) and time cap (MINUTES, 4),
# then benchmarks/flow_rl_comparison.py's table and PNG in $RESULTS (runs/protocol_results).
#   bash tools/detached_job.sh start .libero/preamble.sh tools/flow_rl_comparison.sh libero_object_flow_fewshot
set -uo pipefail
p=$1 R=${RESULTS:-runs/protocol_results} runs=runs/flow_rl_comparison
mkdir -p "$R/compare" "$runs"
quiet() { stdbuf -o0 tr '\r' '\n' | grep --line-buffered -v -E '^\s*(collect|eval|rollout):\s+[0-9]+%'; }
python3 -m ript.cli protocol "$p" "+phases.collect.num_workers=$(nproc)" +phases.flow.progress=false \
  phases.eval=null phases.rl=null phases.eval_rl=null 2>&1 | quiet
echo "{" >"$R/compare/times.tmp"
for noise in flow_noise flow_sde; do
  for advantage in gae grpo; do
    run=$noise-$advantage; echo "== $run at ${SECONDS}s"; start=$SECONDS
    python3 -m ript.cli rl "checkpoint=runs/protocols/$p/flow" policy=flow "run_dir=$runs/$run" \
      "policy.noise_method=$noise" "rl.advantage=$advantage" "rl.max_env_steps=${BUDGET:-60000}" rl.iterations=50 \
      "rl.stop_after_minutes=${MINUTES:-4}" rl.groups_per_iteration=8 rl.max_sampling_rounds=2 rl.lr=1e-5 \
      rl.micro_batch=256 rl.task_weighting=informative eval.every=0 2>&1 | quiet
    cp "$runs/$run/rl_history.json" "$R/compare/$run.json"
    echo "\"$run\": $((SECONDS - start))," >>"$R/compare/times.tmp"  # seconds
  done
done
sed '$ s/,$//' "$R/compare/times.tmp" >"$R/compare/times.json"; echo "}" >>"$R/compare/times.json"; rm "$R/compare/times.tmp"
python3 -m benchmarks.flow_rl_comparison "$R/compare" --png "$R/compare/flow_rl_comparison.png" \
  --out "$R/compare/flow_rl_comparison.json"
echo "== done at ${SECONDS}s"
