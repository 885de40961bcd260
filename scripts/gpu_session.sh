#!/usr/bin/env bash
# One call on a lent GPU: the whole test suite (gpu tests included), `opfacade verify`,
# compute-sanitizer memcheck and racecheck on the bespoke kernels, and the benchmark.
# Logs go to $OUT (at most 8 files come back). Usage: bash scripts/gpu_session.sh [quick]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export OPFACADE_CACHE_DIR=/tmp/opfacade-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/verified"
mode=${1:-full}
stage() { echo "=== $1 ($(date +%T))"; }

stage versions
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, cupy, cudnn, nvmath, pydantic; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn-frontend', cudnn.__version__, 'nvmath', nvmath.__version__, 'pydantic', pydantic.__version__)"

stage pytest
timeout 300 python3 -m pytest -q -p no:cacheprovider -x -rs tests 2>&1 | tee "$OUT/pytest.log" | tail -25

stage verify
timeout 200 python3 -m opfacade verify --out "$OUT/verified" --runs 3 2>&1 | tee "$OUT/verify.log" | tail -12

stage sanitizer
for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/sanitize_alibi.py \
        > "$OUT/sanitizer-$tool.log" 2>&1
    echo "$tool exit $?: $(tail -2 "$OUT/sanitizer-$tool.log" | tr '\n' ' ')"
done

stage bench
if [ "$mode" = quick ]; then q=--quick; else q=; fi
timeout 240 python3 -m opfacade bench $q --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
stage done
