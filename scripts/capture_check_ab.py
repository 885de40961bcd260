"""run() without a workspace asks on every call whether its stream is being captured
(memory.StreamScratch). A/B of who answers, in one process, interleaved: the driver through
ctypes (driver.DriverRuntime, the default) against CuPy's runtime (the default before it).

    python3 scripts/capture_check_ab.py      # prints medians, writes $OUT/capture_check_ab.json
"""

from __future__ import annotations

import json
import statistics
import time
import timeit

import probe_record  # scripts/probe_record.py, beside this probe
import torch

import opfacade
from opfacade._internal import device, memory
from opfacade._internal.driver import driver_runtime

CALLS, ROUNDS = 200, 11


def main() -> None:
    import cupy

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    plan = opfacade.SdpaForwardPlan.cached(opfacade.SdpaDescriptor(
        batch=1, heads_q=1, heads_kv=1, seq_q=64, seq_kv=64, head_dim=64, element="bf16"))
    args = opfacade.SdpaArgs(q, k, v, torch.empty(1, 1, 64, 64, **bf16))
    ws = torch.empty(max(plan.workspace_size, 256), device="cuda", dtype=torch.uint8)
    runtimes = {"driver": driver_runtime(), "cupy": cupy.cuda.runtime}
    stream = torch.cuda.current_stream().cuda_stream
    found: dict[str, list[float]] = {f"{n} {w}": [] for n in runtimes for w in ("without", "with")}
    checks = {}
    for name, runtime in runtimes.items():
        call = runtime.streamIsCapturing
        checks[name] = min(timeit.repeat(lambda c=call: c(stream), number=20000,
                                         repeat=5)) / 20000 * 1e6
    for _ in range(ROUNDS):
        for name, runtime in runtimes.items():
            device.DEVICES._runtime = runtime
            memory.STREAM_SCRATCH._capturing = None  # bound again from this runtime
            for which, call in (("without", lambda: plan.run(args)),
                                ("with", lambda: plan.run(args, workspace=ws))):
                call()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(CALLS):
                    call()
                found[f"{name} {which}"].append((time.perf_counter() - start) / CALLS * 1e6)
                torch.cuda.synchronize()
    medians = {key: statistics.median(values) for key, values in found.items()}
    result = {"us_per_call": medians, "capture_check_us": checks,
              "without_minus_with": {n: medians[f"{n} without"] - medians[f"{n} with"]
                                     for n in runtimes},
              "device": torch.cuda.get_device_name()}
    print(json.dumps(result, indent=1))
    probe_record.write("capture_check_ab", result)


if __name__ == "__main__":
    main()
