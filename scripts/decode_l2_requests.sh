#!/usr/bin/env bash
# L2 requests against sectors, and the L2's units' throughputs, for one decode step of ours
# (partial and merge) and torch SDPA's kernel on the same cache (scripts/decode_ncu_probe.py's
# NCU_CASE, default B64 S4096 bf16 contiguous), under ncu: the forty-third session's evidence
# that the 8-row kq tile's K loads asked L2 for half lines (docs/DECODE.md, "The kq tile's K in
# whole lines"). A device call: bash scripts/decode_l2_requests.sh; the raw page comes back as
# $OUT/ncu_l2.csv.
set -u
stages=l2
source "$(dirname "$0")/device_prelude.sh"
metrics=gpu__time_duration.sum,dram__bytes_read.sum
metrics=$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum
metrics=$metrics,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum
metrics=$metrics,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
metrics=$metrics,l1tex__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,sm__cycles_active.avg,sm__cycles_elapsed.avg
timeout 200 ncu --profile-from-start off --metrics "$metrics" --csv --page raw \
    python3 scripts/decode_ncu_probe.py ${NCU_CASE:-64 4096} > "$OUT/ncu_l2.csv" 2> "$OUT/ncu_l2.err"
echo "ncu exit $?"; tail -2 "$OUT/ncu_l2.err"
python3 scripts/ncu_pipes.py "$OUT/ncu_l2.csv" --all "lts__t_(requests|sectors)_srcunit|lts__.*pct"
