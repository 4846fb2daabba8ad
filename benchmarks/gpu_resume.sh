#!/usr/bin/env bash
# Exact resume on the GPU with the fast step on (torch.compile + CUDA graphs + bf16 + TF32 + channels-last), at
# the real model size: stage 0 and stage 1 each trained once uninterrupted and once stopped on the clock
# mid-run and resumed, then the final checkpoints compared tensor by tensor, and with a second uninterrupted
# run. Needs the ML45-10 data and the instructions' language cache (stage 1 starts from this script's own
# uninterrupted stage 0). EXTRA adds overrides to every run (e.g. train.deterministic=true).
#   bash benchmarks/gpu_resume.sh            # S0_STEPS, S1_STEPS, S0_STOP_MIN, S1_STOP_MIN (0: stop after step 1)
set -euo pipefail
ript() { python3 -m ript.cli "$@"; }
TASK=${TASK:-metaworld_ml45_10}
OUTDIR=runs/resume
rm -rf $OUTDIR
common="task=$TASK ${EXTRA:-} train.val_every=250 train.save_every=250 train.log_every=250 progress=false"
S0="$common train.steps=${S0_STEPS:-2000}"
S1="$common stage0_checkpoint=$OUTDIR/stage0/whole train.steps=${S1_STEPS:-600}"
for stage in stage0 stage1; do
  args=$S0; stop=${S0_STOP_MIN:-0.8}
  [ $stage = stage1 ] && { args=$S1; stop=${S1_STOP_MIN:-1.2}; }
  echo "== $stage uninterrupted at ${SECONDS}s"; ript $stage $args run_dir=$OUTDIR/$stage/whole
  # a second uninterrupted run: tells the GPU's run-to-run differences (atomics in kernels) from resume's
  echo "== $stage uninterrupted again at ${SECONDS}s"; ript $stage $args run_dir=$OUTDIR/$stage/again
  echo "== $stage stopped after $stop min at ${SECONDS}s"; ript $stage $args run_dir=$OUTDIR/$stage/part \
    train.stop_after_minutes=$stop
  echo "   stopped at step $(readlink $OUTDIR/$stage/part/checkpoints/last)"
  echo "== $stage resumed at ${SECONDS}s"; ript $stage $args run_dir=$OUTDIR/$stage/part resume=true
  python3 - "$OUTDIR/$stage" <<'EOF'
import sys
from safetensors.torch import load_file
root = sys.argv[1]
a = load_file(f"{root}/whole/checkpoints/last/model.safetensors")
for other in ("again", "part"):
    b = load_file(f"{root}/{other}/checkpoints/last/model.safetensors")
    assert a.keys() == b.keys()
    differ = [k for k in a if not (a[k] == b[k]).all()]
    worst = max(((a[k].float() - b[k].float()).abs().max().item(), k) for k in a)
    print(f"{root}: whole vs {other}: {len(a)} tensors, {len(differ)} differ; largest difference {worst[0]:.3g} "
          f"({worst[1]})")
EOF
done
