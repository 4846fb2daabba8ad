#!/usr/bin/env bash
# A detached job and its log: runs a chain of phases in the background so that it outlives the command that
# started it, and waits on it from later commands. For a host reached only through short commands whose outputs
# come back as files of a folder ($COPY_BACK_DIR, default ./copy_back), with a size limit on each.
#   bash tools/detached_job.sh start <preamble> <script> <phase>...   (env vars pass through)
#   bash tools/detached_job.sh poll <seconds> <run dir> [<results dir>]
#   bash tools/detached_job.sh pieces <dir> <first> [<count>]   (pieces first.. of <dir>'s *.part*, 4 by default)
#   bash tools/detached_job.sh carry <pieces dir>   (on the machine the pieces go to: into .resume1, .resume2, ...,
#        3 pieces each, so that each folder can travel with one command)
# poll waits until the chain ends or <seconds> pass, then copies the log, the evaluation results and whatever
# the chain has written to <results dir> so far to $COPY_BACK_DIR (and every 30 s while it waits).
set -uo pipefail
LOG=/tmp/gpu_chain.log
BACK=${COPY_BACK_DIR:-copy_back}  # what the caller takes back
case "${1:-}" in
  start)
    preamble=$2; shift 2
    # the chain runs from its own copy of the tree: a later command may replace the working tree, and a phase
    # that imports ript or reads configs/ while that happens fails; runs/ and data/ stay shared
    tree=/tmp/chain_tree; rm -rf "$tree"; mkdir -p "$tree" runs data
    tar --exclude=./runs --exclude=./data --exclude=./.git -cf - . | tar -xf - -C "$tree"
    ln -s "$PWD/runs" "$tree/runs"; ln -s "$PWD/data" "$tree/data"
    setsid nohup bash -c "cd $tree && source $preamble >/dev/null 2>&1; bash $*; echo CHAIN_EXIT \$? at \$SECONDS s" \
      >"$LOG" 2>&1 </dev/null &
    echo "started: $*" ;;
  poll)
    limit=$2 run=$3 results=${4:-}; mkdir -p "$BACK"
    # a fresh machine has no chain: say so now, not after <seconds> of waiting
    [ -f "$LOG" ] || { echo "no chain on this machine ($LOG is missing): start it again" >&2; exit 3; }
    # what has come so far is copied every 30 s too, so that a command cut short by its caller still brings it
    copy_back() {
      # the progress bars are carriage-return lines: keep the last state of each; drop the import-time warnings
      # every LIBERO worker prints (robosuite's macro file, its logo's escape sequence), which bury the progress
      tr '\r' '\n' <"$LOG" | grep -v -E '^\s*(collect|rollout|eval):\s+[0-9]+%' \
        | grep -v -E 'robosuite WARNING|__logo__ = |SyntaxWarning: invalid escape' >"$BACK/chain.log"
      for d in eval eval_rl; do [ -f "$run/$d/results.json" ] && cp "$run/$d/results.json" "$BACK/$d.json"; done
      [ -n "$results" ] && [ -d "$results" ] && rm -rf "$BACK/results" && cp -r "$results" "$BACK/results"
      return 0
    }
    while [ "$SECONDS" -lt "$limit" ] && ! grep -q CHAIN_EXIT "$LOG"; do
      sleep 5; [ $((SECONDS % 30)) -lt 5 ] && copy_back
    done
    copy_back
    tail -25 "$BACK/chain.log" ;;
  pieces)
    # a run folder moved in pieces no larger than 15 MiB, <count> of them per command: a LIBERO run state with
    # RL (11 pieces) comes back over three commands (first = 1, 5, 9)
    dir=$2 first=$3 count=${4:-4}; mkdir -p "$BACK"
    ls "$dir"/*.part* | sort | tail -n +"$first" | head -"$count" | xargs -r -I{} cp {} "$BACK/"
    ls "$dir"/*.part* | wc -l | xargs echo "pieces in all:"; ls "$BACK" ;;
  carry)
    src=$2
    ls "$src"/*.part* >/dev/null || exit 1
    rm -rf .resume*/
    ls "$src"/*.part* | sort | awk '{printf "%s .resume%d\n", $0, int((NR - 1) / 3) + 1}' \
      | while read -r piece dest; do mkdir -p "$dest" && cp "$piece" "$dest/"; done
    du -sh .resume*/ ;;
  *) echo "usage: $0 start <preamble> <script> <phase>... | poll <seconds> <run dir> [<results dir>] | pieces <dir> <first> [<count>] | carry <pieces dir>" >&2; exit 2 ;;
esac
