"""`opfacade bench`: each op against its peers in the same run, reported as ratios.

Times are medians of CUDA-event timings after warm-up, on random inputs (never zeros). torch is
only a benchmark peer here, imported by the benchmark, never by the ops. A row where a contestant
may be host-bound is timed again from CUDA graphs (``_bench/graph_timing.py``) unless ``graphs``
is False.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ._bench.common import BenchRow, format_rows

__all__ = ["run_bench"]


# Benches that time no one family: the host cost of the framework paths (``_bench/host.py``) and
# the first result in a new process, cold and warm (``_bench/warm_start.py``).
EXTRA_BENCHES = ("host", "warm_start")


def _families():
    """Each family's bench (``_bench/<family>.py``), in the registry table's order, then the
    extra benches."""
    import importlib

    from ._registry import FAMILIES

    names = [family.name for family in FAMILIES] + list(EXTRA_BENCHES)
    return {name: importlib.import_module(f"._bench.{name}", __package__).run for name in names}


def _warm_up(seconds: float = 2.0) -> None:
    """Matrix products until the clocks leave idle (an idle H100 sits near 345 MHz), so the first
    family measured is not slower than the rest."""
    import time

    import cupy

    a = cupy.random.random((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a
        cupy.cuda.Stream.null.synchronize()


def run_bench(json_path: str | None = None, quick: bool = False, ops: list[str] | None = None,
              graphs: bool = True) -> list[BenchRow]:
    """Benchmarks each family (or those in ``ops``) on the current device and prints the rows;
    ``graphs=False`` marks the rows whose bursts may time the host without timing them again
    from CUDA graphs.

    Raises:
        BackendUnavailable: no GPU, no driver for CUDA 13, the GPU stack or torch (a peer in
            every family's rows) is not installed.
    """
    import importlib.util

    from ._internal.device import device_name
    from .errors import BackendUnavailable
    from .verify import require_gpu

    device = require_gpu("the benchmark")
    if importlib.util.find_spec("torch") is None:
        raise BackendUnavailable("opfacade bench measures torch as a peer of each op; install "
                                 "it with: pip install torch")
    name = device_name(device)
    from ._bench import common
    from ._bench.device_state import device_state, format_state

    common.RETIME_IN_GRAPHS = graphs
    print(f"opfacade bench on {name}{' (quick sizes)' if quick else ''}")
    _warm_up()
    # The clocks and power the rows ran under, after the warm-up and at the end: hosts of one
    # kind differ (_bench/device_state.py says by how much), and the record should say which.
    states = {"after_warm_up": device_state(device)}
    print(format_state(states["after_warm_up"]), flush=True)
    rows: list[BenchRow] = []
    for family, run in _families().items():
        if ops and family not in ops:
            continue
        found = run(quick=quick)
        print(format_rows(found), flush=True)
        rows += found
    states["at_end"] = device_state(device)
    print(format_state(states["at_end"]))
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"gpu": name, "quick": quick, "device_state": states,
                       "rows": [asdict(r) for r in rows]}, out, indent=2)
    return rows
