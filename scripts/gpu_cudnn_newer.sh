#!/usr/bin/env bash
# One device call: scripts/cudnn_newer_probe.py on the image's cuDNN (9.19) and on a newer one
# carried in pieces, then our cuDNN varlen GPU tests on the newer one. The newer cuDNN's four
# libraries the graph API and its runtime-compiled SDPA engine need (libcudnn, _graph,
# _engines_runtime_compiled, _heuristic: 61 MiB as tar.xz) exceed one call's 64 MiB with the
# wheels, so an earlier call on the same warm machine leaves the first piece in /tmp/cudnn_up/
# (/tmp outlives a call; the work tree's ignored files did not), and this one carries the
# rest in .cd/:
#   call 1 (carry [".cd/paa"]):  mkdir -p /tmp/cudnn_up && cp .cd/paa /tmp/cudnn_up/
#   call 2 (carry [".whl", ".cd/pab", ".scratch/nv34.tar.xz"]):
#       bash scripts/gpu_cudnn_newer.sh [stages...]   stages: image newer quick tests compat
#   (default: image newer tests; quick: the probe's checks and the override backward, no
#   timing; compat: the sdpa GPU test files, the cuDNN cases of the decode, precision and varlen
#   ones and the held-out problems of every cuDNN SKU, on the newer cuDNN)
# The pieces: split -b 40M of `tar cf - libcudnn.so.9 libcudnn_graph.so.9
# libcudnn_engines_runtime_compiled.so.9 libcudnn_heuristic.so.9 | xz -9e` from the
# nvidia-cudnn-cu13 wheel's nvidia/cudnn/lib.
set -u
wanted=${*:-image newer tests}
stages=none
mkdir -p /tmp/opfacade-cache && tar xJf .scratch/nv34.tar.xz -C /tmp/opfacade-cache
source "$(dirname "$0")/device_prelude.sh"
ls -la /tmp/cudnn_up .cd || true
mkdir -p /tmp/newer && cat /tmp/cudnn_up/paa .cd/pab | xz -d | tar x -C /tmp/newer || {
    echo "the newer cuDNN did not unpack (a fresh machine without call 1's piece?)"; exit 3; }
ls -la /tmp/newer
nvrtc=$(python3 -c "
import glob, os, site
found = [p for s in site.getsitepackages() + [os.path.expanduser('~')]
         for p in glob.glob(s + '/nvidia/*/lib/libnvrtc.so.13*')]
print(os.path.dirname(found[0]) if found else '')")
echo "nvrtc in: $nvrtc"
newer="/tmp/newer:$nvrtc:${LD_LIBRARY_PATH:-}"

if [[ " $wanted " == *" image "* ]]; then
stage "probe, image cuDNN"
timeout 150 python3 scripts/cudnn_newer_probe.py --out "$OUT/probe_image.json" \
    > "$OUT/probe_image.log" 2>&1
echo "exit $?"; grep -v "^  \|^Traceback" "$OUT/probe_image.log" | tail -16
fi

if [[ " $wanted " == *" newer "* ]]; then
stage "probe, newer cuDNN"
LD_LIBRARY_PATH=$newer timeout 420 python3 scripts/cudnn_newer_probe.py \
    --out "$OUT/probe_newer.json" > "$OUT/probe_newer.log" 2>&1
echo "exit $?"; grep -v "^  \|^Traceback\|^backend could\|^cudnn._compiled" "$OUT/probe_newer.log" | cut -c1-300 | tail -30
fi

if [[ " $wanted " == *" quick "* ]]; then
stage "probe without timing, with the override backward, newer cuDNN"
LD_LIBRARY_PATH=$newer timeout 120 python3 scripts/cudnn_newer_probe.py --skip-timing \
    --backward-check --out "$OUT/probe_quick.json" > "$OUT/probe_quick.log" 2>&1
echo "exit $?"; grep -v "^  \|^Traceback\|^backend could\|^cudnn._compiled" "$OUT/probe_quick.log" | cut -c1-300 | tail -16
fi

if [[ " $wanted " == *" tests "* ]]; then
stage "our cuDNN varlen tests, newer cuDNN"
LD_LIBRARY_PATH=$newer timeout 200 python3 -c "import cudnn; print('cudnn', cudnn.backend_version_string())"
LD_LIBRARY_PATH=$newer timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs \
    tests/test_varlen_attention_gpu.py -k "cudnn" 2>&1 | tee "$OUT/pytest_newer.log" | quiet | tail -8
fi

if [[ " $wanted " == *" compat "* ]]; then
stage "every cuDNN SKU's GPU tests, newer cuDNN"
# Which cuDNN a test process runs: torch first (as the tests import it), then one of our cuDNN
# plans; the libraries mapped into the process say whether torch's 9.19 came along.
LD_LIBRARY_PATH=$newer timeout 200 python3 -c "
import torch
from opfacade import Plan
from opfacade._backends.cudnn import runtime
from opfacade.ops.sdpa import sdpa
q = torch.randn(1, 2, 64, 64, device='cuda', dtype=torch.bfloat16)
out = sdpa(q, q, q)
torch.cuda.synchronize()
print('our cuDNN runtime', runtime.backend_version(), 'torch cuDNN', torch.backends.cudnn.version())
print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcudnn' in l}))"
LD_LIBRARY_PATH=$newer timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs \
    tests/test_sdpa_gpu.py tests/test_sdpa_lifecycle_gpu.py tests/test_sdpa_edges_gpu.py \
    tests/test_plan_store_gpu.py 2>&1 | tee "$OUT/pytest_compat_sdpa.log" | quiet | tail -8
LD_LIBRARY_PATH=$newer timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs -k cudnn \
    tests/test_decode_attention_gpu.py tests/test_precision_gpu.py \
    tests/test_varlen_attention_gpu.py 2>&1 | tee "$OUT/pytest_compat_rest.log" | quiet | tail -8
LD_LIBRARY_PATH=$newer OPFACADE_GPU_FUZZ_SEED=20261129 timeout 200 python3 -m pytest -q \
    -p no:cacheprovider -rfEs -s -k cudnn tests/test_fuzz_gpu.py 2>&1 \
    | tee "$OUT/pytest_compat_fuzz.log" | grep -E "held-out|passed|failed|error" | tail -24
fi
stage done
