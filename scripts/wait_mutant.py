"""Whether the GPU tests of the programmatic launches can fail: runs
``test_an_append_waits_for_the_kernel_before_it`` (tests/test_kv_append_gpu.py, ``append``) or
``test_a_decode_step_waits_for_the_kernel_before_it`` (tests/test_decode_attention_gpu.py,
``decode``) ``N`` times on each of their caches (the writer on the kernel's own stream), with the
kernels as shipped or (``--mutant``) with their ``follow_previous_grid`` turned into a bare
``let_dependents_launch``: still launched as programmatic dependents, and still letting the
next kernel launch, but no longer waiting. Each form runs in a process of its own (the kernels
are cached per process). The shipped kernels must pass every time, the mutant fail.

    python3 scripts/wait_mutant.py append|decode N [--mutant]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from opfacade._backends.nvrtc import compiler  # noqa: E402

_read_native = compiler.read_native
MUTANT = "--mutant" in sys.argv
SOURCES = {"append": ("kv_append.cu",), "decode": ("decode_attention.cu", "decode_wg.cu")}
WAIT = "follow_previous_grid();"


def reader(op: str):
    def read_native(name: str) -> str:
        """native/<name>, without the followers' wait for the mutant (a new text: new cubins)."""
        text = _read_native(name)
        if MUTANT and name in SOURCES[op]:
            assert WAIT in text, name
            text = text.replace(WAIT, "let_dependents_launch();")
        return text

    return read_native


def main(op: str, trials: int) -> int:
    compiler.read_native = reader(op)
    from test_decode_attention_gpu import Cache

    caches = (Cache("paged", "nhd", 16), Cache("contiguous", "hnd"))
    if op == "append":
        import test_kv_append_gpu as tests

        cases = [(tests.test_an_append_waits_for_the_kernel_before_it, (c, "same"))
                 for c in caches]
    else:
        import test_decode_attention_gpu as tests

        cases = [(tests.test_a_decode_step_waits_for_the_kernel_before_it, (c, q_len, "same"))
                 for c in caches for q_len in (1, 4)]
    failures = 0
    for _ in range(trials):
        for test, args in cases:
            try:
                test(*args)
            except AssertionError as error:
                failures += 1
                print("failed", args[0].id, *args[1:], str(error)[:120].replace("\n", " "))
    print(op, "mutant" if MUTANT else "shipped", "failures:", failures, "of",
          len(cases) * trials)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
