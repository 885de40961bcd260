#!/usr/bin/env bash
# One device call: scripts/cudnn_newer_probe.py on the image's cuDNN (9.19) and on a newer one
# carried in pieces, then our cuDNN varlen GPU tests on the newer one. The newer cuDNN's four
# libraries the graph API and its runtime-compiled SDPA engine need (libcudnn, _graph,
# _engines_runtime_compiled, _heuristic: 61 MiB as tar.xz) exceed one call's 64 MiB with the
# wheels, so an earlier call on the same warm machine leaves the first piece in /tmp/cudnn_up/
# (/tmp outlives a call; the work tree's ignored files did not) and this one carries the rest in .cd/:
#   call 1 (carry [".cd/paa"]):  mkdir -p /tmp/cudnn_up && cp .cd/paa /tmp/cudnn_up/
#   call 2 (carry [".whl", ".cd/pab", ".scratch/nv34.tar.xz"]):
#       bash scripts/gpu_cudnn_newer.sh [stages...]     stages: image newer tests (default all)
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

if [[ " $wanted " == *" tests "* ]]; then
stage "our cuDNN varlen tests, newer cuDNN"
LD_LIBRARY_PATH=$newer timeout 200 python3 -c "import cudnn; print('cudnn', cudnn.backend_version_string())"
LD_LIBRARY_PATH=$newer timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs \
    tests/test_varlen_attention_gpu.py -k "cudnn" 2>&1 | tee "$OUT/pytest_newer.log" | quiet | tail -8
fi
stage done
