#!/usr/bin/env bash
# Evaluates the trained weights that a checkpoint written with train.ema_decay keeps beside their moving average
# (trained_weights.safetensors), through the same `ript eval` as the average: a copy of the checkpoint folder whose
# model.safetensors is the trained weights.
#   bash tools/trained_weights_eval.sh runs/protocols/libero_object_flow/flow/checkpoints/last runs/eval_trained \
#       workers.envs_per_worker=4
set -euo pipefail
ckpt=$1 dest=$2; shift 2
[[ -f $ckpt/trained_weights.safetensors ]] || { echo "$ckpt/trained_weights.safetensors: no trained weights (was the run trained with train.ema_decay?)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT   # the copy is only for this evaluation
copy=$tmp/trained
cp -rL "$ckpt" "$copy"
mv "$copy/trained_weights.safetensors" "$copy/model.safetensors"
python3 -m ript.cli eval checkpoint="$copy" out_dir="$dest" overwrite=true "$@"
