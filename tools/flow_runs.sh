#!/usr/bin/env bash
# Flow-policy protocols on a GPU host, as a detached job (tools/detached_job.sh): each argument is a protocol
# with a flow phase (configs/protocol/*flow*.yaml, *world_model.yaml) run with FLOW_EXTRA's overrides; its
# results.json and protocol.json are copied to $RESULTS (runs/protocol_results). Protocols of one suite share its
# demos (a second collect skips them).
#   bash tools/detached_job.sh start .libero/preamble.sh tools/flow_runs.sh libero_object_flow_fewshot
#   bash tools/detached_job.sh poll 560 runs/protocols/libero_object_flow runs/protocol_results
# Each protocol's state (protocol.json, the evaluations, the last checkpoints of its training phases) is written in
# 15 MiB pieces to $RESULTS/state after its first evaluation (a world-model protocol's: after its world model is
# measured) and again after RL, so that another machine can go on from there: carried there in .resume1,
# .resume2, ... (tools/detached_job.sh carry), the same command with RESUME=1 unpacks them and runs the phases the
# state has not finished (COLLECT_TASK=<task config>: the suite's demos collected again first, with COLLECT_EXTRA's
# overrides, for RL that reads them, e.g. FLOW_EXTRA=+phases.rl.environment.starts=demo_frames).
set -uo pipefail
R=${RESULTS:-runs/protocol_results}
mkdir -p "$R"
failed=0
protocol() {  # protocol $1 with FLOW_EXTRA's and the further overrides given
  local p=$1; shift
  python3 -m ript.cli protocol "$p" "+phases.collect.num_workers=$(nproc)" "${quiet[@]}" ${FLOW_EXTRA:-} "$@" 2>&1 \
    | stdbuf -o0 tr '\r' '\n' | grep --line-buffered -v -E '^\s*(collect|eval|rollout):\s+[0-9]+%'
}
rl_finished() {  # protocol $1's RL phase recorded as finished in its protocol.json
  python3 -c 'import json, sys; sys.exit("rl" not in json.load(open(sys.argv[1]))["phases"])' \
    "runs/protocols/$1/protocol.json" 2>/dev/null; }
for p in "$@"; do
  echo "== $p at ${SECONDS}s"
  quiet=(+phases.flow.progress=false)
  if [[ -n ${RESUME:-} ]]; then
    bash tools/protocol_runs.sh resume || exit 1
    if [[ -n ${COLLECT_TASK:-} ]]; then
      python3 -m ript.cli collect task="$COLLECT_TASK" num_workers="$(nproc)" episodes_per_job=5 ${COLLECT_EXTRA:-} 2>&1 | tail -3
    fi
  else
    # the protocol's state (tools/protocol_runs.sh state) is kept after imitation and its evaluation, and again
    # after RL, so that a host lost later costs only what came after (RESUME=1 on another machine goes on from it)
    [[ $p == *world_model* ]] && quiet+=(+phases.world_model.progress=false)
    protocol "$p" phases.rl=null phases.eval_rl=null || { failed=1; continue; }
    if [[ $p == *world_model* ]]; then
      # the world model is measured (fidelity, its success head, side-by-side videos) as soon as it is trained
      echo "== world-model-eval at ${SECONDS}s"
      python3 -m ript.cli world-model-eval checkpoint="runs/protocols/$p/world_model" out_dir="$R/$p.world_model_eval" \
        overwrite=true ${WM_EVAL_EXTRA:-} 2>&1 | grep -v -E 'robosuite WARNING' | tail -20
    fi
    PROTO=$p bash tools/protocol_runs.sh state
    protocol "$p" phases.eval_rl=null || { failed=1; continue; }
    PROTO=$p bash tools/protocol_runs.sh state
  fi
  # RL cut by its time limit (rl.stop_after_minutes) is evaluated where it stopped, as tools/protocol_runs.sh's rl
  # part does, rather than resumed here with a fresh time limit; RESUME=1 goes on with RL first
  if [[ -n ${RESUME:-} ]]; then
    # RL goes on from the carried state: its new last checkpoint is kept before the evaluation, so that a run cut by
    # its time limit can go on again on the next machine
    protocol "$p" phases.eval_rl=null || failed=1
    PROTO=$p bash tools/protocol_runs.sh state
  fi
  rl_finished "$p" && { protocol "$p" || failed=1; }
  rl_finished "$p" || PROTO=$p bash tools/protocol_runs.sh eval_cut || failed=1
  cp "runs/protocols/$p/results.json" "$R/$p.json" 2>/dev/null
  cp "runs/protocols/$p/protocol.json" "$R/$p.protocol.json" 2>/dev/null
  cp "runs/protocols/$p/rl/rl_history.json" "$R/$p.rl_history.json" 2>/dev/null
done
echo "== done at ${SECONDS}s"
exit $failed
