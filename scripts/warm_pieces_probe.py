"""Where the first SDPA fwd+bwd of a fresh process goes, plan store warm vs cold (issue 14 §4).

    python3 scripts/warm_pieces_probe.py       # writes $OUT/warm_pieces.json (OUT: /tmp/out)
    env: PROBE_BUDGET_S (default 140: children left when it runs out are skipped, not run);
         PREIMPORT=1: every child imports torch.fx.experimental.symbolic_shapes before its clock
         (torch's lazy import at a first backward handed a gradient, as the bench now does)

B2 H16 S4096 d128 bf16 causal deterministic, as opfacade/_bench/warm_start.py: a bytecode
warm-up first, then each child a fresh interpreter with its own OPFACADE_CACHE_DIR.
"pieces" children time (after import torch, CUDA init, q/k/v): a import opfacade.torch,
b1 cudnn-frontend import + libcudnn load (runtime.backend_version), b2 runtime.handle_for (the
handle the SKUs use), c the forward selection (ops.sdpa._forward_plan, torch_forward's own call),
d its first run, e the backward selection (Plan.cached_for under sdpa_backward's own key), f its
first run, then g/h the drop-in forward/backward (what is left of a first call once selected).
"plain" children time the drop-in's first fwd+bwd alone (the bench's figure); "profile" is plain
under cProfile; "torch" is torch's own first SDPA fwd+bwd.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import probe_record  # scripts/probe_record.py, beside this probe

REPO = Path(__file__).resolve().parents[1]
SHAPE, TINY = [2, 16, 4096, 128], [1, 1, 64, 64]
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "140"))
PIECES = ["a_import_opfacade", "b1_cudnn_load", "b2_handle", "c_fwd_select", "d_fwd_run",
          "e_bwd_select", "f_bwd_run", "g_dropin_fwd", "h_dropin_bwd"]

CHILD = r'''
import time
begun = time.perf_counter()
import hashlib, json, os, sys
mode, shape = sys.argv[1], tuple(json.loads(sys.argv[2]))
T, S, EVENTS, R = {}, {}, [], {"mode": mode}
def mark(name, t0, sync=False):
    if sync:
        torch.cuda.synchronize()
    T[name] = (time.perf_counter() - t0) * 1e3
    return time.perf_counter()
def digest(*ts):
    h = hashlib.sha256()
    for t in ts:
        h.update(t.detach().view(torch.int16).cpu().numpy().tobytes())
    return h.hexdigest()
t = time.perf_counter()
import torch
t = mark("import_torch", t)
if os.environ.get("PREIMPORT") == "1":
    import torch.fx.experimental.symbolic_shapes
    t = mark("preimport", t)
torch.ones(1, device="cuda")
t = mark("cuda_init", t, sync=True)
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
           for _ in range(3))
t = mark("inputs", t, sync=True)
if mode == "torch":
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.ones_like(out))
    t = mark("first_call", t, sync=True)
else:
    import opfacade.torch as oft
    t = mark("a_import_opfacade", t)
    from opfacade import plan as P
    from opfacade._backends.cudnn import graphs, plan_store, runtime
    from opfacade._internal.config import cache_dir
    def sizes():
        return {"facts_cache": len(P.FACTS_CACHE._items), "plan_cache": len(P.PLAN_CACHE._items),
                "graphs": len(graphs.GRAPHS._entries), "loaded": plan_store.loaded_count()}
    R["cache_dir"] = str(cache_dir())
if mode == "pieces":
    from opfacade.ops import sdpa as F
    from opfacade._internal import operands, tensors
    from opfacade._internal.view import TORCH_DTYPES
    from opfacade.contracts.sdpa import (SdpaArgs, SdpaBackwardArgs, SdpaBackwardDescriptor,
                                         dense_strides)
    def patch(owner, name, label):  # times each call; behaviour unchanged
        inner = getattr(owner, name)
        def timed(*a, **kw):
            s = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                EVENTS.append([label, getattr(a[0], "direction", ""),
                               round((time.perf_counter() - s) * 1e3, 3)])
        setattr(owner, name, timed)
    patch(graphs.GRAPHS, "_build", "graph_build")  # handle + declare + store load/build + adopt
    patch(plan_store, "load", "store_load")        # identity + file read + deserialize
    patch(plan_store, "read_checked", "store_read")
    patch(plan_store, "store", "store_write")
    # (causal, window, scale, alibi, dropout_p, padding): what torch_forward and sdpa_backward
    # pass for the drop-in's is_causal=True, scale=None, no mask, no dropout.
    OPTIONS = ("top_left", None, None, False, 0.0, False)
    t = time.perf_counter()
    runtime.backend_version()
    t = mark("b1_cudnn_load", t)
    runtime.handle_for(q.get_device())
    t = mark("b2_handle", t, sync=True)
    # wrap() registers torch.Tensor as plain (operands.facts then reads shape/stride/dtype/device
    # directly, as every drop-in call after a process's first does): the facts keys below are
    # then the ones the drop-in call at g/h looks up.
    tensors.wrap(q, "q")
    fwd = F._forward_plan(q, k, v, None, OPTIONS, True)[0]
    t = mark("c_fwd_select", t)
    S["after_c"] = sizes()
    d = fwd.descriptor
    out = torch.empty_strided(d.o_shape, d.o_strides, dtype=q.dtype, device=q.device)
    stats = torch.empty(d.stats_shape, dtype=TORCH_DTYPES[d.stats_element], device=q.device)
    fwd.run(SdpaArgs(q, k, v, out, stats))
    t = mark("d_fwd_run", t, sync=True)
    facts = F._facts(q, k, v, None, OPTIONS)
    bwd = F.SdpaBackwardPlan.cached_for(
        (facts, False, True),
        lambda: SdpaBackwardDescriptor(**F._problem(*F._wrapped(q, k, v), None, OPTIONS),
                                       need_bias_grad=False),
        {"deterministic": True}, device=operands.device_of(facts[0]))
    t = mark("e_bwd_select", t)
    S["after_e"] = sizes()
    b = bwd.descriptor
    grads = [torch.empty_strided(s, dense_strides(b.layout, *s), dtype=q.dtype, device=q.device)
             for s in (b.q_shape, b.k_shape, b.v_shape)]
    bwd.run(SdpaBackwardArgs(q, k, v, out, torch.ones_like(out), stats, *grads))
    t = mark("f_bwd_run", t, sync=True)
    out = oft.sdpa(q, k, v, is_causal=True, deterministic=True)
    t = mark("g_dropin_fwd", t, sync=True)
    out.backward(torch.ones_like(out))
    t = mark("h_dropin_bwd", t, sync=True)
    S["after_h"] = sizes()
    R["dropin_selected_again"] = {key: S["after_h"][key] - S["after_e"][key]
                                  for key in S["after_h"]}
    R["plans"] = {"forward": fwd.sku.id, "backward": bwd.sku.id,
                  "forward_ws": fwd.workspace_size, "backward_ws": bwd.workspace_size}
    R["versions"] = {"torch": torch.__version__, "cudnn": runtime.backend_version(),
                     "frontend": getattr(runtime.cudnn_module(), "__version__", "?"),
                     "device": torch.cuda.get_device_name()}
elif mode in ("plain", "profile"):
    prof = None
    if mode == "profile":
        import cProfile, pstats
        prof = cProfile.Profile()
    t = time.perf_counter()
    if prof:
        prof.enable()
    out = oft.sdpa(q, k, v, is_causal=True, deterministic=True)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    if prof:
        prof.disable()
    t = mark("first_call", t)
    if prof:
        rows = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
        def short(f):
            for cut in ("site-packages/", "dist-packages/"):
                if cut in f:
                    return f.split(cut, 1)[1]
            if "/lib/python" in f:
                return f.split("/lib/python", 1)[1].split("/", 1)[-1]
            return f.replace(os.getcwd() + os.sep, "")
        def top(i):
            best = sorted(rows.items(), key=lambda kv: -kv[1][i])[:25]
            return [f"{s[3]*1e3:9.2f} cum {s[2]*1e3:9.2f} tot {s[1]:6d}x {short(f)}:{l}({n})"
                    for (f, l, n), s in best]
        R["profile_cumulative"], R["profile_tottime"] = top(3), top(2)
R["from_begin_ms"] = (t - begun) * 1e3  # t: the last mark's end, before digests and stats
if mode != "torch":
    S["end"] = sizes()
    R["loaded"] = plan_store.loaded_count()
R.update(times=T, sizes=S, events=EVENTS, bits=digest(out, q.grad, k.grad, v.grad))
print(json.dumps(R))
'''

T0 = time.perf_counter()


def child(mode: str, shape: list, cache: str, env: dict, label: str, limit: float = 60) -> dict:
    left = BUDGET_S - (time.perf_counter() - T0)
    if left < 8:
        return {"label": label, "mode": mode, "skipped": "budget"}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    begun = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, mode, json.dumps(shape)], cwd=REPO,
                              env={**os.environ, **env, "PYTHONPATH": path,
                                   "OPFACADE_CACHE_DIR": cache},
                              capture_output=True, text=True, timeout=min(limit, left))
    except subprocess.TimeoutExpired:
        return {"label": label, "mode": mode, "error": f"timeout after {min(limit, left):.0f} s"}
    wall = time.perf_counter() - begun
    if done.returncode != 0:
        return {"label": label, "mode": mode, "error": done.stderr[-3000:], "wall_s": wall}
    return {"label": label, **json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall}


def listing(root: str) -> dict:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(Path(root).rglob("*"))
            if p.is_file()}


def median(runs: list, key: str) -> float | None:
    found = [r["times"][key] for r in runs if key in r.get("times", {})]
    return statistics.median(found) if found else None


def main() -> None:
    runs: list[dict] = []
    with (tempfile.TemporaryDirectory(prefix="wp-cache-") as cache,
          tempfile.TemporaryDirectory(prefix="wp-cold-plain-") as cold_plain,
          tempfile.TemporaryDirectory(prefix="wp-bytecode-") as bytecode,
          tempfile.TemporaryDirectory(prefix="wp-throwaway-") as throwaway):
        env = {"PYTHONDONTWRITEBYTECODE": ""}  # empty: bytecode is written (as the bench)
        if not os.environ.get("PYTHONPYCACHEPREFIX"):
            env["PYTHONPYCACHEPREFIX"] = bytecode
        for mode in ("profile", "pieces", "torch"):  # bytecode only; the tiny plans are dropped
            runs.append(child(mode, TINY, throwaway, env, f"warmup-{mode}", limit=90))
        runs.append(child("pieces", SHAPE, cache, env, "cold-pieces"))
        cold_files = listing(cache)
        for i in range(3):
            runs.append(child("pieces", SHAPE, cache, env, f"warm-pieces-{i}"))
            if i < 2:
                runs.append(child("plain", SHAPE, cache, env, f"warm-plain-{i}"))
        runs.append(child("profile", SHAPE, cache, env, "warm-profile"))
        for i in range(2):
            runs.append(child("torch", SHAPE, throwaway, env, f"torch-{i}"))
        runs.append(child("plain", SHAPE, cold_plain, env, "cold-plain"))
    for r in runs:
        if "times" in r and "first_call" not in r["times"] and "b1_cudnn_load" in r["times"]:
            r["times"]["sum_b_to_h"] = sum(r["times"][p] for p in PIECES[1:])
    warm_pieces = [r for r in runs if r["label"].startswith("warm-pieces")]
    warm_plain = [r for r in runs if r["label"].startswith("warm-plain")]
    summary = {f"warm_pieces_median_{p}": median(warm_pieces, p) for p in PIECES}
    summary.update(
        warm_pieces_median_sum_b_to_h=median(warm_pieces, "sum_b_to_h"),
        warm_plain_median_first_call=median(warm_plain, "first_call"),
        torch_median_first_call=median([r for r in runs if r["label"].startswith("torch-")],
                                       "first_call"),
        cold_pieces_sum_b_to_h=median([r for r in runs if r["label"] == "cold-pieces"],
                                      "sum_b_to_h"),
        cold_plain_first_call=median([r for r in runs if r["label"] == "cold-plain"],
                                     "first_call"),
        same_bits=len({r["bits"] for r in runs if "bits" in r and "warmup" not in r["label"]
                       and r["mode"] != "torch"}) == 1)
    result = {"shape": SHAPE, "case": "bf16 causal deterministic, oft.sdpa + backward(ones)",
              "cache_dir_variable": "OPFACADE_CACHE_DIR (plans in <dir>/cudnn-plans, NVRTC "
                                    "cubins in <dir>/nvrtc; OPFACADE_CUDNN_PLAN_CACHE=0: off)",
              "cache_dir": cache, "cache_files_after_cold": cold_files, "summary": summary,
              "runs": runs, "probe_wall_s": time.perf_counter() - T0}
    written = probe_record.write("warm_pieces", result)
    cols = ["import_torch", "cuda_init", *PIECES, "sum_b_to_h", "first_call"]
    print(f"{'run':15s} {'ld':>2s} " + " ".join(f"{c.split('_')[0][:6]:>6s}" for c in cols)
          + "  from_begin")
    for r in runs:
        if "times" not in r:
            print(f"{r['label']:15s} {r.get('skipped') or r.get('error', '')[-300:]}")
            continue
        cells = " ".join(f"{r['times'][c]:6.0f}" if c in r["times"] else f"{'-':>6s}"
                         for c in cols)
        print(f"{r['label']:15s} {r.get('loaded', '-')!s:>2s} {cells}  {r['from_begin_ms']:.0f}")
    print("(columns: import_torch cuda_init a b1 b2 c d e f g h sum(b..h) first_call, all ms)")
    for r in runs:
        if r["label"] in ("cold-pieces", "warm-pieces-0"):
            print(r["label"], "events:", r.get("events"), "drop-in selected again:",
                  r.get("dropin_selected_again"), r.get("plans"))
    print(json.dumps(summary, indent=1))
    for line in next((r.get("profile_cumulative", []) for r in runs
                      if r["label"] == "warm-profile"), [])[:12]:
        print(line)
    print(f"wrote {written} in {time.perf_counter() - T0:.0f} s")


if __name__ == "__main__":
    main()
