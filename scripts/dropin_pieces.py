"""Where the torch drop-ins' host time goes (issue 14 §3 and §5): oft.sdpa and oft.linear for
inference against their functional forms and torch's calls, their checks alone, and a training
call (forward with autograd, then torch.autograd.grad) against torch's, at tiny problems (B1 H1
S64 d64, 64x64x64 bf16) so the host paces the GPU. A cProfile of each training path follows.

    python3 scripts/dropin_pieces.py [out.json] [--label NAME] [--no-profile]
        [--counts | --only-counts]

Run it from two trees in alternating processes (PYTHONPATH) to compare code before and after.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from dispatch_pieces import gpu_us  # this directory is on sys.path

import opfacade
import opfacade.torch as oft
from opfacade.torch import _common

CALLS, TRAIN_CALLS, BATCHES = 200, 40, 11
# The summary's ratios, torch's time over ours: (name, group, torch's path, ours).
RATIOS = (
    ("oft.sdpa vs torch", "inference", "torch F.sdpa", "oft.sdpa"),
    ("oft.linear vs torch", "inference", "torch linear+gelu", "oft.linear"),
    ("oft.sdpa fwd+grad vs torch", "training", "torch sdpa fwd+grad", "oft.sdpa fwd+grad"),
    ("oft.linear fwd+grad vs torch", "training", "torch linear+gelu fwd+grad",
     "oft.linear fwd+grad"),
    ("oft.sdpa x8 chain vs torch", "chains", "torch sdpa x8 fwd+grad", "oft.sdpa x8 fwd+grad"),
    ("oft.linear x8 chain vs torch", "chains", "torch linear+gelu x8 fwd+grad",
     "oft.linear x8 fwd+grad"),
)


def per_call_us(paths: dict, calls: int) -> dict[str, float]:
    """Median over interleaved batches of ``calls`` calls (order rotated every batch), in
    microseconds per call; the GPU drained before each batch."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for fn in paths.values():
        for _ in range(calls):
            fn()
    for batch in range(BATCHES):
        for name in names[batch % len(names):] + names[:batch % len(names)]:
            fn = paths[name]
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return {name: round(statistics.median(values), 2) for name, values in samples.items()}


def memo_counts(paths: dict, calls: int = 300) -> dict[str, dict]:
    """What run()'s memo and the graph replays did over ``calls`` calls of each path (after its
    warm-up): calls, launches stored (misses), full checks, captures, direct launches."""
    from gpt_memo_probe import COUNTS, instrument  # this directory is on sys.path

    from opfacade._internal import graph_replay, memory

    instrument()
    direct = graph_replay.GraphedLaunches._launch_direct
    counted = {"direct": 0, "made": 0}

    def counted_direct(self):
        counted["direct"] += 1
        return direct(self)

    graph_replay.GraphedLaunches._launch_direct = counted_direct
    init = graph_replay.GraphedLaunches.__init__

    def counted_init(self, *args, **kwargs):
        counted["made"] += 1
        return init(self, *args, **kwargs)

    graph_replay.GraphedLaunches.__init__ = counted_init
    scratch_bytes = memory.scratch_bytes
    scratch: list = []

    def recorded_scratch(nbytes, device, package, stream, *rest):
        found = scratch_bytes(nbytes, device, package, stream, *rest)
        scratch.append((nbytes, stream, found[0], found[1] is None))
        return found

    memory.scratch_bytes = recorded_scratch
    found = {}
    for name, fn in paths.items():
        for _ in range(20):
            fn()
        COUNTS.update(dict.fromkeys(COUNTS, 0))
        counted.update(direct=0, made=0)
        scratch.clear()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        found[name] = {**COUNTS, "direct_launches": counted["direct"],
                       "graphed_launches_made": counted["made"], "scratch_calls": len(scratch),
                       "scratch_distinct": sorted({(n, st, hex(p), blk)
                                                   for n, st, p, blk in scratch})[:12]}
    graph_replay.GraphedLaunches._launch_direct = direct
    graph_replay.GraphedLaunches.__init__ = init
    memory.scratch_bytes = scratch_bytes
    return found


def torch_profile_of(fn, calls: int = 20, top: int = 30) -> str:
    """torch.profiler's table (self CPU time: aten ops, CUDA runtime and driver calls; GPU
    kernels) over ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top,
                                     max_name_column_width=60)


def profile_of(fn, calls: int = 400, top: int = 28) -> str:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: list[str]) -> int:
    out_path = next((a for a in argv if not a.startswith("--") and a.endswith(".json")), None)
    label = argv[argv.index("--label") + 1] if "--label" in argv else "tree"
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    x, w, b = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16), torch.randn(64, **bf16)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    g_att, g_lin = torch.randn_like(q), torch.randn(64, 64, **bf16)

    def checks_only():  # what oft.sdpa asks before the functional form, as a cost floor
        _common.cuda_device("sdpa", query=q, key=k, value=v, attn_mask=None)
        return (q.ndim == 3, q.ndim != 4 or k.ndim != 4 or v.ndim != 4,
                q.shape[1] != k.shape[1], q.requires_grad or k.requires_grad or v.requires_grad,
                torch.is_grad_enabled(), torch.compiler.is_compiling())

    inference = {
        "torch F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "opfacade.sdpa": lambda: opfacade.sdpa(q, k, v),
        "oft.sdpa": lambda: oft.sdpa(q, k, v),
        "torch linear+gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "opfacade.linear": lambda: opfacade.linear(x, w, b, activation="gelu_tanh"),
        "oft.linear": lambda: oft.linear(x, w, b, activation="gelu_tanh"),
        "sdpa drop-in checks alone": checks_only,
        "cuda_device, 4 keywords": lambda: _common.cuda_device("sdpa", query=q, key=k, value=v,
                                                               attn_mask=None),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "q.new_empty(0)": lambda: q.new_empty(0),
    }

    def torch_sdpa_train():
        out = F.scaled_dot_product_attention(qg, kg, vg)
        return torch.autograd.grad(out, (qg, kg, vg), g_att)

    def oft_sdpa_train():
        out = oft.sdpa(qg, kg, vg)
        return torch.autograd.grad(out, (qg, kg, vg), g_att)

    def torch_linear_train():
        out = F.gelu(F.linear(xg, wg, bg), approximate="tanh")
        return torch.autograd.grad(out, (xg, wg, bg), g_lin)

    def oft_linear_train():
        out = oft.linear(xg, wg, bg, activation="gelu_tanh")
        return torch.autograd.grad(out, (xg, wg, bg), g_lin)

    depth = 8
    weights = [torch.nn.Parameter(torch.randn(64, 64, **bf16) * 0.1) for _ in range(depth)]
    biases = [torch.nn.Parameter(torch.randn(64, **bf16)) for _ in range(depth)]

    def chain(step, leaves, grad_out):  # depth ops, one backward: per-op cost, per op
        def call():
            t = leaves[0]
            for i in range(depth):
                t = step(t, i)
            return torch.autograd.grad(t, leaves, grad_out)
        return call

    chains = {
        "torch sdpa x8 fwd+grad": chain(
            lambda t, i: F.scaled_dot_product_attention(t, kg, vg), (qg, kg, vg), g_att),
        "oft.sdpa x8 fwd+grad": chain(lambda t, i: oft.sdpa(t, kg, vg), (qg, kg, vg), g_att),
        "torch linear+gelu x8 fwd+grad": chain(
            lambda t, i: F.gelu(F.linear(t, weights[i], biases[i]), approximate="tanh"),
            (xg, *weights, *biases), g_lin),
        "oft.linear x8 fwd+grad": chain(
            lambda t, i: oft.linear(t, weights[i], biases[i], activation="gelu_tanh"),
            (xg, *weights, *biases), g_lin),
    }
    training = {
        "torch sdpa fwd+grad": torch_sdpa_train,
        "oft.sdpa fwd+grad": oft_sdpa_train,
        "torch sdpa fwd, graph kept": lambda: F.scaled_dot_product_attention(qg, kg, vg),
        "oft.sdpa fwd, graph kept": lambda: oft.sdpa(qg, kg, vg),
        "torch linear+gelu fwd+grad": torch_linear_train,
        "oft.linear fwd+grad": oft_linear_train,
        "torch linear+gelu fwd, graph kept": lambda: F.gelu(F.linear(xg, wg, bg),
                                                            approximate="tanh"),
        "oft.linear fwd, graph kept": lambda: oft.linear(xg, wg, bg, activation="gelu_tanh"),
    }
    if "--only-counts" in argv:
        for name, counts in memo_counts({**chains, **training}).items():
            print(f"{name}: {counts}")
        return 0
    sdpa_mod = sys.modules["opfacade.torch.sdpa"]
    s_args = (q, k, v, None, False, None, 0.0, None, None, True, False)
    out, stats = sdpa_mod._sdpa_impl(*s_args)

    class Toy(torch.autograd.Function):  # autograd.Function's own cost, 11 arguments
        @staticmethod
        def forward(ctx, *args):
            ctx.save_for_backward(*args[:3])
            return torch.empty_like(args[0]), torch.empty_like(args[0])

        @staticmethod
        def backward(ctx, *grads):
            return (grads[0],) * 3 + (None,) * 8

    toy_args = (qg, kg, vg, None, False, None, 0.0, None, None, True, False)

    def toy_train():
        out, _ = Toy.apply(*toy_args)
        return torch.autograd.grad(out, (qg, kg, vg), g_att)

    detail = {
        "sdpa Function.apply fwd": lambda: sdpa_mod._sdpa.function.apply(*toy_args),
        "sdpa kernel, save_stats": lambda: sdpa_mod._sdpa_impl(*s_args),
        "sdpa backward kernel": lambda: sdpa_mod._sdpa_backward.kernel(
            q, k, v, out, g_att, stats, None, False, False, None, 0.0, None, None, False),
        "toy Function.apply fwd": lambda: Toy.apply(*toy_args),
        "toy fwd+grad": toy_train,
        "functional sdpa, return_stats": lambda: opfacade.sdpa(q, k, v, return_stats=True),
        "functional sdpa, return_stats, grad inputs":
            lambda: opfacade.sdpa(qg, kg, vg, return_stats=True),
        "5 outputs allocated and held": lambda: [torch.empty_strided(
            (1, 1, 64, 64), (4096, 4096, 64, 1), dtype=torch.bfloat16, device="cuda")
            for _ in range(5)],
    }
    results = {"label": label, "gpu": torch.cuda.get_device_name(),
               "inference": per_call_us(inference, CALLS),
               "training": per_call_us(training, TRAIN_CALLS),
               "chains": per_call_us(chains, TRAIN_CALLS // 4),
               "detail": per_call_us(detail, TRAIN_CALLS),
               "gpu_us": {name: round(gpu_us(training[name], TRAIN_CALLS), 2) for name in
                          ("torch sdpa fwd+grad", "oft.sdpa fwd+grad",
                           "torch linear+gelu fwd+grad", "oft.linear fwd+grad")}}
    if "--counts" in argv:
        results["memo_counts"] = memo_counts({**training, **chains, **detail})
    for group in ("inference", "training", "chains", "detail", "gpu_us", "memo_counts"):
        if group not in results:
            continue
        print(f"== {label}: {group}")
        for name, us in results[group].items():
            print(f"  {name:44s} {us}")
    results["ratios"] = {name: round(results[group][peer] / results[group][ours], 3)
                         for name, group, peer, ours in RATIOS}
    print(f"== {label}: ratios (torch us / ours us)")
    for name, r in results["ratios"].items():
        print(f"  {name:36s} {r:6.3f}x")
    if "--no-profile" not in argv:
        results["profiles"] = {
            "functional sdpa, return_stats": profile_of(detail["functional sdpa, return_stats"]),
            "functional sdpa": profile_of(inference["opfacade.sdpa"]),
            "oft.linear x8 fwd+grad": profile_of(chains["oft.linear x8 fwd+grad"], calls=60),
            "oft.sdpa x8 fwd+grad": profile_of(chains["oft.sdpa x8 fwd+grad"], calls=60),
            "oft.sdpa fwd+grad": profile_of(oft_sdpa_train),
                               "oft.linear fwd+grad": profile_of(oft_linear_train),
                               "oft.sdpa inference": profile_of(inference["oft.sdpa"])}
        results["torch_profiles"] = {name: torch_profile_of(chains[name], calls=5) for name in
                                     ("oft.linear x8 fwd+grad", "torch linear+gelu x8 fwd+grad")}
        for name, text in results["torch_profiles"].items():
            print(f"== {label}: torch.profiler of {name}")
            print(text)
        for name, text in results["profiles"].items():
            print(f"== {label}: cProfile of {name}")
            print("\n".join(text.splitlines()[:45]))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
