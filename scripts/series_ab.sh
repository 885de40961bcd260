#!/usr/bin/env bash
# One device call: scripts/gpt_step_series.py (eager, with the deterministic models, no memo
# counters) from the tree at $BASE and from this tree, in alternating processes, ROUNDS each.
#   BASE=.scratch/base ROUNDS=2 bash scripts/series_ab.sh
set -u
stages=
source "$(dirname "$0")/device_prelude.sh"
for round in $(seq ${ROUNDS:-2}); do
    for tree in base new; do
        root=$PWD; [[ $tree == base ]] && root=$PWD/${BASE:-.scratch/base}
        stage "gpt_step_series $tree round $round"
        PYTHONPATH=/tmp/site:$root:$PWD/scripts timeout 240 python3 scripts/gpt_step_series.py \
            "$OUT/series_${tree}_$round.json" --modes eager --deterministic --plain \
            --rounds ${SERIES_ROUNDS:-4} > "$OUT/series_${tree}_$round.log" 2>&1
        tail -1 "$OUT/series_${tree}_$round.log"
    done
done
