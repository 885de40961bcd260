"""A direct packed launch (PackedLaunch: a step's first call, and its path under a caller's
capture) through the bare cuLaunchKernel (driver.bare_function, arguments made once as ctypes
objects) against the same function with declared argument types on plain ints (the form before
01dd0fc), in one process, interleaved batch by batch. A graph replay (GraphedLaunches) and
CuPy's own launch of the same kernel are timed beside them as references.

    python3 scripts/packed_launch_ab.py   # prints medians, writes $OUT/packed_launch_ab.json
"""

from __future__ import annotations

import ctypes
import statistics
import time

import probe_record  # scripts/probe_record.py, beside this probe
import torch
from noop_launch import noop_kernel  # scripts/noop_launch.py, beside this probe

from opfacade._backends.nvrtc import launch as launching
from opfacade._internal.driver import libcuda
from opfacade._internal.graph_replay import GraphedLaunches

CALLS, ROUNDS = 200, 21


def main() -> None:
    kernel, args, _verdict = noop_kernel(torch)
    stream = torch.cuda.current_stream().cuda_stream

    bare = launching.PackedLaunch(kernel, (1,), (256,), args, stream, 0)
    declared = launching.PackedLaunch(kernel, (1,), (256,), args, stream, 0)
    function = libcuda()["cuLaunchKernel"]  # a function object of its own: bare's is untouched
    function.restype, function.argtypes = ctypes.c_int, launching._LAUNCH_TYPES
    declared._launch = function
    declared._arguments = (int(kernel.ptr), 1, 1, 1, 256, 1, 1, 0, int(stream),
                           ctypes.addressof(declared._params), None)
    graphed = GraphedLaunches(lambda on: [launching.PackedLaunch(kernel, (1,), (256,), args,
                                                                 on, 0)], stream, 0)
    cupy_args = tuple(args)
    calls = {"bare packed launch": bare, "declared packed launch": declared,
             "graph replay": graphed,
             "cupy launch": lambda: kernel((1,), (256,), cupy_args)}
    for call in calls.values():  # warm: the graph is captured by its second call
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    found: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            call = calls[name]
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            found[name].append((time.perf_counter() - start) / CALLS * 1e6)
            torch.cuda.synchronize()
    medians = {name: statistics.median(values) for name, values in found.items()}
    quartiles = {name: statistics.quantiles(values, n=4) for name, values in found.items()}
    record = {"us_per_call_median": medians, "us_per_call_quartiles": quartiles,
              "calls_per_batch": CALLS, "rounds": ROUNDS,
              "device": torch.cuda.get_device_name()}
    for name in names:
        print(f"{name:24s} {medians[name]:.2f} us  (quartiles "
              f"{quartiles[name][0]:.2f}-{quartiles[name][2]:.2f})")
    probe_record.write("packed_launch_ab", record)


if __name__ == "__main__":
    main()
