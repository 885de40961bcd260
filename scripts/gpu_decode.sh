#!/usr/bin/env bash
# One device call for the decode_attention and kv_append SKUs (issue 13): the GPU tests, every
# distribution's precision test, verify, compute-sanitizer memcheck and racecheck on the decode
# kernels, the bench rows, and the f32 units probe (which units torch's f32 SDPA runs on).
#   bash scripts/gpu_decode.sh [stages...]   stages: tests verify sanitize bench units variants
#                                                    stalls append
# append: scripts/kv_append_variants.py, with APPEND_BEFORE=DIR (a baseline tree's native/)
# timed beside this tree's kernel.
# stalls: ncu's sections and per-SASS-instruction stall samples of one step of ours (and torch's
# SDPA beside a contiguous cache) on NCU_CASE (scripts/decode_ncu_probe.py's arguments, default
# "64 4096 bf16 contiguous4"), the pages back as $OUT/ncu_decode.tar.gz
set -u
stages=${*:-tests verify sanitize bench}
source "$(dirname "$0")/device_prelude.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if wants tests; then
    stage tests
    timeout ${TESTS_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --maxfail=${MAXFAIL:-15} \
        tests/test_decode_attention_gpu.py tests/test_kv_append_gpu.py tests/test_precision_gpu.py \
        -k "${TESTS_K:-decode or kv_append}" 2>&1 | tee "$OUT/pytest_decode.log" | quiet | tail -${TESTS_TAIL:-60}
    exited
fi
if wants verify; then
    stage verify
    # Each op's run merges into the one record $OUT/verified/<gpu>.json (opfacade verify).
    for op in ${VERIFY_OPS:-decode_attention kv_append}; do
        timeout 200 python3 -m opfacade verify --op $op --out "$OUT/verified" --runs 3 2>&1 | tail -8
    done
fi
if wants sanitize; then
    stage sanitize
    # --report-api-errors no: cuda-python's driver bindings resolve each entry point through
    # cuGetProcAddress at its first call (ours: the occupancy query in launch.resident_blocks),
    # and the driver answers CUDA_ERROR_INVALID_VALUE for the versions it lacks; memcheck counted
    # 34 such host API answers on an H100 (twenty-fifth session) and no kernel access error.
    for tool in memcheck racecheck; do
        timeout 200 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 \
            tests/sanitize_decode.py > "$OUT/sanitize_decode_$tool.log" 2>&1
        echo "sanitize_decode $tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|done' "$OUT/sanitize_decode_$tool.log" | tr '\n' ' ')"
        grep -v "^=========     " "$OUT/sanitize_decode_$tool.log" | grep -m 12 -E "Error|Invalid|Race|Hazard|Traceback|Error:"
    done
fi
if wants variants; then
    stage variants
    timeout ${VARIANTS_TIMEOUT:-300} python3 scripts/decode_variants.py "$OUT/decode_variants.json" ${VARIANTS_FLAGS:-} 2>&1 | tee "$OUT/decode_variants.log" | tail -${VARIANTS_TAIL:-40}
fi
if wants append; then
    stage append
    timeout 200 python3 scripts/kv_append_variants.py ${APPEND_BEFORE:+--before=$APPEND_BEFORE} \
        "$OUT/kv_append_variants.json" 2>&1 | tail -20
fi
if wants units; then
    stage units
    timeout 240 ncu --metrics sass__inst_executed_per_opcode --print-metric-instances details --csv \
        python3 scripts/f32_units_probe.py run > "$OUT/f32_units.csv" 2> "$OUT/f32_units.err"
    echo "ncu exit $?"; tail -3 "$OUT/f32_units.err"
    python3 scripts/f32_units_probe.py parse "$OUT/f32_units.csv"
fi
if wants stalls; then
    stage stalls
    timeout ${STALLS_TIMEOUT:-240} ncu --profile-from-start off --section SourceCounters \
        --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --import-source no -f -o /tmp/decode_stalls \
        python3 scripts/decode_ncu_probe.py ${NCU_CASE:-64 4096 bf16 contiguous4} \
        > "$OUT/ncu_decode.log" 2>&1
    echo "ncu exit $?"; tail -3 "$OUT/ncu_decode.log"
    mkdir -p /tmp/decode_pages  # one archive: a call brings back few files
    ncu --import /tmp/decode_stalls.ncu-rep --page details > /tmp/decode_pages/details.txt 2>&1
    ncu --import /tmp/decode_stalls.ncu-rep --page raw --csv > /tmp/decode_pages/raw.csv 2>&1
    # Whole to the file first: a `head` on a tee would cut the file short when it stops reading.
    python3 scripts/ncu_pipes.py /tmp/decode_pages/raw.csv > /tmp/decode_pages/pipes.txt
    grep -E "###|duration|dram|pct|ratio" /tmp/decode_pages/pipes.txt \
        | grep -v -E " 0\.0[0-9]* " | head -${STALLS_TAIL:-90}
    ncu --import /tmp/decode_stalls.ncu-rep --page source --csv --print-source sass \
        > /tmp/decode_pages/sass.csv 2>&1
    tar -czf "$OUT/ncu_decode.tar.gz" -C /tmp decode_pages
fi
if wants bench; then
    stage bench
    flags=$(for op in ${BENCH_OPS:-decode_attention kv_append}; do echo --op $op; done)
    timeout ${BENCH_TIMEOUT:-300} python3 -m opfacade bench $flags \
        --json "$OUT/bench_decode.json" 2>&1 | tee "$OUT/bench_decode.log" | tail -40
fi
stage done
