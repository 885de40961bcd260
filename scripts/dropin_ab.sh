#!/usr/bin/env bash
# One device call: scripts/dropin_pieces.py from the tree at $BASE (git archive of the code
# before a change: opfacade/ and native/) and from this tree, in alternating processes
# (ROUNDS of each), then any scripts/gpu_torch.sh stages given.
#   BASE=.scratch/base ROUNDS=2 bash scripts/dropin_ab.sh [tests bench ...]
set -u
stages=${*:-}
source "$(dirname "$0")/device_prelude.sh"
site=$PYTHONPATH
for round in $(seq ${ROUNDS:-2}); do
    for tree in base new; do
        root=$PWD; [[ $tree == base ]] && root=$PWD/${BASE:-.scratch/base}
        stage "dropin_pieces $tree round $round"
        PYTHONPATH=/tmp/site:$root:$PWD/scripts timeout 200 python3 scripts/dropin_pieces.py \
            "$OUT/dropin_${tree}_$round.json" --label "$tree$round" --no-profile \
            > "$OUT/dropin_${tree}_$round.log" 2>&1
        grep -A8 "ratios" "$OUT/dropin_${tree}_$round.log"
    done
done
export PYTHONPATH=$site
[[ -n $stages ]] && bash "$(dirname "$0")/gpu_torch.sh" $stages
