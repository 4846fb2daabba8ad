#!/usr/bin/env bash
# A detached job and its log: runs a chain of phases in the background so that it outlives the command that
# started it, and waits on it from later commands. For a host reached only through short commands whose outputs
# come back as files of a folder ($COPY_BACK_DIR, default ./copy_back), with a size limit on each.
#   bash tools/detached_job.sh start <preamble> <script> <phase>...   (env vars pass through)
#   bash tools/detached_job.sh poll <seconds> <run dir> [<results dir>]
#   bash tools/detached_job.sh pieces <dir> <first> [<count>]   (pieces first.. of <dir>'s *.part*, 4 by default)
#   bash tools/detached_job.sh carry <pieces dir>   (on the machine the pieces go to: into .resume1, .resume2, ...,
#        3 pieces each, so that each folder can travel with one command)
#   bash tools/detached_job.sh gather <dest> <poll dir>...   (on the machine the polls came back to: the latest
#        state's pieces, each checked against its MD5SUMS, from the polls that brought them)
# poll waits until the chain ends or <seconds> pass, then copies the log, the evaluation results and whatever
# the chain has written to <results dir> so far to $COPY_BACK_DIR (and every 30 s while it waits); the pieces of
# a kept state come back over successive polls (results/state/MD5SUMS lists the current ones; where the results'
# files are too many to come one by one, they come as one archive, results/files.tar.gz).
set -uo pipefail
LOG=/tmp/gpu_chain.log
BACK=${COPY_BACK_DIR:-copy_back}  # what the caller takes back
case "${1:-}" in
  start)
    preamble=$2; shift 2
    # the chain runs from its own copy of the tree: a later command may replace the working tree, and a phase
    # that imports ript or reads configs/ while that happens fails; runs/ and data/ stay shared
    tree=/tmp/chain_tree; rm -rf "$tree" /tmp/gpu_chain.sent; mkdir -p "$tree" runs data
    tar --exclude=./runs --exclude=./data --exclude=./.git -cf - . | tar -xf - -C "$tree"
    ln -s "$PWD/runs" "$tree/runs"; ln -s "$PWD/data" "$tree/data"
    setsid nohup bash -c "cd $tree && source $preamble >/dev/null 2>&1; bash $*; echo CHAIN_EXIT \$? at \$SECONDS s" \
      >"$LOG" 2>&1 </dev/null &
    echo "started: $*" ;;
  poll)
    limit=$2 run=$3 results=${4:-}; mkdir -p "$BACK"
    # a fresh machine has no chain: say so now, not after <seconds> of waiting
    [ -f "$LOG" ] || { echo "no chain on this machine ($LOG is missing): start it again" >&2; exit 3; }
    # A poll's files come back only when it ends, at most MAX_FILES of them and MAX_MIB MiB in all: the small
    # files (the log, the evaluations, results/*.json) always, and the pieces of results/state that earlier
    # polls have not brought back yet (a piece rewritten since counts as new) as far as the limits leave room,
    # with state/MD5SUMS to check them against. The pieces a poll sends are chosen at its first copy and
    # recorded as sent at its end, so that a poll cut short sends them again.
    SENT=/tmp/gpu_chain.sent; touch "$SENT"; chosen=()
    small_back() {
      tr '\r' '\n' <"$LOG" | grep -v -E '^\s*(collect|rollout|eval):\s+[0-9]+%' \
        | grep -v -E 'robosuite WARNING|__logo__ = |SyntaxWarning: invalid escape' >"$BACK/chain.log"
      for d in eval eval_rl; do [ -f "$run/$d/results.json" ] && cp "$run/$d/results.json" "$BACK/$d.json"; done
      rm -rf "$BACK/results"
      [ -n "$results" ] && [ -d "$results" ] || return 0
      mkdir -p "$BACK/results"
      ls "$results"/state/*.part* >/dev/null 2>&1 && mkdir -p "$BACK/results/state" \
        && (cd "$results/state" && md5sum *.part*) >"$BACK/results/state/MD5SUMS"
      # the results' own files travel as one archive (results/files.tar.gz) where one by one they would fill
      # the files a poll brings back, leaving some of them or every state piece behind
      local own; own=$(find "$results" -maxdepth 1 -type f | wc -l)
      if [ $(( $(find "$BACK" -type f | wc -l) + own )) -ge "${MAX_FILES:-8}" ]; then
        (cd "$results" && find . -maxdepth 1 -type f -printf '%P\n' | tar -czf - -T -) >"$BACK/results/files.tar.gz"
      else
        find "$results" -maxdepth 1 -type f -exec cp {} "$BACK/results/" \;
      fi
      return 0
    }
    choose_pieces() {  # pieces not sent yet, as many as fit beside the small files
      local files mib line piece size
      files=$(find "$BACK" -type f | wc -l); mib=$(du -sm "$BACK" | cut -f1)
      while read -r line; do
        piece=${line##* }
        grep -qxF "$line" "$SENT" && continue
        size=$(( $(stat -c %s "$results/state/$piece") / 1048576 + 1 ))
        (( files + 1 <= ${MAX_FILES:-8} && mib + size <= ${MAX_MIB:-63} )) || break
        chosen+=("$piece"); files=$((files + 1)); mib=$((mib + size))
      done <"$BACK/results/state/MD5SUMS"
    }
    copy_back() {
      small_back
      [ -f "$BACK/results/state/MD5SUMS" ] || return 0
      [ ${#chosen[@]} -gt 0 ] || choose_pieces
      local piece; for piece in "${chosen[@]}"; do cp "$results/state/$piece" "$BACK/results/state/"; done
      # small files that appeared since the pieces were chosen (an evaluation's results) come back first: the
      # pieces past the limit are left for the next poll, not recorded as sent
      while [ ${#chosen[@]} -gt 0 ] && [ "$(find "$BACK" -type f | wc -l)" -gt "${MAX_FILES:-8}" ]; do
        rm -f "$BACK/results/state/${chosen[-1]}"; unset 'chosen[-1]'
      done
      return 0
    }
    while [ "$SECONDS" -lt "$limit" ] && ! grep -q CHAIN_EXIT "$LOG"; do
      sleep 5; [ $((SECONDS % 30)) -lt 5 ] && copy_back  # what has come so far, should the call be cut short
    done
    copy_back
    [ ${#chosen[@]} -eq 0 ] || (cd "$BACK/results/state" && md5sum -- "${chosen[@]}") >>"$SENT"
    [ -f "$BACK/results/state/MD5SUMS" ] && echo "state pieces sent now: ${chosen[*]:-none};" \
      "not yet: $(grep -cvxFf "$SENT" "$BACK/results/state/MD5SUMS") of $(wc -l <"$BACK/results/state/MD5SUMS")"
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
  gather)
    # on the machine the polls came back to: the state that the last of <poll dir>... lists in
    # results/state/MD5SUMS, each piece taken from whichever poll brought it back, into <dest>
    dest=$2; shift 2; sums=""
    for d in "$@"; do [ -f "$d/results/state/MD5SUMS" ] && sums="$d/results/state/MD5SUMS"; done
    [ -n "$sums" ] || { echo "no results/state/MD5SUMS in $*" >&2; exit 1; }
    mkdir -p "$dest"; missing=0
    while read -r sum piece; do
      found=$(for d in "$@"; do f="$d/results/state/$piece"; [ -f "$f" ] && md5sum "$f"; done \
              | awk -v s="$sum" '$1 == s {print $2; exit}')
      if [ -n "$found" ]; then cp "$found" "$dest/$piece"; else echo "missing: $piece ($sum)"; missing=1; fi
    done <"$sums"
    ls "$dest"; exit $missing ;;
  *) echo "usage: $0 start <preamble> <script> <phase>... | poll <seconds> <run dir> [<results dir>] | pieces <dir> <first> [<count>] | carry <pieces dir> | gather <dest> <poll dir>..." >&2; exit 2 ;;
esac
