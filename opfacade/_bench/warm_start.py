"""The warm start (issue 14 §4): the first SDPA forward and backward result in a new process, with
nothing cached (the cold build: opfacade's on-disk cache empty, and the CUDA driver's JIT cache
too), then with the caches the first process left (cuDNN plans deserialized, cubins loaded), and
once more with opfacade's cache empty but the driver's warm (see ``cold_and_warm``). Each process is
a fresh interpreter; the time runs from the first call to the synchronized gradients, after imports
and inputs (and, reported beside it, from before ``import torch``). Among the imports is one torch
makes lazily: its first backward handed a gradient tensor (``out.backward(grad)``, as here) imports
torch.fx's symbolic shapes and sympy, 0.23-0.35 s on an H100 whichever SDPA made ``out``; a training
step's ``loss.backward()`` never does.

Python's bytecode cache is warmed first, in a process of its own: a first call imports a large
part of torch lazily (torch's first backward imports sympy through torch.fx's symbolic shapes;
a custom op's first dispatch, torch._dynamo and FSDP), and where no bytecode is written (the
lent GPU machines' image: a read-only torch install, or PYTHONDONTWRITEBYTECODE) every process
compiled those modules from source, 2.8-4.6 s of the first call in H100 probes. A pip install
writes the bytecode once; the warm-up gives every measured process the same footing.

Beside the row, "torch first call": the same first forward+backward through torch's own
F.scaled_dot_product_attention in a fresh process: what any torch user's first step pays.

A second row times a new shape in a process that has run one already: the first SDPA forward at
S 3968 after one at S 4096, with an empty plan store, so the new length's graph is built; torch's
own SDPA at the same two lengths is the peer. cuDNN's kernel cache for dynamic shapes would make
that build milliseconds, but on cuDNN 9.19 with frontend 1.32 a forward built through it at a
second length ran out of bounds or gave wrong results (scripts/kernel_cache_probe.py,
docs/PERF-NOTES.md), so opfacade's graphs stay static."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from .common import BenchRow

SHAPE = (2, 16, 4096, 128)  # B, H, S, D: the size the cold-build figures were taken at

CHILD = r"""
import time
begun = time.perf_counter()
import hashlib, json, sys
import torch
peer = sys.argv[2] == "torch"
if not peer:
    import opfacade.torch as oft
    from opfacade._backends.cudnn import plan_store
shape = tuple(json.loads(sys.argv[1]))
# torch's own lazy import at the first backward handed a gradient tensor (sympy, through
# torch.fx's symbolic shapes: 0.23-0.35 s of either contestant's first call on an H100,
# scripts/warm_pieces_probe.py): an import like the others, made before the clock starts.
import torch.fx.experimental.symbolic_shapes
generator = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
           .requires_grad_() for _ in range(3))
torch.cuda.synchronize()
start = time.perf_counter()
if peer:
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
else:
    out = oft.sdpa(q, k, v, is_causal=True, deterministic=True)
out.backward(torch.ones_like(out))
torch.cuda.synchronize()
elapsed = (time.perf_counter() - start) * 1e3
digest = hashlib.sha256()
for t in (out, q.grad, k.grad, v.grad):
    digest.update(t.detach().view(torch.int16).cpu().numpy().tobytes())
loaded = 0 if peer else plan_store.loaded_count()
print(json.dumps({"first_ms": elapsed, "loaded": loaded, "bits": digest.hexdigest(),
                  "from_import_ms": (time.perf_counter() - begun) * 1e3}))
"""


NEW_SHAPE_CHILD = r"""
import json, sys, time
import torch
peer = sys.argv[2] == "torch"
if not peer:
    import opfacade.torch as oft
times = []
generator = torch.Generator(device="cuda").manual_seed(0)
for shape in json.loads(sys.argv[1]):
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3))
    torch.cuda.synchronize()
    start = time.perf_counter()
    if peer:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        out = oft.sdpa(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - start) * 1e3)
print(json.dumps({"first_ms": times[0], "new_shape_ms": times[-1]}))
"""


def _child(script: str, argument: object, through: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argument), through],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the warm-start child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_result(cache: str, shape: tuple[int, ...] = SHAPE, env: dict | None = None,
                 through: str = "opfacade") -> dict:
    """One fresh process's first SDPA forward+backward with ``cache`` as OPFACADE_CACHE_DIR,
    through opfacade's torch op or (``through="torch"``) torch's own SDPA."""
    return _child(CHILD, list(shape), through, {**(env or {}), "OPFACADE_CACHE_DIR": cache})


def new_shape_results(shapes: list[tuple[int, ...]]) -> dict[str, dict]:
    """The first forward at ``shapes[-1]`` in a process that ran the others first, through
    opfacade (an empty plan store) and through torch."""
    found = {}
    for through in ("opfacade", "torch"):
        with tempfile.TemporaryDirectory(prefix="opfacade-new-shape-") as cache:
            found[through] = _child(NEW_SHAPE_CHILD, [list(s) for s in shapes], through,
                                    {"OPFACADE_CACHE_DIR": cache})
    return found


def cold_and_warm(shape: tuple[int, ...] = SHAPE, peer: bool = False) -> dict[str, dict]:
    """First results in fresh processes, by name:

    - "cold": nothing cached, neither opfacade's plans nor the CUDA driver's JIT cache (an empty
      CUDA_CACHE_PATH of its own): the cold build;
    - "warm": opfacade's plans as "cold" left them, and the driver's cache as it left it;
    - "cold, driver cache warm": opfacade's plan cache empty again, the driver's cache as the
      two before left it. cuDNN's graphs for a shape build several times faster once the
      driver has cached their kernels' compilation (an H100: 0.54 s against 1.8-2.2 s), so a
      machine that built them before, in any process, builds them at this figure;
    - with ``peer``, "torch": torch's own first result (its caches as the machine has them).
    """
    prefix = "opfacade-warm-"
    with (tempfile.TemporaryDirectory(prefix=prefix) as cache,
          tempfile.TemporaryDirectory(prefix=prefix) as cache_again,
          tempfile.TemporaryDirectory(prefix="opfacade-cuda-cache-") as driver_cache,
          tempfile.TemporaryDirectory(prefix="opfacade-bytecode-") as bytecode,
          tempfile.TemporaryDirectory(prefix="opfacade-warm-up-") as throwaway):
        env = {"PYTHONDONTWRITEBYTECODE": ""}  # empty: bytecode is written
        if not os.environ.get("PYTHONPYCACHEPREFIX"):
            env["PYTHONPYCACHEPREFIX"] = bytecode
        first_result(throwaway, (1, 1, 64, 64), env)  # bytecode only: its plans are dropped
        first_result(throwaway, (1, 1, 64, 64), env, through="torch")
        own_driver_cache = {**env, "CUDA_CACHE_PATH": driver_cache}
        found = {"cold": first_result(cache, shape, own_driver_cache)}
        found["warm"] = first_result(cache, shape, own_driver_cache)
        found["cold, driver cache warm"] = first_result(cache_again, shape, own_driver_cache)
        if peer:
            found["torch"] = first_result(throwaway, shape, env, through="torch")
        return found


def run(quick: bool = False) -> list[BenchRow]:
    shape = (1, 4, 1024, 64) if quick else SHAPE
    found = cold_and_warm(shape, peer=True)
    cold, warm = found["cold"], found["warm"]
    case = (f"first SDPA fwd+bwd in a new process, B{shape[0]} H{shape[1]} S{shape[2]} "
            f"d{shape[3]} bf16 causal, deterministic")
    notes = (f"warm: {warm['loaded']} cuDNN plans deserialized; same bits as the cold run: "
             f"{warm['bits'] == cold['bits']}; from before import torch: warm "
             f"{warm['from_import_ms']:.0f} ms, cold {cold['from_import_ms']:.0f} ms; cold build: "
             f"nothing cached (opfacade's plans, the CUDA driver's JIT cache); target: warm <= "
             f"10% of cold (ratio >= 10)")
    first = [BenchRow(op="host", case=case, ours_ms=warm["first_ms"],
                      figure=f"warm {warm['first_ms']:.0f} ms", notes=notes,
                      peers_ms={"cold build": cold["first_ms"],
                                "cold build, driver cache warm":
                                    found["cold, driver cache warm"]["first_ms"],
                                "torch first call": found["torch"]["first_ms"]})]
    b, h, s, d = shape
    new = new_shape_results([shape, (b, h, s - 128, d)])
    ours = new["opfacade"]
    return [*first, BenchRow(
        op="host", case=(f"first SDPA forward at a new length (S {s - 128} after S {s}), B{b} H{h} "
                         f"d{d} bf16 causal, plan store empty"),
        ours_ms=ours["new_shape_ms"], figure=f"{ours['new_shape_ms']:.1f} ms",
        peers_ms={"torch": new["torch"]["new_shape_ms"]},
        notes=(f"the process's first forward (S {s}): ours {ours['first_ms']:.0f} ms, torch "
               f"{new['torch']['first_ms']:.0f} ms; ours builds a static cuDNN graph for the new "
               f"length (cuDNN 9.19's kernel cache for dynamic shapes gave wrong results)"))]
