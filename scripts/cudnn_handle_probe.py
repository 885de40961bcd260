"""Where the first cuDNN handle's time goes (issue 14 §4, the warm start).

scripts/warm_pieces_probe.py found a warm first SDPA forward+backward in a fresh process to be
mostly two things that are not plans: torch's first backward handed a gradient tensor importing
sympy (through torch.fx.experimental.symbolic_shapes), and the first cuDNN handle, 160-236 ms on
an H100. This probe splits the handle: each case is a fresh interpreter, after ``import torch``,
CUDA initialised and ``import cudnn`` with the library loaded (backend_version), as opfacade has
them before its first handle.

  plain       create_handle() timed alone, and which cuDNN libraries it maps (/proc/self/maps)
  preload     the sub-libraries dlopened first (each timed), then create_handle()
  second      two handles in a row: what is one-time and what is per handle
  after_conv  a torch conv2d first (torch's own cuDNN handle and sub-libraries), then ours
  background  the sub-libraries dlopened on a thread started before CUDA initialises (as an
              import could start it), then create_handle() on the main thread

    python3 scripts/cudnn_handle_probe.py          # prints a table, writes $OUT/cudnn_handle.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import probe_record  # scripts/probe_record.py, beside this probe

CHILD = r"""
import ctypes, json, os, sys, threading, time
case = sys.argv[1]
marks = {}

def mapped():
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "libcudnn" in line}

def sublibraries(paths):
    shim = next(p for p in paths if os.path.basename(p).startswith("libcudnn.so"))
    folder = os.path.dirname(shim)
    names = sorted(n for n in os.listdir(folder)
                   if n.startswith("libcudnn_") and n.endswith(".so.9"))
    return [os.path.join(folder, n) for n in names]

def preload(paths, into):
    for path in paths:
        start = time.perf_counter()
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        into[os.path.basename(path)] = (time.perf_counter() - start) * 1e3

import torch
loaded = {}
background = None
if case == "background":
    # Which sub-libraries exist is known from the frontend's library path before CUDA starts.
    import cudnn
    cudnn.backend_version()
    background = threading.Thread(target=preload, args=(sublibraries(mapped()), loaded))
    start = time.perf_counter()
    background.start()
    marks["thread_start_ms"] = (time.perf_counter() - start) * 1e3
start = time.perf_counter()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
marks["cuda_init_ms"] = (time.perf_counter() - start) * 1e3
import cudnn
start = time.perf_counter()
cudnn.backend_version()
marks["backend_version_ms"] = (time.perf_counter() - start) * 1e3
if case == "after_conv":
    x = torch.randn(1, 4, 8, 8, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    start = time.perf_counter()
    torch.nn.functional.conv2d(x, w)
    torch.cuda.synchronize()
    marks["torch_conv_ms"] = (time.perf_counter() - start) * 1e3
before = mapped()
if case == "preload":
    preload(sublibraries(before), loaded)
if background is not None:
    start = time.perf_counter()
    background.join()
    marks["join_ms"] = (time.perf_counter() - start) * 1e3
start = time.perf_counter()
handle = cudnn.create_handle()
marks["create_handle_ms"] = (time.perf_counter() - start) * 1e3
if case == "second":
    start = time.perf_counter()
    cudnn.create_handle()
    marks["second_handle_ms"] = (time.perf_counter() - start) * 1e3
after = mapped()
print(json.dumps({"case": case, "marks": marks, "dlopen_ms": loaded,
                  "mapped_before": sorted(os.path.basename(p) for p in before),
                  "mapped_by_handle": sorted(os.path.basename(p) for p in after - before)}))
"""

CASES = ("plain", "preload", "second", "after_conv", "background")


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "3"))
    results = []
    for _ in range(rounds):
        for case in CASES:
            done = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True,
                                  text=True, timeout=120)
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            try:
                results.append(json.loads(line))
            except json.JSONDecodeError:
                results.append({"case": case, "error": done.stderr[-2000:]})
    for r in results:
        if "error" in r:
            print(r["case"], "ERROR", r["error"][-400:])
            continue
        dl = sum(r["dlopen_ms"].values())
        print(f"{r['case']:11s} " + " ".join(f"{k}={v:.1f}" for k, v in r["marks"].items())
              + (f" dlopen_total={dl:.1f}" if dl else ""))
    first = next((r for r in results if r.get("case") == "plain" and "error" not in r), None)
    if first:
        print("mapped before the handle:", first["mapped_before"])
        print("mapped by the handle:", first["mapped_by_handle"])
    pre = next((r for r in results if r.get("case") == "preload" and "error" not in r), None)
    if pre:
        print("dlopen each:", {k: round(v, 1) for k, v in pre["dlopen_ms"].items()})
    probe_record.write("cudnn_handle", {"rounds": rounds, "results": results})


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"probe {time.perf_counter() - started:.0f} s")
