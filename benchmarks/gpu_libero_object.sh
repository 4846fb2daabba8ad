#!/usr/bin/env bash
# The staged pipeline on LIBERO-Object on a GPU host: scripted demonstrations (50 per task), stage 0, stage 1, the
# standard protocol (50 episodes per task from the packaged init states), RL, the standard protocol again.
# LIBERO travels to the offline GPU host as .libero/ (python -m tools.libero_bundle); carry it and
# data/libero/libero_object/lang_cache.safetensors (the instructions' embeddings, made here), then
#   source .libero/preamble.sh && bash benchmarks/gpu_libero_object.sh collect|stage0|stage1|eval|rl|eval_rl ...
TASK=libero_object COLLECT_PER_JOB=${COLLECT_PER_JOB:-5} exec bash "$(dirname "$0")/gpu_pipeline.sh" "$@"
