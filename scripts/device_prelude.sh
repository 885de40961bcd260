# Sourced by the scripts/gpu_*.sh device calls after they set $stages: installs the wheels carried
# in .whl/ (../shared/tools/device-wheels.sh) beside the image's packages, sets the environment
# every call runs in, makes $OUT, and defines wants (is a stage asked for), stage (its banner) and
# quiet (a console filter: drops pytest's indented tracebacks and cudnn-frontend 1.32's nanobind
# leak report at interpreter exit, which otherwise pushes pytest's summary out of a tail), and
# exited (called right after a `pytest ... | tee | quiet | tail` pipe: prints pytest's own exit
# status, which the pipe drops, so an abort at interpreter exit (134) shows).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPFACADE_CACHE_DIR=/tmp/opfacade-cache
# pytest sessions start their private caches with the cubins the call carried or compiled
# (tests/conftest.py), instead of recompiling them in every session.
export OPFACADE_TEST_CUBIN_SEED=/tmp/opfacade-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/verified"
wants() { [[ " $stages " == *" $1 "* ]]; }
stage() { echo "=== $1 ($(date +%T))"; }
quiet() { grep -v -E "^    |leaked|nanobind|skipped remainder|refleaks"; }
exited() { local status=("${PIPESTATUS[@]}"); echo "pytest exit status ${status[0]}"; }
