#!/usr/bin/env bash
# Reference protocols and their variants on a GPU host, as a detached job (`ript protocol`, see docs/protocols.md):
#   libero_speed  LIBERO's simulator floor on this host: 1 and 16 processes, physics only and rendering every 8th
#                 step (LIBERO_SPEED_ARGS replaces these, e.g. "--suite libero_10 --procs 1,32 --render-every 0,2")
#   wm_speed      a world model's imagined env steps/s and training steps/s at LIBERO's size, random weights
#                 (WM_SPEED_ARGS, default width 32, warp_diffusion in one denoising step, 64/256/1,024 envs), and
#                 the simulator floor beside it: 16 processes stepping and rendering every 4th step (a chunk of 4)
#   libero        LIBERO_SUITE (libero_object) through its protocol; PROTOCOL_EXTRA adds overrides (e.g. the
#                 encoder ablation algo.prior.encoder_stages=2 algo.prior.num_kp=128); keeps VIDEO_COUNT (3) videos of
#                 the tasks VIDEOS finds (a regular expression; LIBERO-Object's bottles by default), or with CKPT=1
#                 the stage-0 and stage-1 checkpoints in pieces
#   libero_ckpt   LIBERO_SUITE through collect and stages 0-1; the stage-0 and stage-1 checkpoints kept in pieces
#   profile       benchmarks/profile_rollout.py on LIBERO_SUITE's first two tasks with QueST's encoder, for each
#                 variant of PROFILE_VARIANTS ("tag args...;tag ...", e.g. "threads16 --driver-threads 16;fix"):
#                 $R/profile_<tag>.json
#   ae            stage 0 alone on AE_TASKS of LIBERO-Object for each of AE_STEPS; checkpoints kept in pieces
#   ml45          ML45 multitask through its protocol (S1_STEPS, PROTOCOL_EXTRA)
#   ml45_hard10   the same protocol on ten harder ML45 tasks (S1_STEPS, PROTOCOL_EXTRA)
#   ml45_fewshot  ML45 few-shot through its protocol, from the ml45 part's stage 1 (FEWSHOT_EXTRA)
#   fewshot_variants  ML45 few-shot again for each variant of FEWSHOT_VARIANTS ("tag override...;tag ..."), each in
#                 runs/protocols/ml45_fewshot_<tag> on the same demos (collection skips finished files) and base
#                 checkpoint (FEWSHOT_EXTRA too)
#   stage1_variants  protocol PROTO's stage 1 and evaluation again for each variant of STAGE1_VARIANTS ("tag
#                 override...;tag ...", e.g. "jitter algo.image_aug_color=0.3;lr1e-4 +phases.stage1.train.lr=1e-4"),
#                 each in runs/protocols/<PROTO>_<tag> on PROTO's demos and stage 0 (run PROTO's imitation first),
#                 evaluated on EVAL_EPISODES per task (the standard 50 by default): $R/<PROTO>_<tag>.json
#   steps         protocol PROTO's stage-1 checkpoints at EVAL_STEPS (e.g. "3000 6000") through its evaluation phase
#                 (keep them: +phases.stage1.train.keep_last=20)
#   topk          protocol PROTO's imitation checkpoint evaluated again with each top-k in EVAL_TOPK (e.g. "5 1")
#   sampling      each of SAMPLING_ON's "protocol:checkpoint" (default PROTO's stage1; e.g. "ml45_fewshot:finetune")
#                 evaluated again with each variant of EVAL_SAMPLING ("tag override...;tag ...", e.g.
#                 "h4 sampling.action_horizon=4"): $R/<protocol>_eval_<tag>.json
#   rl            protocol PROTO again with RL_EXTRA (e.g. after a run with phases.rl=null: RL's settings), so it
#                 skips the finished phases and runs RL; an RL run cut by its time limit is still evaluated (not
#                 with NO_CUT_EVAL=1, for a run whose state goes on to another machine); with
#                 RL_BEST_HORIZON=1 RL samples at the action horizon of the best imitation evaluation (`sampling`'s
#                 eval_h<N> folders beside the protocol's own)
#   wm_checks     world-model protocol PROTO (libero_object_world_model) to its calibration, without RL
#                 (PROTOCOL_EXTRA adds overrides, e.g. +phases.world_model.algo.unroll=6), then
#                 benchmarks/policy_on_imagined_frames.py on its recorded evaluation, and with CHECK_EPISODES set,
#                 benchmarks/imagined_vs_real.py over its flow policy's five kept checkpoints (that many per task),
#                 imagined at the head's own threshold (CHECK_THRESHOLD=calibrate: the calibration's)
#   wm_beside     world-model protocol PROTO's demos, flow policy and recorded evaluation, with a world model of its
#                 own (the protocol's warping model, or WM_SETTINGS over it, e.g. "algo.model.output=warp_diffusion")
#                 trained on the demos beside them for WM_FIRST_MINUTES (6), then on the demos and the episodes for
#                 WM_MINUTES (6.5) while the flow
#                 checkpoints run in the simulator; its head on its own imagination, imagined against real success
#                 (CHECK_EPISODES per task, 10) at the head's threshold (and again drawn in each of
#                 CHECK_DENOISE_STEPS's step counts, e.g. "1 5"), the policy on its frames
#   wm_rl         world-model protocol PROTO to its end in one device call: its demos, then a world model of its
#                 own (WM_SETTINGS as for wm_beside) on the demos beside the flow policy (FLOW_STEPS, 5000) and its
#                 recorded evaluation, then the protocol's world_model phase going on from it for WM_STEPS (1500)
#                 on the demos and the episodes, the head on its own imagination, the calibration, RL in the model
#                 (RL_ITERATIONS, 15, or RL_MINUTES, 3, whichever ends first; refused where the calibration is below
#                 environment.min_calibrated_accuracy, RL_EXTRA=phases.rl.environment.min_calibrated_accuracy=0 runs
#                 it anyway) and the evaluation after it, the world model measured on held-out demos
#                 (`ript world-model-eval`); then the policy on the model's frames. About 24 minutes on
#                 one H200 with FLOW_STEPS=2000. With WM_MINUTES the world_model phase stops after that long and
#                 the chain ends there: `wm_rl state` keeps it (the flow policy and both world models, the
#                 protocol's with its optimizer state) to go on on another machine with `resume wm_resume`
#   wm_resume     wm_rl's protocol carried here (`resume` first): collect and the imitation's recorded evaluation
#                 again (too large to carry), the world_model phase on from its carried state (WM_MINUTES again
#                 to stop it again), then as wm_rl; the same FLOW_STEPS, WM_STEPS and WM_SETTINGS as the run had
#   eval_cut      protocol PROTO's RL run cut by its time limit, evaluated as the rl part does (for a chain that
#                 runs `rl` with NO_CUT_EVAL=1 and keeps its `state` before this evaluation)
#   state         protocol PROTO's run folder as far as another machine needs it to go on (protocol.json, the
#                 evaluations' results, the imitation checkpoint RL starts from, a world-model protocol's world
#                 models, and an RL run's last checkpoint with its optimizer and sampler state, which RL resumes
#                 from exactly): $R/state/<PROTO>.tar.part*,
#                 15 MiB each (LIBERO: 4 pieces with the imitation alone, 11 with RL: fetch them 4 at a time with
#                 `tools/detached_job.sh pieces`)
#   scaling       benchmarks/scaling.py on this host's GPUs for each ';'-separated argument set of SCALING_ARGS (e.g.
#                 "--counts 1,2,4"): $R/scaling_<n>.json
#   weights       benchmarks/weight_channel.py between two GPUs (WEIGHTS_ARGS): $R/weight_channel.json
#   pi0_fsdp      benchmarks/pi0_rl_iteration.py at π0's size with PI0_ARGS (default: full fine-tuning, Flow-Noise),
#                 its update sharded over this host's GPUs under torchrun, then whole on one GPU:
#                 $R/pi0_fsdp.json, $R/pi0_one_gpu.json
#   actor         benchmarks/actor_rollout.py (ACTOR_ARGS, e.g. "--render-gpu 1" on two GPUs): $R/actor_rollout.json
#   transfer      benchmarks/episode_transfer.py (TRANSFER_ARGS): $R/episode_transfer.json
#   decision      benchmarks/decision_speed.py on ten ML45 tasks, eager parts and graphed, also compiled
#                 (DECISION_ARGS replaces its batches and compile modes): $R/decision/decision_speed.json
#   resume        unpacks the pieces carried in .resume*/ (the `state` part's, a folder per command) into
#                 runs/protocols, so that the same `ript protocol` command
#                 skips the finished phases and goes on (e.g. to RL, or RL from its last iteration)
#   bash tools/detached_job.sh start .libero/preamble.sh tools/protocol_runs.sh libero_speed libero
#   bash tools/detached_job.sh poll 560 runs/protocols/libero_object runs/protocol_results
# Carry .whl and data/metaworld/lang_cache.safetensors (LIBERO: .libero and its suite's lang_cache instead).
set -uo pipefail
R=${RESULTS:-runs/protocol_results}   # what comes back through the poll
phase() { echo "== $1 at ${SECONDS}s"; }
keep() { mkdir -p $R; cp "runs/protocols/$1/results.json" "$R/$1.json" 2>/dev/null
         cp "runs/protocols/$1/protocol.json" "$R/$1.protocol.json" 2>/dev/null
         cp "runs/protocols/$1/rl/rl_history.json" "$R/$1.rl_history.json" 2>/dev/null; }
# the stage-0 and stage-1 checkpoints (weights and config) as 15 MiB pieces of a tar each
keep_ckpt() { local stage; mkdir -p $R/ckpt; for stage in stage0 stage1; do
                tar -C "$(readlink -f runs/protocols/$1/$stage/checkpoints/last)" -cf - config.json model.safetensors \
                  | split -b 15M - $R/ckpt/$stage.tar.part; done
              ls -la $R/ckpt; }
# protocol $1's run state for another machine: the checkpoint RL starts from (stage 1's, few-shot fine-tuning's or
# the flow policy's; ~51 MiB for LIBERO's stage 1), the world models' if the protocol has them (the one the
# world_model phase starts from, and that phase's with its optimizer state), and RL's last checkpoint with its
# optimizer state (~150 MiB more) if RL ran, in pieces that travel in .resume1, .resume2, ...
keep_state() {
  local run=$1 dir step files; mkdir -p $R/state; rm -f $R/state/$run.tar.part*  # a smaller state leaves none
  files="$run/protocol.json $(cd runs/protocols && ls $run/eval*/results.json 2>/dev/null)"
  for dir in stage1 finetune flow wm_demos world_model rl; do
    [ -L runs/protocols/$run/$dir/checkpoints/last ] || continue
    step=$(readlink runs/protocols/$run/$dir/checkpoints/last)
    case $dir in
      rl) files="$files $run/rl/config.json $run/rl/rl_history.json $run/rl/checkpoints/last $run/rl/checkpoints/$step"
          # what the update compiled: a resumed RL phase on a fresh host then skips a minute or more of compiling
          [ -f runs/protocols/$run/rl/compile_cache.bin ] && files="$files $run/rl/compile_cache.bin" ;;
      # with its optimizer's state: a world model stopped by its time limit goes on where it is carried to
      world_model) files="$files $run/$dir/config.json $run/$dir/checkpoints/last $run/$dir/checkpoints/$step" ;;
      *) files="$files $run/$dir/checkpoints/last $run/$dir/checkpoints/$step/config.json"
         files="$files $run/$dir/checkpoints/$step/model.safetensors" ;;
    esac
  done
  (cd runs/protocols && tar -cf - $files) | split -b 15M - $R/state/$run.tar.part
  ls -la $R/state; }
quiet() { stdbuf -o0 tr '\r' '\n' | grep --line-buffered -v -E '^\s*(collect|eval|rollout):\s+[0-9]+%'; }
workers="+phases.collect.num_workers=${COLLECT_WORKERS:-$(nproc)}"  # one per core
# protocol $1's training phases without progress bars (a finished phase's progress setting and worker counts may
# differ in a later part going on from its run folder; its other settings may not)
no_bars() { case $1 in ml45_fewshot*) echo "+phases.finetune.progress=false" ;;
                       *) echo "+phases.stage0.progress=false +phases.stage1.progress=false" ;; esac; }
# collect and stages 0-1 of protocol $1, then its checkpoints in pieces (PROTOCOL_EXTRA's settings of the
# phases left out are dropped: they cannot apply to a null phase)
imitation_ckpt() {
  local extra; extra=$(for o in ${PROTOCOL_EXTRA:-}; do case "$o" in phases.rl*|+phases.rl*|phases.eval*|+phases.eval*) ;;
                       *) printf '%s ' "$o" ;; esac; done)
  python3 -m ript.cli protocol $1 $workers $(no_bars $1) phases.eval=null phases.rl=null phases.eval_rl=null $extra 2>&1 | quiet
  keep_ckpt $1; }
# protocol $1's checkpoint $2 (under its run folder) through the evaluation again, with overrides $4...;
# results in eval_$3 and $R/$1_eval_$3.json
eval_again() {
  local p=$1 checkpoint=$2 tag=$3; shift 3
  phase "$p eval $tag"
  python3 -m ript.cli eval checkpoint=runs/protocols/$p/$checkpoint n_videos=0 out_dir=runs/protocols/$p/eval_$tag \
    "$@" 2>&1 | quiet
  cp runs/protocols/$p/eval_$tag/results.json $R/${p}_eval_$tag.json; }
# RL stopped by its time limit (rl.stop_after_minutes) ends protocol $1 before eval_rl: evaluate what it got,
# in eval_rl_cut<iteration> (a later cut of the same run, resumed, is another folder)
# (RL_CUT_EVAL's overrides; by default the eval_rl phase's own from FLOW_EXTRA, PROTOCOL_EXTRA and RL_EXTRA, so
# that the cut run is evaluated as the protocol would have)
eval_rl_cut() {
  local last extra
  extra=${RL_CUT_EVAL-$(for o in ${FLOW_EXTRA:-} ${PROTOCOL_EXTRA:-} ${RL_EXTRA:-}; do
                          [[ $o =~ ^\+*phases\.eval_rl\.(.+)$ ]] && printf '++%s ' "${BASH_REMATCH[1]}"; done)}
  if [ -d runs/protocols/$1/rl ] && [ ! -f runs/protocols/$1/eval_rl/results.json ]; then
    last=$(basename "$(readlink runs/protocols/$1/rl/checkpoints/last)")
    eval_again $1 rl rl_cut$((10#$last)) $extra; fi; }
# the action horizon of protocol $1's best imitation evaluation: eval (the checkpoint's own) or an eval_h<N> of the
# `sampling` part (EVAL_SAMPLING="h4 sampling.action_horizon=4;...")
best_horizon() {
  python3 - "runs/protocols/$1" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
own = json.loads((root / "stage1/checkpoints/last/config.json").read_text())["metadata"]["sampling"]["action_horizon"]
rates = {int(own): json.loads((root / "eval/results.json").read_text())["success_rate"]}
for f in root.glob("eval_h*/results.json"):
    rates[int(f.parent.name[len("eval_h"):])] = json.loads(f.read_text())["success_rate"]
print(max(rates, key=lambda h: (rates[h], -h)))
PY
}
# ML45 few-shot as variant $1 with overrides $2...
# each ';'-separated variant of $1 ("tag args...;tag ...") through the function $2, as $2 <tag> <args...>
for_variants() { local v variants; IFS=';' read -ra variants <<< "$1"; for v in "${variants[@]}"; do $2 $v; done; }
# world-model protocol $1's demos, then a world model of its own on them (`ript world-model` settings $2) beside
# the protocol's flow policy and its recorded evaluation ($3: the flow phase's overrides)
wm_demos_beside_flow() {
  local p=$1 wm=$2 flow=$3 root=runs/protocols/$1 first
  local only="phases.world_model=null phases.world_model_head=null phases.calibrate=null phases.rl=null phases.eval_rl=null"
  phase "$p: collect"
  python3 -m ript.cli protocol $p $workers $only phases.flow=null phases.eval=null 2>&1 | quiet
  phase "world model on the demos beside the flow policy and its evaluation"
  python3 -m ript.cli world-model $wm run_dir=$root/wm_demos train.steps=4000 \
    train.stop_after_minutes=${WM_FIRST_MINUTES:-6} > $R/wm_demos.log 2>&1 &
  first=$!
  python3 -m ript.cli protocol $p $workers $flow $only 2>&1 | quiet; keep $p; wait $first; tail -3 $R/wm_demos.log; }
# world-model protocol $1 from its flow phase on, with more overrides $2...: the world model on the demos and the
# imitation's episodes (from the wm_demos weights; WM_MINUTES stops it, to go on elsewhere: the `state` part), its
# head, the calibration, RL in it and the evaluation, then what was measured
# the flow phase's overrides in both calls of a world-model protocol (a finished phase is skipped only with the same)
wm_flow() { echo "phases.flow.train.steps=${FLOW_STEPS:-5000} +phases.flow.progress=false"; }
wm_protocol() {
  local p=$1 root=runs/protocols/$1 wm_phase; shift
  # the same model settings as wm_demos's, in the protocol's own world_model phase
  wm_phase="phases.world_model.train.steps=${WM_STEPS:-1500} +phases.world_model.init_checkpoint=$root/wm_demos \
    +phases.world_model.progress=false ${WM_MINUTES:++phases.world_model.train.stop_after_minutes=$WM_MINUTES} \
    $(for s in ${WM_SETTINGS:-}; do printf '++phases.world_model.%s ' $s; done)"
  phase "the protocol on: world model, head, calibration, RL in the model, evaluation"
  python3 -m ript.cli protocol $p $workers $(wm_flow) $wm_phase phases.rl.rl.iterations=${RL_ITERATIONS:-15} \
    +phases.rl.rl.stop_after_minutes=${RL_MINUTES:-3} ${RL_EXTRA:-} "$@" 2>&1 | quiet; keep $p
  [ -d $root/calibrate ] || return 0  # the world model stopped by its time limit: nothing more to measure here
  phase "world-model-eval: fidelity and the head on held-out demos"
  python3 -m ript.cli world-model-eval checkpoint=$root/world_model_head out_dir=$R/world_model_eval overwrite=true \
    n_videos=2 2>&1 | grep -v -E 'robosuite WARNING' | tail -24
  cp $R/world_model_eval/results.json $R/world_model_eval.json 2>/dev/null
  cp $R/world_model_eval/videos/*.mp4 $R/ 2>/dev/null
  RL_CUT_EVAL=policy=flow eval_rl_cut $p  # RL stopped by its time limit ends the protocol before its evaluation
  cp $root/world_model_head/success_head.json $root/calibrate/calibration.json $root/rl/rl_history.json $R/ \
    2>/dev/null
  # each imagined episode's peak, for reading the head's thresholds again after the machine is gone
  cp $root/calibrate/results.json $R/calibrate_results.json 2>/dev/null
  policy_on_frames $root/world_model_head $root; }
# benchmarks/policy_on_imagined_frames.py: protocol folder $2's flow policy on world model $1's frames
policy_on_frames() {
  phase "policy on imagined frames"
  python3 -m benchmarks.policy_on_imagined_frames --world-model $1 --policy $2/flow --episodes-dir $2/eval/episodes \
    --horizon-chunks ${CHECK_CHUNKS:-24} --out $R/policy_on_imagined_frames.json
  cp $R/policy_on_imagined_frames/*.mp4 $R/ 2>/dev/null; }  # a poll brings back the results folder's own files only
# benchmarks/imagined_vs_real.py at world model $1's head threshold over protocol folder $2's flow checkpoints, into
# $3, with more imagined overrides $4...
imagined_against_real() {
  local wm=$1 root=$2 results=$3; shift 3
  python3 -m benchmarks.imagined_vs_real --world-model $wm --imagined-overrides environment.success_threshold=head \
    "$@" --checkpoints $(ls -d $root/flow/checkpoints/0*) --episodes ${CHECK_EPISODES:-10} \
    --work-dir runs/imagined_vs_real --out $results 2>&1 | quiet; }
# benchmarks/profile_rollout.py as variant $1 with its arguments $2...
profile_variant() {
  local tag=$1; shift
  phase "profile $tag"
  python3 -m benchmarks.profile_rollout --overrides task=${LIBERO_SUITE:-libero_object} device=cuda \
    algo.prior.encoder_stages=2 algo.prior.num_kp=128 --workers 16 --episodes 32 --steps 100 "$@" \
    --out runs/profile_$tag 2>&1 | grep -v -i -E "warn|logo|collect:"
  cp runs/profile_$tag/profile_rollout.json $R/profile_$tag.json; }
# protocol PROTO's stage 1 and evaluation as variant $1 with overrides $2..., on PROTO's demos and stage 0
stage1_variant() {
  local p=${PROTO:-libero_goal} tag=$1 episodes=""; shift
  phase "$p stage 1 variant $tag: $*"
  [ -n "${EVAL_EPISODES:-}" ] && episodes="+phases.eval.episodes_per_task=$EVAL_EPISODES"
  python3 -m ript.cli protocol $p name=${p}_$tag +phases.stage1.progress=false phases.collect=null \
    phases.stage0=null +phases.stage1.stage0_checkpoint=runs/protocols/$p/stage0 phases.rl=null \
    phases.eval_rl=null $episodes "$@" 2>&1 | quiet
  keep ${p}_$tag; }
fewshot_variant() {
  local tag=$1; shift
  phase "ml45_fewshot_$tag"
  python3 -m ript.cli protocol ml45_fewshot name=ml45_fewshot_$tag $workers $(no_bars ml45_fewshot) \
    ${FEWSHOT_EXTRA:-} "$@" 2>&1 | quiet
  keep ml45_fewshot_$tag; }
mkdir -p $R
for part in "$@"; do
  case "$part" in
    libero_speed)
      phase "libero_speed"
      MUJOCO_GL=egl python3 -m benchmarks.libero_step_speed ${LIBERO_SPEED_ARGS:---procs 1,16 --render-every 0,8} \
        --seconds 8 --out $R/libero_step_speed.json 2>&1 | grep -v -i warning ;;
    wm_speed)
      phase "wm_speed"
      python3 -m benchmarks.world_model_speed ${WM_SPEED_ARGS:---width 32 --output warp_diffusion --envs 64,256,1024} \
        --out $R/world_model_speed.json | tail -30
      MUJOCO_GL=egl python3 -m benchmarks.libero_step_speed --procs 16 --render-every 4 --seconds 8 \
        --out $R/libero_floor_render_every_4.json 2>&1 | grep -v -i warning ;;
    libero)
      s=${LIBERO_SUITE:-libero_object}
      phase "$s"
      [ -n "${CKPT:-}" ] && imitation_ckpt $s  # the imitation checkpoint first, kept before the host's time can run out
      python3 -m ript.cli protocol $s $workers $(no_bars $s) ${PROTOCOL_EXTRA:-} 2>&1 | quiet
      keep $s
      eval_rl_cut $s
      if [ -z "${CKPT:-}" ]; then
        mkdir -p $R/videos
        find runs/protocols/$s/eval -name "*.mp4" | grep -E "${VIDEOS:-ketchup|salad|tomato}" | head -${VIDEO_COUNT:-3} \
          | xargs -r -I{} cp {} $R/videos/
      fi ;;
    libero_ckpt)
      s=${LIBERO_SUITE:-libero_object}
      phase "$s (imitation checkpoint)"
      imitation_ckpt $s ;;
    profile) for_variants "${PROFILE_VARIANTS:-default}" profile_variant ;;
    ae)
      # stage 0 alone on three LIBERO-Object tasks, trained for each of AE_STEPS; the checkpoints come back in
      # pieces for benchmarks/autoencoder_loop.py on a CPU
      d=runs/ae; tasks="[$(echo ${AE_TASKS:-salad_dressing butter ketchup} | sed -E 's/(\w+)/pick_up_the_\1_and_place_it_in_the_basket/g; s/ /,/g')]"
      phase "collect $tasks"
      python3 -m ript.cli collect task=libero_object task.data_dir=$d/data "task.task_names=$tasks" num_workers=16 \
        episodes_per_job=5 2>&1 | quiet
      for steps in ${AE_STEPS:-3000 15000}; do
        phase "stage0 $steps steps"
        python3 -m ript.cli stage0 task=libero_object task.data_dir=$d/data "task.task_names=$tasks" \
          run_dir=$d/s0_$steps train.steps=$steps train.val_every=1000 train.save_every=$steps progress=false 2>&1 | quiet
        mkdir -p $R/ae
        tar -C "$(readlink -f $d/s0_$steps/checkpoints/last)" -cf - config.json model.safetensors \
          | split -b 15M - $R/ae/s0_$steps.tar.part
      done
      ls -la $R/ae ;;
    ml45|ml45_hard10)
      p=$([ $part = ml45 ] && echo ml45_multitask || echo $part); phase "$p"
      python3 -m ript.cli protocol $p $workers $(no_bars $p) ${S1_STEPS:+phases.stage1.train.steps=$S1_STEPS} ${PROTOCOL_EXTRA:-} 2>&1 | quiet
      keep $p ;;
    ml45_fewshot)
      phase "ml45_fewshot"
      python3 -m ript.cli protocol ml45_fewshot $workers $(no_bars ml45_fewshot) ${FEWSHOT_EXTRA:-} 2>&1 | quiet
      keep ml45_fewshot ;;
    fewshot_variants) for_variants "${FEWSHOT_VARIANTS:-}" fewshot_variant ;;
    stage1_variants) for_variants "${STAGE1_VARIANTS:-}" stage1_variant ;;
    steps)
      for s in ${EVAL_STEPS:-}; do
        eval_again ${PROTO:-ml45_multitask} stage1/checkpoints/$(printf %07d $s) step$s
      done ;;
    topk)
      for k in ${EVAL_TOPK:-5}; do
        eval_again ${PROTO:-ml45_multitask} stage1 topk$k sampling.top_k=$k
      done ;;
    sampling)
      IFS=';' read -ra variants <<< "${EVAL_SAMPLING:-}"
      for on in ${SAMPLING_ON:-${PROTO:-ml45_multitask}:stage1}; do
        for v in "${variants[@]}"; do eval_again ${on%%:*} ${on#*:} $v; done
      done ;;
    rl)
      p=${PROTO:-ml45_multitask}
      phase "$p rl"
      h=""; [ -n "${RL_BEST_HORIZON:-}" ] && h="+phases.rl.sampling.action_horizon=$(best_horizon $p)"
      echo "rl: ${RL_EXTRA:-} $h"
      python3 -m ript.cli protocol $p $workers $(no_bars $p) ${RL_EXTRA:-} $h 2>&1 | quiet
      keep $p
      [ -z "${NO_CUT_EVAL:-}" ] && eval_rl_cut $p ;;  # NO_CUT_EVAL=1: a run that only carries RL on to another machine
    scaling)
      # one run of benchmarks/scaling.py per ';'-separated argument set (a later one may name --base from an
      # earlier one's runs/scaling/stage1_base and an --out of its own)
      i=0; mkdir -p $R
      IFS=';' read -ra sets <<< "${SCALING_ARGS:-}"
      for args in "${sets[@]:-}"; do
        i=$((i + 1)); phase "scaling $i: $args"
        dest=runs/scaling; prev=  # the folder the run writes: its own --out, if the set names one
        for word in $args; do [ "$prev" = --out ] && dest=$word; prev=$word; done
        python3 -m benchmarks.scaling --out runs/scaling $args 2>&1 | quiet
        failed=$?
        cp $dest/scaling.json $R/scaling_$i.json; cp $dest/scaling.png $R/scaling_$i.png 2>/dev/null
        # a run failed: each run's console output comes back too, whole (a run stopped past its time limit ends
        # with every process's stacks)
        [ $failed -ne 0 ] && for log in $dest/logs/*.log; do cp $log $R/scaling_${i}_$(basename $log); done
      done ;;
    actor)
      phase "rollouts in this process and in a Ray actor"
      python3 -m benchmarks.actor_rollout ${ACTOR_ARGS:-} --out $R/actor_rollout.json 2>&1 | quiet ;;
    transfer)
      phase "episode transfer from a Ray actor"
      python3 -m benchmarks.episode_transfer ${TRANSFER_ARGS:-} --out $R/episode_transfer.json 2>&1 | quiet ;;
    decision)
      phase "decision speed"
      python3 -m benchmarks.decision_speed --overrides task=metaworld_ml45_10 device=cuda ${DECISION_ARGS:---batches 16 64 \
        --compile-modes default max-autotune-no-cudagraphs} --out $R/decision 2>&1 | quiet ;;
    weights)
      phase "weight channel"
      python3 -m benchmarks.weight_channel ${WEIGHTS_ARGS:-} --out $R/weight_channel.json 2>&1 ;;
    pi0_fsdp)
      args=${PI0_ARGS:---full --methods flow_noise}
      phase "π0's update sharded over $(nvidia-smi -L | wc -l) GPUs: $args"
      torchrun --standalone --nproc_per_node "$(nvidia-smi -L | wc -l)" -m benchmarks.pi0_rl_iteration --fsdp $args \
        --out $R/pi0_fsdp.json 2>&1 | quiet
      phase "π0's update on one GPU: $args"
      python3 -m benchmarks.pi0_rl_iteration $args --out $R/pi0_one_gpu.json 2>&1 | quiet ;;
    wm_checks)
      # world-model protocol PROTO to its calibration (no RL), then what its policy does on the model's frames and
      # the imagined against the real success of the flow policy's kept checkpoints (CHECK_EPISODES per task)
      p=${PROTO:-libero_object_world_model} root=runs/protocols/${PROTO:-libero_object_world_model}
      phase "$p to its calibration"
      python3 -m ript.cli protocol $p $workers +phases.flow.progress=false +phases.world_model.progress=false \
        +phases.flow.train.keep_last=5 phases.rl=null phases.eval_rl=null ${PROTOCOL_EXTRA:-} 2>&1 | quiet; keep $p
      cp $root/world_model_head/success_head.json $root/calibrate/calibration.json $R/ 2>/dev/null
      policy_on_frames $root/world_model_head $root
      [ -n "${CHECK_EPISODES:-}" ] || continue
      phase "imagined against real over the flow checkpoints"
      case ${CHECK_THRESHOLD:-head} in
        calibrate) threshold="--calibration $root/calibrate" ;;
        *) threshold="--imagined-overrides environment.success_threshold=head" ;;
      esac
      python3 -m benchmarks.imagined_vs_real --world-model $root/world_model_head $threshold \
        --checkpoints $(ls -d $root/flow/checkpoints/0*) --episodes $CHECK_EPISODES \
        --work-dir runs/imagined_vs_real --out $R/imagined_vs_real.json 2>&1 | quiet ;;
    wm_beside)
      p=${PROTO:-libero_object_world_model} root=runs/protocols/${PROTO:-libero_object_world_model}
      wm="task=${p%_world_model} algo.chunk=4 algo.unroll=3 algo.model.width=32 algo.model.output=warp \
        train.batch_size=64 train.lr=3e-4 train.warmup_steps=200 train.val_every=1000 train.save_every=500 \
        train.log_every=250 progress=false ${WM_SETTINGS:-}"
      wm_demos_beside_flow $p "$wm" "+phases.flow.progress=false +phases.flow.train.keep_last=5"
      phase "world model on the demos and the episodes; the flow checkpoints in the simulator beside it"
      ( i=0; for c in $(ls -d $root/flow/checkpoints/0*); do
          python3 -m ript.cli eval policy=flow checkpoint=$c out_dir=runs/imagined_vs_real/$(printf %02d $i)_real \
            episodes_per_task=${CHECK_EPISODES:-10} num_workers=12 n_videos=0 overwrite=true 2>&1 | grep "eval:"
          i=$((i+1)); done ) > $R/real_evals.log 2>&1 &
      reals=$!
      python3 -m ript.cli world-model $wm run_dir=$root/wm init_checkpoint=$root/wm_demos train.steps=3000 \
        "data.extra_dirs=[$root/eval/episodes]" train.stop_after_minutes=${WM_MINUTES:-6.5} 2>&1 | quiet
      python3 -m ript.cli world-model-head checkpoint=$root/wm run_dir=$root/wm_head 2>&1 | quiet
      cp $root/wm_head/success_head.json $R/ 2>/dev/null; wait $reals; cat $R/real_evals.log
      phase "imagined against real"
      imagined_against_real $root/wm_head $root $R/imagined_vs_real.json
      for k in ${CHECK_DENOISE_STEPS:-}; do  # the same, drawn in k denoising steps (the simulator's runs reused)
        imagined_against_real $root/wm_head $root $R/imagined_vs_real_k$k.json environment.denoise_steps=$k
      done
      policy_on_frames $root/wm_head $root ;;
    wm_rl)
      p=${PROTO:-libero_object_world_model} root=runs/protocols/${PROTO:-libero_object_world_model}
      wm="task=${p%_world_model} algo.chunk=4 algo.unroll=3 algo.model.width=32 algo.model.output=warp \
        train.batch_size=64 train.lr=3e-4 train.warmup_steps=200 train.val_every=1000 train.save_every=500 \
        train.log_every=250 progress=false ${WM_SETTINGS:-}"
      wm_demos_beside_flow $p "$wm" "$(wm_flow)"
      wm_protocol $p ;;
    wm_resume)
      # wm_rl's protocol carried here by `state` and `resume` (its world_model phase stopped by WM_MINUTES, or
      # later): the demos and the imitation's recorded episodes, which the world model trains on and the
      # calibration reads, are too large to carry, so collect and eval run again (the carried flow policy is
      # evaluated again), and the world_model phase goes on from its carried state
      p=${PROTO:-libero_object_world_model} root=runs/protocols/${PROTO:-libero_object_world_model}
      rm -rf $root/eval
      python3 - $root/protocol.json <<'PY' || exit 1
import json, sys
state = json.load(open(sys.argv[1]))
for phase in ("collect", "eval"):
    state["phases"].pop(phase, None)
json.dump(state, open(sys.argv[1], "w"), indent=2)
PY
      # the demos collected again hold the same episodes, in files whose bytes differ (the workers' order)
      wm_protocol $p "++phases.world_model.resume_allow_changes=[data]" ;;
    eval_cut) eval_rl_cut ${PROTO:-ml45_multitask} ;;
    state) keep_state ${PROTO:-libero_object} ;;
    resume)
      phase "resume from .resume*"
      # each protocol's pieces in the order split named them, whichever carried folder holds each (two protocols
      # carried together are two streams)
      mkdir -p runs/protocols
      for run in $(ls .resume*/*.tar.part* | sed -E 's#.*/##; s#\.tar\.part[a-z]+$##' | sort -u); do
        pieces=$(ls .resume*/$run.tar.part* | awk -F/ '{print $NF, $0}' | sort | cut -d' ' -f2)
        cat $pieces | tar -xf - -C runs/protocols || exit 1
      done
      ls -la runs/protocols/* ;;
    *) echo "unknown part $part (libero_speed, profile, libero, libero_ckpt, ae, ml45, ml45_fewshot, fewshot_variants, stage1_variants, steps, topk, sampling, rl, eval_cut, wm_checks, wm_beside, wm_rl, wm_resume, scaling, weights, actor, transfer, decision, state, resume)" >&2; exit 2 ;;
  esac
done
phase "all done"
