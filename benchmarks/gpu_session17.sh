#!/usr/bin/env bash
# Issue 17's protocol runs on one GPU lease each (`ript protocol`, see the README), in the background:
#   ml45     ML45 multitask (45 tasks x 100 demos, stages 0-1, 20 episodes per task), then ML45 few-shot (5 test
#            tasks x 5 demos, finetune from it, 20 episodes per task); RL left out (PROTOCOL_EXTRA adds overrides)
#   libero   LIBERO_SUITE (libero_object) end to end: collect, stages 0-1, standard protocol, RL, again
#   bash benchmarks/gpu_background.sh start .whl/preamble.sh benchmarks/gpu_session17.sh ml45
#   bash benchmarks/gpu_background.sh poll 560 runs/protocols/ml45_multitask runs/session17
# Carry .whl and data/metaworld/lang_cache.safetensors (LIBERO: .libero and its suite's lang_cache instead).
set -uo pipefail
phase() { echo "== $1 at ${SECONDS}s"; }
keep() { mkdir -p runs/session17; cp "runs/protocols/$1/results.json" "runs/session17/$1.json" 2>/dev/null
         cp "runs/protocols/$1/protocol.json" "runs/session17/$1.protocol.json" 2>/dev/null; }
quiet="+phases.collect.num_workers=16"
for part in "$@"; do
  case "$part" in
    ml45)
      phase "ml45_multitask"
      python3 -m ript.cli protocol ml45_multitask phases.rl=null phases.eval_rl=null $quiet \
        +phases.stage0.progress=false +phases.stage1.progress=false \
        phases.stage1.train.steps=${S1_STEPS:-24000} ${PROTOCOL_EXTRA:-} 2>&1 | stdbuf -o0 tr '\r' '\n' \
        | grep --line-buffered -v -E '^\s*(collect|eval):\s+[0-9]+%'
      keep ml45_multitask
      phase "ml45_fewshot"
      python3 -m ript.cli protocol ml45_fewshot phases.rl=null phases.eval_rl=null $quiet \
        +phases.finetune.progress=false 2>&1 | stdbuf -o0 tr '\r' '\n' | grep --line-buffered -v -E '^\s*(collect|eval):\s+[0-9]+%'
      keep ml45_fewshot ;;
    libero)
      s=${LIBERO_SUITE:-libero_object}
      phase "$s"
      python3 -m ript.cli protocol $s $quiet +phases.stage0.progress=false +phases.stage1.progress=false \
        ${PROTOCOL_EXTRA:-} 2>&1 | stdbuf -o0 tr '\r' '\n' | grep --line-buffered -v -E '^\s*(collect|eval|rollout):\s+[0-9]+%'
      keep $s ;;
    *) echo "unknown part $part (ml45, libero)" >&2; exit 2 ;;
  esac
done
phase "all done"
