#!/usr/bin/env bash
# Bench a family with the code before a change (a tree exported to .before/, carried with the
# call) and with the working tree, alternately in one GPU session, then compare the ratios.
#   bash scripts/bench_before_after.sh "alibi:alibi linear:gemm" [host]
# Each item is NEW_NAME:OLD_NAME of the family (the old tree may have called it otherwise).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 OPFACADE_CACHE_DIR=/tmp/opfacade-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
after="env PYTHONPATH=/tmp/site:$PWD"
before="env PYTHONPATH=/tmp/site:$PWD/.before"
merge() {  # merge the per-family JSON records into one
    python3 - "$@" <<'PY'
import json, sys
out, parts = sys.argv[1], sys.argv[2:]
rows, gpu = [], None
for p in parts:
    d = json.load(open(p)); rows += d["rows"]; gpu = d["gpu"]
json.dump({"gpu": gpu, "quick": False, "rows": rows}, open(out, "w"), indent=2)
PY
}
tag=${2:-}
b_parts=(); a_parts=()
for item in $1; do
    new=${item%%:*}; old=${item##*:}
    (cd .before && $before python3 -m opfacade bench --op "$old" --json /tmp/b_$new.json) \
        >> "$OUT/bench_before$tag.log" 2>&1
    $after python3 -m opfacade bench --op "$new" --json /tmp/a_$new.json >> "$OUT/bench_after$tag.log" 2>&1
    b_parts+=(/tmp/b_$new.json); a_parts+=(/tmp/a_$new.json)
done
merge "$OUT/bench_before$tag.json" "${b_parts[@]}"
merge "$OUT/bench_after$tag.json" "${a_parts[@]}"
if [ "${3:-}" = host ]; then
    for i in 1 2 3; do
        (cd .before && $before python3 ../scripts/host_compare.py before) >> "$OUT/host$tag.log" 2>&1
        $after python3 scripts/host_compare.py after >> "$OUT/host$tag.log" 2>&1
    done
fi
python3 scripts/compare_bench.py "$OUT/bench_before$tag.json" "$OUT/bench_after$tag.json"
[ -f "$OUT/host$tag.log" ] && cat "$OUT/host$tag.log"
