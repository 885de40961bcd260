#!/usr/bin/env bash
# One device call for opfacade.torch (issue 14): its GPU tests (opcheck, gradients against
# float64, torch.compile, CUDA graphs, determinism, bad input) and the bench's host rows.
#   bash scripts/gpu_torch.sh [stages...]   stages: probe tests bench example verify
# probe: python3 $PROBE (a scripts/*_probe.py), its output in $OUT/probe.log
set -u
stages=${*:-tests bench}
source "$(dirname "$0")/device_prelude.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, cudnn; print('torch', torch.__version__, 'cudnn', cudnn.backend_version())"
if wants probe; then
    stage probe
    timeout ${PROBE_TIMEOUT:-200} python3 ${PROBE} 2>&1 | tee "$OUT/probe.log" | tail -${PROBE_TAIL:-60}
fi
if wants tests; then
    stage tests
    timeout ${TESTS_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider --maxfail=${MAXFAIL:-40} ${PYTEST_EXTRA:-} \
        ${TESTS_FILES:-tests/test_torch_gpu.py tests/test_torch.py tests/test_example_gpt_gpu.py} -k "${TESTS_K:-not nothing}" \
        2>&1 | tee "$OUT/pytest_torch.log" | quiet | tail -${TESTS_TAIL:-80}
    exited
fi
if wants bench; then
    stage bench
    flags=$(for op in ${BENCH_OPS:-host}; do echo --op $op; done)
    timeout ${BENCH_TIMEOUT:-200} python3 -m opfacade bench $flags --json "$OUT/bench.json" 2>&1 | tail -40
fi
if wants example; then
    stage example
    timeout ${EXAMPLE_TIMEOUT:-400} python3 examples/gpt.py --steps ${EXAMPLE_STEPS:-50} ${EXAMPLE_ARGS:-} \
        --json "$OUT/gpt_example.json" 2>&1 | grep -v Warning | tail -40
fi
if wants verify; then
    stage verify
    # Every op takes more than 280 s on an H200 (forty-fifth session: alibi's two ops alone
    # about 200 s); VERIFY_TIMEOUT for less.
    timeout ${VERIFY_TIMEOUT:-540} python3 -m opfacade verify --out "$OUT/verified" --runs 3 2>&1 | tail -12
fi
stage done
