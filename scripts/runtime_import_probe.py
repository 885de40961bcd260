"""What each CUDA runtime binding costs a fresh process (issue 14 §4, the warm start): the import,
and the per-call host time of the runtime calls opfacade makes on every run (the current device,
whether a stream is being captured). Each import is timed in a fresh interpreter after
``import torch`` and CUDA initialised, as a torch user's first opfacade call finds the process.

    python3 scripts/runtime_import_probe.py      # prints a table, writes $OUT/runtime_import.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import probe_record  # scripts/probe_record.py, beside this probe

CHILD = r"""
import json, sys, time, timeit
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
which = sys.argv[1]
start = time.perf_counter()
if which == "cupy":
    import cupy
    rt = cupy.cuda.runtime
    rt.getDeviceCount()
    calls = {"getDevice": rt.getDevice, "streamIsCapturing": lambda: rt.streamIsCapturing(0)}
elif which == "cuda.bindings.runtime":
    from cuda.bindings import runtime as rt
    rt.cudaGetDeviceCount()
    calls = {"getDevice": rt.cudaGetDevice,
             "streamIsCapturing": lambda: rt.cudaStreamIsCapturing(0)}
elif which == "cuda.bindings.driver":
    from cuda.bindings import driver as drv
    drv.cuInit(0)
    drv.cuDeviceGetCount()
    calls = {"getDevice": drv.cuCtxGetDevice,
             "streamIsCapturing": lambda: drv.cuStreamIsCapturing(0)}
elif which == "torch.cuda":
    torch.cuda.device_count()
    calls = {"getDevice": torch.cuda.current_device,
             "getDevice (C)": torch._C._cuda_getDevice}
import_ms = (time.perf_counter() - start) * 1e3
per_call = {name: min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6
            for name, f in calls.items()}
print(json.dumps({"which": which, "import_ms": import_ms, "per_call_us": per_call,
                  "modules": len(sys.modules)}))
"""

WHICH = ("cupy", "cuda.bindings.runtime", "cuda.bindings.driver", "torch.cuda")


def main() -> None:
    results = []
    for _ in range(int(os.environ.get("ROUNDS", "3"))):
        for which in WHICH:
            done = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True,
                                  text=True, timeout=120)
            try:
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                results.append({"which": which, "error": done.stderr[-1500:]})
    for r in results:
        if "error" in r:
            print(r["which"], "ERROR", r["error"][-300:])
        else:
            calls = " ".join(f"{k} {v:.2f} us" for k, v in r["per_call_us"].items())
            print(f"{r['which']:22s} import {r['import_ms']:7.1f} ms  {calls}")
    probe_record.write("runtime_import", results)


if __name__ == "__main__":
    main()
