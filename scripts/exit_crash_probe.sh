#!/usr/bin/env bash
# Which GPU test file's process aborts at interpreter exit ("free(): invalid pointer", seen once
# after tests/test_linear_gpu.py, test_torch_gpu.py, test_guarded.py and test_interop.py ran in
# one pytest). Each file runs in a process of its own under faulthandler (it prints the Python
# stack on SIGABRT), its exit status and the last lines of its output kept in $OUT.
#   bash scripts/exit_crash_probe.sh [files...]
stages=probe
source "$(dirname "$0")/device_prelude.sh"
files=${*:-tests/test_linear_gpu.py tests/test_torch_gpu.py tests/test_guarded.py tests/test_interop.py}
which gdb || echo "no gdb"
for file in $files; do
    name=$(basename "$file" .py)
    timeout ${FILE_TIMEOUT:-200} python3 -X faulthandler -m pytest -q -p no:cacheprovider \
        ${PYTEST_EXTRA:-} "$file" > "$OUT/$name.log" 2>&1
    status=$?
    echo "$file rc=$status $(grep -E 'passed|failed' "$OUT/$name.log" | tail -1)"
    grep -n -E -A30 "invalid pointer|Fatal Python|Aborted|double free|corrupted" "$OUT/$name.log" | head -60
done
