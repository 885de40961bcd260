"""Where an eager sdpa backward's time goes inside torch.autograd.grad (issue 14 §3): the
bench's host problem (B1 H1 S64 d64 bf16), torch's F.sdpa against oft.sdpa, in one process.

Each iteration runs the forward with grad, then ``torch.autograd.grad``. A pre-hook and a hook
on the output's grad_fn stamp the engine thread's clock just before and just after the node
runs, so a call splits into:

- entry: from the main thread's call of autograd.grad to the node's start (the engine's set-up,
  waking its device thread, the hooks' own GIL entry);
- node: the backward node itself, on the engine's thread;
- exit: from the node's end to autograd.grad's return on the main thread.

The same node is also called directly on the main thread (``node direct``), and every case runs
again with the GPU kept busy (``torch.cuda._sleep`` before each iteration) to show whether a
node waits on the GPU. Medians of ``ROUNDS`` rounds of ``CALLS`` iterations each, cases
interleaved.

    python3 scripts/engine_phase_probe.py [out.json]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

CALLS, ROUNDS = 200, 9
SLEEP_CYCLES = 400_000  # ~200 us of GPU time at 1.98 GHz: longer than a whole iteration's host


def run_case(forward, inputs, g, busy: bool, profile=None) -> dict[str, float]:
    """Median phases (us) of CALLS iterations of forward + autograd.grad."""
    now = time.perf_counter_ns
    marks: dict[str, int] = {}

    def pre(grad_outputs):
        marks["t1"] = now()

    def post(grad_inputs, grad_outputs):
        marks["t2"] = now()

    phases: dict[str, list[float]] = {"teardown": [], "forward": [], "entry": [], "node": [],
                                      "exit": [], "total": []}
    out = node = None
    for _ in range(CALLS):
        if busy:
            torch.cuda._sleep(SLEEP_CYCLES)
        d0 = now()
        del out, node  # the last iteration's output and node, freed here rather than inside
        f0 = now()     # the forward's time
        if profile is not None:
            profile.enable()
        out = forward()
        if profile is not None:
            profile.disable()
        node = out.grad_fn
        node.register_prehook(pre)
        node.register_hook(post)
        t0 = now()
        torch.autograd.grad(out, inputs, g)
        t3 = now()
        phases["teardown"].append(f0 - d0)
        phases["forward"].append(t0 - f0)
        phases["entry"].append(marks["t1"] - t0)
        phases["node"].append(marks["t2"] - marks["t1"])
        phases["exit"].append(t3 - marks["t2"])
        phases["total"].append(t3 - d0)
    torch.cuda.synchronize()
    return {k: statistics.median(v) / 1e3 for k, v in phases.items()}


def forward_only(forward, profile=None) -> float:
    """Median us of the forward with grad alone (no backward between calls)."""
    times = []
    out = None
    for _ in range(CALLS):
        del out
        t = time.perf_counter_ns()
        if profile is not None:
            profile.enable()
        out = forward()  # noqa: F841 (freed by the next turn's del, outside the timing)
        if profile is not None:
            profile.disable()
        times.append(time.perf_counter_ns() - t)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def profiled(run) -> str:
    """The top of a cProfile of what ``run(profile)`` profiles, by own time."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    run(profile)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
    return text.getvalue()


def node_direct(forward, g) -> float:
    """Median us of the output's backward node called on the main thread (no engine)."""
    out = forward()
    node = out.grad_fn
    call = node if callable(node) else node.apply  # a Python Function's node: apply
    times = []
    with torch.no_grad():
        for nones in range(4):  # as many Nones as the node takes for its other outputs
            try:
                call(g, *(None,) * nones)
            except (TypeError, RuntimeError):
                continue
            for _ in range(CALLS):
                t = time.perf_counter_ns()
                call(g, *(None,) * nones)
                times.append(time.perf_counter_ns() - t)
            break
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3 if times else float("nan")


def main(argv: list[str]) -> int:
    import opfacade.torch as oft
    from opfacade._bench.python_floor import cudnn_sdpa_in_python_function

    F = torch.nn.functional
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 1, 64, 64, **bf16)
    cases = {"torch F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
             "oft.sdpa": lambda: oft.sdpa(q, k, v)}
    # The floor: torch's own cuDNN ops in a Python autograd.Function (the bench's contestant).
    floor = cudnn_sdpa_in_python_function(q, k, v)
    if floor is not None:
        cases["torch's kernels in a Python Function"] = lambda: floor(q, k, v)
    inputs = (q, k, v)
    if floor is not None:  # the floor's grads against torch's own
        mine = torch.autograd.grad(floor(q, k, v), inputs, g)
        theirs = torch.autograd.grad(cases["torch F.sdpa"](), inputs, g)
        same = all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))
        print("floor grads equal torch's:", same)
    for forward in cases.values():  # warm: plans, graph captures (256th call), allocator
        for _ in range(600):
            torch.autograd.grad(forward(), inputs, g)
    torch.cuda.synchronize()
    rows: dict[str, dict[str, list]] = {}
    for _ in range(ROUNDS):
        for name, forward in cases.items():
            for busy in (False, True):
                phases = run_case(forward, inputs, g, busy)
                row = rows.setdefault(f"{name}{', GPU busy' if busy else ''}", {})
                for key, value in phases.items():
                    row.setdefault(key, []).append(value)
            row = rows.setdefault(f"{name} node direct", {})
            row.setdefault("node", []).append(node_direct(forward, g))
            row = rows.setdefault(f"{name} forward only", {})
            row.setdefault("forward", []).append(forward_only(forward))
    found = {name: {k: round(statistics.median(v), 2) for k, v in row.items()}
             for name, row in rows.items()}
    for name, row in found.items():
        print(f"{name:28s} " + "  ".join(f"{k} {v:7.2f}" for k, v in row.items()), flush=True)
    ours = cases["oft.sdpa"]
    profiles = {"our forward inside forward+backward loops": profiled(
                    lambda p: [run_case(ours, inputs, g, False, p) for _ in range(5)]),
                "our forward in forward-only loops": profiled(
                    lambda p: [forward_only(ours, p) for _ in range(5)])}
    for name, text in profiles.items():
        print(f"--- {name}\n{text}")
    if argv:
        with open(argv[0], "w") as out:
            json.dump({"device": torch.cuda.get_device_name(), "how": __doc__.split("\n\n")[1],
                       "calls": CALLS, "rounds": ROUNDS, "us_medians": found,
                       "cprofiles": profiles}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
