"""Where an eager sdpa forward and backward's host time goes, ours against torch's (issue 14
§3): the bench's host problem (B1 H1 S64 d64 bf16), interleaved in one process.

The bench's "forward and backward" row (the forward, then torch.autograd.grad) puts ours at
0.73-0.77x of torch, where the forward with grad alone is at 0.66-0.72x and ~10-15 us apart: so
most of the gap is on the backward side. This splits it:

- each backward node called directly from Python (``out.grad_fn(grad)``, no engine): torch's
  C++ node against ours (the PyNode running ``_train_backward``);
- the autograd engine's cost around one node of each kind: torch.autograd.grad through a C++
  clone against through a Python Function whose backward returns its gradient;
- our backward op's layers: the DefinedOp call, the kernel (the guarded backward);
- a cProfile of our node called directly.

    python3 scripts/sdpa_backward_gap_probe.py [out.json]
    python3 scripts/sdpa_backward_gap_probe.py --threads [out.json]   # the same backward in
        # loops of 200 calls on the main thread, a plain thread and the engine's thread
"""

from __future__ import annotations

import cProfile
import importlib
import io
import json
import pstats
import sys
import types

import torch
from dropin_pieces import profile_of  # this directory is on sys.path

from opfacade._bench.common import host_us_interleaved


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


def node_call(node, g):
    """A call of ``node`` (a backward node) on ``g`` under no_grad, as the engine runs it: with
    None for its other inputs, as many as it takes (one per output of its forward). A C++ node
    is callable; a Python Function's node runs its backward through ``apply``."""
    function = node if callable(node) else node.apply
    for nones in range(4):
        args = (g,) + (None,) * nones

        def call(args=args):
            with torch.no_grad():
                return function(*args)
        try:
            call()
        except (TypeError, RuntimeError):
            continue
        return call
    raise RuntimeError(f"could not call {type(node).__name__}")


class _RunsOurs(torch.autograd.Function):
    """forward a clone; backward runs our sdpa backward function on a stand-in ctx (set below)
    and returns its gradient: our backward's cost on the autograd engine's thread."""

    ctx = grad = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        importlib.import_module("opfacade.torch.sdpa")._train_backward(
            _RunsOurs.ctx, _RunsOurs.grad, None)
        return grad


def cases() -> tuple[dict, object]:
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    fsdpa = importlib.import_module("opfacade.ops.sdpa")
    F = torch.nn.functional
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    g = torch.randn(1, 1, 64, 64, **bf16)
    grad = torch.autograd.grad
    torch_out = F.scaled_dot_product_attention(qg, kg, vg)
    torch_node = torch_out.grad_fn
    out, stats = torch.ops.opfacade.sdpa_train.default(q, k, v, False, None, False)
    refuse = sdpa._ON_GPU["sdpa_train_backward"]
    xg = torch.randn(1, 1, 64, 64, **bf16, requires_grad=True)
    # Our Python backward itself, on a stand-in for its ctx (a PyNode called directly lost its
    # saved tensors between calls in this harness: see diagnose()).
    ctx = types.SimpleNamespace(saved_tensors=(q, k, v, out, stats), options=(False, None, False))
    _RunsOurs.ctx, _RunsOurs.grad = ctx, g
    found = {
        "torch F.sdpa with grad": lambda: F.scaled_dot_product_attention(qg, kg, vg),
        "oft.sdpa with grad": lambda: sdpa.sdpa(qg, kg, vg),
        "torch forward and backward": lambda: grad(F.scaled_dot_product_attention(qg, kg, vg),
                                                   (qg, kg, vg), g),
        "ours forward and backward": lambda: grad(sdpa.sdpa(qg, kg, vg), (qg, kg, vg), g),
        f"torch node direct ({type(torch_node).__name__})": node_call(torch_node, g),
        "our backward function (fake ctx)": lambda: sdpa._train_backward(ctx, g, None),
        "our backward DefinedOp call": lambda: sdpa._sdpa_train_backward(
            q, k, v, out, g, stats, False, None, False),
        "our backward op dispatched": lambda: torch.ops.opfacade.sdpa_train_backward.default(
            q, k, v, out, g, stats, False, None, False),
        "our backward kernel (guarded)": lambda: fsdpa.torch_backward(
            q, k, v, out, g, stats, None, None, False, refuse),
        "engine: C++ clone fwd+bwd": lambda: grad(xg.clone(), (xg,), g),
        "engine: Python Function fwd+bwd": lambda: grad(_Identity.apply(xg), (xg,), g),
        "engine: Function running our backward (stand-in ctx)": lambda: grad(
            _RunsOurs.apply(xg), (xg,), g),
        "C++ clone forward": lambda: xg.clone(),
        "Python Function forward": lambda: _Identity.apply(xg),
    }
    return found, lambda: sdpa._train_backward(ctx, g, None)


def diagnose() -> list[str]:
    """Whether two eager calls with grad share outputs or nodes, and whether a node keeps its
    saved tensors across another call's backward."""
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    qg, kg, vg = (torch.randn(1, 1, 64, 64, **bf16, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 1, 64, 64, **bf16)
    lines = []
    first = sdpa.sdpa(qg, kg, vg)
    node = first.grad_fn
    for i in range(400):
        other = sdpa.sdpa(qg, kg, vg)
        if i in (0, 399):
            lines.append(f"call {i}: same object {other is first}, same storage "
                         f"{other.data_ptr() == first.data_ptr()}, same node "
                         f"{other.grad_fn is node}")
        torch.autograd.grad(other, (qg, kg, vg), g)
        try:
            node.apply(g, None)
        except RuntimeError as error:
            lines.append(f"after {i + 1} other backwards, the first node: {error}"[:160])
            break
    else:
        lines.append("the first node kept its saved tensors through 400 other backwards")
    return lines


def counted(fns: dict, names: list[str], calls: int = 300) -> dict:
    """For each named case, what ``calls`` calls did inside: guarded finds that missed (forward
    and backward), run()'s memo (lookups, entries stored: a retarget or a full check), and
    library launches (direct or replayed from a graph), counted per thread."""
    import threading

    fsdpa = importlib.import_module("opfacade.ops.sdpa")
    from opfacade._internal import call_memo, graph_replay

    counts: dict = {}

    def count(what):
        key = (what, threading.current_thread() is threading.main_thread())
        counts[key] = counts.get(key, 0) + 1

    def wrap(owner, name, what):
        original = owner.__dict__[name]

        def wrapped(self, *args, **kwargs):
            count(what)
            return original(self, *args, **kwargs)
        setattr(owner, name, wrapped)
        return owner, name, original

    GuardedCalls = type(fsdpa._TORCH_CALLS)
    original_find = GuardedCalls.__dict__["find"]

    def find(self, *args):
        result = original_find(self, *args)
        if result is None:
            if self is fsdpa._TORCH_CALLS:
                count("forward guard miss")
            elif self is fsdpa._TORCH_BACKWARDS:
                count("backward guard miss")
        return result

    GuardedCalls.find = find
    undo = [(GuardedCalls, "find", original_find),
            wrap(call_memo.CallMemo, "launch_for", "memo lookup"),
            wrap(call_memo.CallMemo, "_store", "memo store"),
            wrap(graph_replay.GraphedLaunches, "_launch_direct", "direct launch"),
            wrap(graph_replay.GraphedLaunches, "_build", "graph capture")]
    found = {}
    try:
        for name in names:
            counts.clear()
            for _ in range(calls):
                fns[name]()
            torch.cuda.synchronize()
            found[name] = {f"{what} ({'main' if main else 'engine'} thread)": n
                           for (what, main), n in sorted(counts.items())}
    finally:
        for owner, name, original in undo:
            setattr(owner, name, original)
    return found


def profile_engine_backward(fns: dict, name: str, calls: int = 2000) -> str:
    """A cProfile of our sdpa node's backward where the engine runs it (its own thread)."""
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    function = sdpa._sdpa_train._apply.__self__
    original = function.__dict__["backward"]
    profiler = cProfile.Profile()

    def backward(ctx, *grads):
        profiler.enable()
        try:
            return original.__func__(ctx, *grads)
        finally:
            profiler.disable()

    function.backward = staticmethod(backward)
    try:
        for _ in range(calls):
            fns[name]()
    finally:
        function.backward = original
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


class _LoopsOurs(torch.autograd.Function):
    """backward runs our sdpa backward function ``calls`` times in a row on the engine's thread
    and keeps the per-call time: is that thread slow, or the first call after a switch?"""

    run = None
    calls = 200
    us: list[float] = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        import time
        start = time.perf_counter()
        for _ in range(_LoopsOurs.calls):
            _LoopsOurs.run()
        _LoopsOurs.us.append((time.perf_counter() - start) / _LoopsOurs.calls * 1e6)
        return grad


def threads_experiment(rounds: int = 9) -> dict:
    """Our backward function (stand-in ctx) in loops of 200 calls: on the main thread, on the
    autograd engine's device thread (inside one backward), and on a plain Python thread; median
    us a call of each. Also lists the process's Python threads."""
    import statistics
    import threading
    import time

    fns, run_ours = cases()
    del fns
    xg = torch.randn(8, device="cuda", requires_grad=True)
    _LoopsOurs.run = run_ours

    def main_loop():
        start = time.perf_counter()
        for _ in range(200):
            run_ours()
        return (time.perf_counter() - start) / 200 * 1e6

    def thread_loop():
        result = []
        worker = threading.Thread(target=lambda: result.append(main_loop()))
        worker.start()
        worker.join()
        return result[0]

    def engine_loop():
        _LoopsOurs.us.clear()
        torch.autograd.grad(_LoopsOurs.apply(xg), (xg,), torch.ones_like(xg))
        return _LoopsOurs.us[0]

    samples = {"main thread": [], "plain Python thread": [], "autograd engine thread": []}
    loops = {"main thread": main_loop, "plain Python thread": thread_loop,
             "autograd engine thread": engine_loop}
    for loop in loops.values():
        loop()
    for _ in range(rounds):
        for name, loop in loops.items():
            torch.cuda.synchronize()
            samples[name].append(loop())
    torch.cuda.synchronize()
    return {"us a call, median of rounds": {n: round(statistics.median(v), 2)
                                           for n, v in samples.items()},
            "python threads": [t.name for t in threading.enumerate()]}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--threads"]:
        found = threads_experiment()
        print(json.dumps(found, indent=1))
        if argv[1:]:
            with open(argv[1], "w") as out:
                json.dump({"device": torch.cuda.get_device_name(), **found}, out, indent=1)
        return 0
    diagnosis = diagnose()
    print("\n".join(diagnosis))
    fns, node_call_ = cases()
    us = host_us_interleaved(fns, calls=200, rounds=15)
    for name, value in us.items():
        print(f"{value:7.2f} us  {name}", flush=True)
    profile = profile_of(node_call_, calls=3000, top=25)
    print(profile)
    inside = counted(fns, ["ours forward and backward", "our backward function (fake ctx)",
                           "engine: Function running our backward (stand-in ctx)",
                           "torch forward and backward"])
    for name, found in inside.items():
        print(f"{name}: {found}")
    engine_profile = profile_engine_backward(fns, "ours forward and backward")
    print(engine_profile)
    if argv:
        with open(argv[0], "w") as out:
            json.dump({"device": torch.cuda.get_device_name(), "how": __doc__.split("\n\n")[1],
                       "host_us": {n: round(u, 2) for n, u in us.items()},
                       "our_backward_cprofile": profile, "diagnosis": diagnosis,
                       "counted_per_300_calls": inside,
                       "engine_backward_cprofile": engine_profile}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
