#!/usr/bin/env bash
# One call on a lent GPU: the test suite (gpu tests included, one pytest per op family so that one
# family's crash cannot hide another's results), `opfacade verify`, compute-sanitizer memcheck and
# racecheck on the bespoke kernels, and the benchmark. Logs go to $OUT (8 files come back at most).
#   bash scripts/gpu_session.sh [full|quick] [stages...]     stages: tests verify sanitize bench
# Needs the wheels of ../shared/tools/device-wheels.sh in .whl/ (carried with the call).
set -u
mode=${1:-full}; shift || true
stages=${*:-tests verify sanitize bench}
source "$(dirname "$0")/device_prelude.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false

stage versions
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, cupy, cudnn, nvmath, pydantic; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cudnn-frontend', cudnn.__version__, 'cudnn', cudnn.backend_version(), 'nvmath', nvmath.__version__)"

if wants tests; then
    stage tests
    # One pytest per family of the registry table (tests/test_<family>*.py), then the rest.
    families=$(python3 -c "from opfacade._registry import FAMILIES; print(*[f.name for f in FAMILIES])")
    others=$(ls tests/test_*.py | grep -v -E "test_($(echo $families | tr ' ' '|'))" | tr '\n' ' ')
    # PARTS="others alibi" narrows the run to those parts (one call stays under ten minutes).
    parts=${PARTS:-others $families}
    if [[ " $parts " == *" others "* ]]; then
        timeout 420 python3 -m pytest -q -p no:cacheprovider -rfEs $others 2>&1 | tee "$OUT/pytest.log" | quiet | tail -6
        exited
    fi
    for family in $families; do
        [[ " $parts " == *" $family "* ]] || continue
        files=$(ls tests/test_${family}*.py 2>/dev/null | tr '\n' ' ')
        [ -n "$files" ] || continue
        echo "--- $family"
        timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs $files 2>&1 | tee -a "$OUT/pytest.log" | quiet | tail -25
        exited
    done
fi

if wants verify; then
    stage verify
    timeout 540 python3 -m opfacade verify --out "$OUT/verified" --runs 3 2>&1 | tee "$OUT/verify.log" | tail -30
fi

if wants sanitize; then
    stage sanitizer
    for script in tests/sanitize_alibi.py tests/sanitize_linear_grad.py tests/sanitize_attention_f32.py; do
        for tool in memcheck racecheck; do
            timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 $script \
                >> "$OUT/sanitizer.log" 2>&1
            echo "$script $tool exit $?: $(tail -2 "$OUT/sanitizer.log" | tr '\n' ' ')"
        done
    done
fi

if wants bench; then
    stage bench
    if [ "$mode" = quick ]; then q=--quick; else q=; fi
    timeout 400 python3 -m opfacade bench $q --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
fi
stage done
