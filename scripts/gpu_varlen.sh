#!/usr/bin/env bash
# One device call for the varlen attention SKUs (cuDNN ragged f16/bf16, true-f32 NVRTC) and the
# dense f32 SDPA ones: the f32 kernels' own check script, the GPU tests, every distribution's
# precision test, verify, compute-sanitizer on the cuDNN ragged path, and the bench rows.
#   bash scripts/gpu_varlen.sh [stages...]   stages: check tests verify sanitize bench
#   VERIFY_OPS="varlen_attention_forward ..." narrows verify.
set -u
stages=${*:-check tests verify bench}
source "$(dirname "$0")/device_prelude.sh"
if wants check; then
    stage check
    timeout 200 python3 scripts/flash_f32_check.py "$OUT/flash_check.json" > "$OUT/flash_check.log" 2>&1
    echo "flash check exit $?"; tail -25 "$OUT/flash_check.log"
fi
if wants tests; then
    stage tests
    timeout 330 python3 -m pytest -q -p no:cacheprovider --maxfail=12 tests/test_varlen_attention_gpu.py \
        "tests/test_precision_gpu.py" -k "varlen or (sdpa and f32)" \
        2>&1 | tee "$OUT/pytest_varlen.log" | quiet | tail -30
    exited
fi
if wants verify; then
    stage verify
    for op in ${VERIFY_OPS:-varlen_attention_forward varlen_attention_backward sdpa_forward sdpa_backward}; do
        timeout 200 python3 -m opfacade verify --op $op --out "$OUT/verified" --runs 3 2>&1 | grep -v "^PASS sdpa_.*cudnn" | tail -8
    done
fi
if wants sanitize; then
    stage sanitize
    timeout 240 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 \
        tests/sanitize_varlen_cudnn.py > "$OUT/sanitize_varlen_cudnn.log" 2>&1
    echo "sanitize_varlen_cudnn memcheck exit $?"; grep -v "^=========     " \
        "$OUT/sanitize_varlen_cudnn.log" | head -40
fi
if wants bench; then
    stage bench
    timeout 240 python3 -m opfacade bench --op varlen_attention --json "$OUT/bench_varlen.json" 2>&1 | tee "$OUT/bench_varlen.log" | grep -v Warning
fi
stage done
