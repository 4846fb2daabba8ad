#!/usr/bin/env bash
# The staged pipeline on a GPU host: 10 ML45 train tasks x 50 scripted demos, stage 0, stage 1,
# then 20 evaluation episodes per task (MetaWorld's standard protocol), RL, and the evaluation again.
#   source .whl/preamble.sh && bash benchmarks/gpu_ml45_10.sh collect|stage0|stage1|eval|rl|eval_rl ...
TASK=metaworld_ml45_10 exec bash "$(dirname "$0")/gpu_pipeline.sh" "$@"
