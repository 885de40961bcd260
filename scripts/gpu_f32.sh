#!/usr/bin/env bash
# One device call for the true-f32 flash kernels (issue 12's f32 targets): times this tree's
# kernels against a baseline tree (BASE, a `git archive` of opfacade/ and native/, default
# .scratch/base when carried), compares their outputs, runs the kernels' check script, and
# profiles under ncu.
#   bash scripts/gpu_f32.sh [stages...]   stages: check time sanitize tests profile stalls
#   (stalls: ncu's per-SASS-instruction stall samples of one forward and one dK/dV launch,
#   STALL_CASE (default d128), with the pipes' utilisation (scripts/ncu_pipes.py), in
#   $OUT/ncu_stalls.tar.gz)
#   VARIANTS="name:MACRO[=VALUE][,MACRO...] ...": also check and time this tree with each
#   `#define MACRO VALUE` (default 1) prepended to native/flash_f32.cu, in a copy under /tmp;
#   PYSED_<name>, when set, is a sed script run on that copy's flash_f32.py.
#   TREES="name:path ...": trees prepared elsewhere (opfacade/ and native/ under path).
#   SANITIZE_TREE=/tmp/var_<name>: run the sanitize stage on that variant's tree instead.
set -u
stages=${*:-time}
source "$(dirname "$0")/device_prelude.sh"
BASE=${BASE:-.scratch/base}
variant_tree() {  # name macro[=value][,macro...] -> a copy of opfacade/ and native/ with the
    # macros defined, and the sed script in $PYSED_<name> (if any) run on flash_f32.py
    rm -rf "/tmp/var_$1" && mkdir -p "/tmp/var_$1" && cp -r opfacade native "/tmp/var_$1/"
    local define
    for define in ${2//,/ }; do
        [[ $define == *=* ]] || define="$define=1"
        sed -i "1i #define ${define%%=*} ${define#*=}" "/tmp/var_$1/native/flash_f32.cu"
    done
    local pysed="PYSED_$1"
    [ -n "${!pysed:-}" ] && sed -i "${!pysed}" "/tmp/var_$1/opfacade/_backends/nvrtc/flash_f32.py"
    return 0
}
# The trees checked and timed: this one (name "new", PYTHONPATH as set) and each variant's copy.
trees="new="
for spec in ${VARIANTS:-}; do
    variant_tree "${spec%%:*}" "${spec#*:}"
    trees="$trees ${spec%%:*}=/tmp/var_${spec%%:*}:"
done
# TREES="name:path ...": also check and time prepared trees (opfacade/ and native/ under path,
# relative to the checkout), e.g. diagnostic builds made on the development host.
for spec in ${TREES:-}; do
    trees="$trees ${spec%%:*}=$PWD/${spec#*:}:"
done
in_tree() {  # tree-entry command... -> the command with that tree first on PYTHONPATH
    local entry=$1; shift
    PYTHONPATH=${entry#*=}$PYTHONPATH "$@"
}
if wants check; then
    stage check
    for entry in $trees; do
        name=${entry%%=*}
        in_tree "$entry" timeout 200 python3 scripts/flash_f32_check.py "$OUT/flash_check_$name.json" \
            > "$OUT/flash_check_$name.log" 2>&1
        echo "flash check $name exit $?"; tail -6 "$OUT/flash_check_$name.log"
    done
fi
if wants time; then
    stage time
    if [ -d "$BASE" ]; then
        PYTHONPATH=$PWD/$BASE:$PYTHONPATH timeout 200 python3 scripts/f32_time.py "$OUT/base" 2>&1 | tail -8
    fi
    for entry in $trees; do
        name=${entry%%=*}; echo "--- $name"
        in_tree "$entry" timeout 200 python3 scripts/f32_time.py "$OUT/$name" 2>&1 | tail -8
        [ -d "$BASE" ] && python3 scripts/f32_time.py --compare "$OUT/base" "$OUT/$name" 2>&1 | tail -30
    done
    rm -f "$OUT"/*.npz  # too large to bring back
fi
if wants sanitize; then
    stage sanitize
    for tool in memcheck racecheck; do
        PYTHONPATH=${SANITIZE_TREE:+$SANITIZE_TREE:}$PYTHONPATH timeout 240 \
            compute-sanitizer --tool $tool --error-exitcode 9 python3 \
            tests/sanitize_attention_f32.py > "$OUT/sanitize_f32_$tool.log" 2>&1
        echo "sanitize_attention_f32 $tool exit $?"; grep -v "^=========     " \
            "$OUT/sanitize_f32_$tool.log" | tail -4
    done
fi
if wants tests; then
    stage tests
    timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider --maxfail=12 \
        tests/test_varlen_attention_gpu.py tests/test_precision_gpu.py -k "${TESTS_K:-f32}" \
        2>&1 | tee "$OUT/pytest_f32.log" | quiet | tail -30
    exited
fi
if wants profile; then
    stage profile
    metrics="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem"
    [ -n "${PROFILE_EXTRA:-}" ] && metrics="$metrics,$PROFILE_EXTRA"  # more metrics, comma-separated
    timeout 300 ncu --metrics "$metrics" -k "regex:flash_f32_(fwd|bwd_dkdv)" -c ${PROFILE_KERNELS:-12} \
        python3 scripts/f32_time.py /tmp/profile --profile > "$OUT/ncu_f32.txt" 2>&1
    echo "ncu exit $?"
    grep -E "flash_f32_|stalled|inst_executed|wavefronts|conflicts|issue_active|warps_active|duration|registers|occupancy" "$OUT/ncu_f32.txt" \
        | grep -v -E " 0(\.0+)?$| 0,0" | sed -E 's/ +/ /g' | head -${PROFILE_TAIL:-150}
fi
if wants stalls; then
    stage stalls
    # With the pipes' utilisation (ComputeWorkloadAnalysis, InstructionStats) and the memory
    # sections, so the raw page says which pipe (FP64/DMMA, FMA, ALU, LSU) or memory level bounds
    # the kernel beside where its warps stall.
    F32_CASES=${STALL_CASE:-d128} timeout 300 ncu --section SourceCounters --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section InstructionStats --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy \
        --import-source no -k "regex:flash_f32_(fwd|bwd_dkdv)" -c 2 -f -o /tmp/stalls \
        python3 scripts/f32_time.py /tmp/profile --profile > "$OUT/ncu_stalls.log" 2>&1
    echo "ncu exit $?"; tail -3 "$OUT/ncu_stalls.log"
    # The pages go back as one archive: a call returns at most 8 files.
    mkdir -p /tmp/stalls_pages
    ncu --import /tmp/stalls.ncu-rep --page details > /tmp/stalls_pages/details.txt 2>&1
    ncu --import /tmp/stalls.ncu-rep --page raw --csv > /tmp/stalls_pages/raw.csv 2>&1
    python3 scripts/ncu_pipes.py /tmp/stalls_pages/raw.csv | tee /tmp/stalls_pages/pipes.txt \
        | grep -E "###|avg|inst_executed.sum|ratio" | grep -v -E " 0\.0[0-9]* " | head -60
    ncu --import /tmp/stalls.ncu-rep --page source --csv --print-source sass \
        > /tmp/stalls_pages/sass.csv 2>&1
    echo "source page exit $? ($(wc -l < /tmp/stalls_pages/sass.csv) lines)"
    tar -czf "$OUT/ncu_stalls.tar.gz" -C /tmp stalls_pages
fi
stage done
