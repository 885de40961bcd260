"""Whether tests/test_kv_append_gpu.py's test of kv_append's programmatic launch can fail: runs
``test_an_append_waits_for_the_kernel_before_it`` on both of its caches ``N`` times (the writer
on the append's own stream), with kv_append.cu as shipped or (``--mutant``) compiled with its
``follow_previous_grid`` taken out while still launched as a programmatic dependent. Each form
runs in a process of its own (the kernels are cached per process). The shipped kernel must pass
every time, the mutant fail.

    python3 scripts/kv_append_wait_mutant.py N [--mutant]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from opfacade._backends.nvrtc import compiler  # noqa: E402

_read_native = compiler.read_native
MUTANT = "--mutant" in sys.argv


def read_native(name: str) -> str:
    """native/<name>, kv_append.cu without its wait for the mutant (a new text: a new cubin)."""
    text = _read_native(name)
    if MUTANT and name == "kv_append.cu":
        assert "follow_previous_grid(); /*" in text
        text = text.replace("follow_previous_grid(); /*", "/* taken out */ /*")
    return text


def main(trials: int) -> int:
    compiler.read_native = read_native
    import test_kv_append_gpu as tests
    from test_decode_attention_gpu import Cache

    failures = 0
    for _ in range(trials):
        for cache in (Cache("paged", "nhd", 16), Cache("contiguous", "hnd")):
            try:
                tests.test_an_append_waits_for_the_kernel_before_it(cache, "same")
            except AssertionError as error:
                failures += 1
                print("failed", cache.id, str(error)[:120].replace("\n", " "))
    print("mutant" if MUTANT else "shipped", "failures:", failures, "of", 2 * trials)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
