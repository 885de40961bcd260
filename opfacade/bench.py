"""`opfacade bench`: each op against its peers in the same run, reported as ratios.

ALiBi is memory bound, so it is judged by achieved bandwidth against a device-to-device copy of
the same bytes measured in the same run, and by time against torch eager doing the same math
(torch is only a benchmark peer here; the ratio is against the fastest torch formulation).
Times are medians of CUDA-event timings after warm-up; inputs are random, never zeros.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .alibi import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiBackwardPlan,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    AlibiForwardPlan,
)

__all__ = ["run_bench"]

FULL_SHAPE = dict(batch=8, heads=32, query_len=2048, key_len=2048)
QUICK_SHAPE = dict(batch=2, heads=8, query_len=512, key_len=512)


@dataclass
class Row:
    case: str
    element: str
    ours_ms: float
    gbps: float
    copy_fraction: float
    torch_ms: float | None
    torch_best: str | None
    speedup_vs_torch: float | None


def _timer(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` on the legacy default stream, timed with CUDA events."""
    import cupy

    for _ in range(warmup):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record(cupy.cuda.Stream.null)
        fn()
        stop.record(cupy.cuda.Stream.null)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def _best(peers: dict[str, Callable[[], object]], reps: int) -> tuple[str, float]:
    timed = {name: _timer(fn, reps) for name, fn in peers.items()}
    name = min(timed, key=timed.get)
    return name, timed[name]


def _alibi_rows(shape: dict, element: str, reps: int) -> list[Row]:
    import torch

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[element]
    b, h, q, k = shape["batch"], shape["heads"], shape["query_len"], shape["key_len"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand((b, h, q, k), device="cuda", dtype=dtype, generator=gen) * 2 - 1
    slopes = torch.rand((h,), device="cuda", dtype=torch.float32, generator=gen)
    dist = (torch.arange(k, device="cuda")[None, :] - torch.arange(q, device="cuda")[:, None])
    dist = dist.to(torch.float32)
    y = torch.empty_like(a)
    copy_ms = _timer(lambda: y.copy_(a), reps)
    nbytes = a.numel() * a.element_size()
    copy_gbps = 2 * nbytes / copy_ms / 1e6
    rows = []

    def row(case: str, ours_ms: float, moved: int, peer: tuple[str, float] | None) -> Row:
        gbps = moved / ours_ms / 1e6
        return Row(case, element, ours_ms, gbps, gbps / copy_gbps,
                   peer[1] if peer else None, peer[0] if peer else None,
                   peer[1] / ours_ms if peer else None)

    forward = AlibiForwardPlan.select(AlibiForwardDescriptor(**shape, element=element))
    fwd_args = AlibiForwardArgs(a, slopes, y)
    bias = slopes.view(1, h, 1, 1) * dist
    fwd_peers = {
        "a + slopes*dist (f32 math)": lambda: (a.float() + slopes.view(1, h, 1, 1) * dist).to(
            dtype),
        "a + (slopes*dist).to(dtype)": lambda: a + (slopes.view(1, h, 1, 1) * dist).to(dtype),
    }
    rows.append(row("alibi forward", _timer(lambda: forward.run(fwd_args, stream=0), reps),
                    2 * nbytes, _best(fwd_peers, reps)))
    del bias

    dy = a
    d_in = y
    d_slopes = torch.empty((h,), device="cuda", dtype=torch.float32)
    for need_input_grad in (True, False):
        desc = AlibiBackwardDescriptor(**shape, element=element, need_input_grad=need_input_grad)
        plan = AlibiBackwardPlan.select(desc)
        workspace = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
        args = AlibiBackwardArgs(dy, d_in if need_input_grad else None, d_slopes)
        ours = _timer(lambda plan=plan, args=args, workspace=workspace: plan.run(
            args, workspace=workspace, stream=0), reps)
        slope_grad = {
            "(dy.float()*dist).sum": lambda: (dy.float() * dist).sum((0, 2, 3)),
            "einsum(dy.float(), dist)": lambda: torch.einsum("bhqk,qk->h", dy.float(), dist),
        }
        if need_input_grad:
            peers = {f"clone + {n}": (lambda f=f: (dy.clone(), f())) for n, f in slope_grad.items()}
            case, moved = "alibi backward (dA + dslope)", 2 * nbytes
        else:
            peers = slope_grad
            case, moved = "alibi backward (dslope only)", nbytes
        rows.append(row(case, ours, moved, _best(peers, reps)))
    rows.append(Row("device-to-device copy", element, copy_ms, copy_gbps, 1.0, None, None, None))
    return rows


def _print(rows: list[Row]) -> None:
    header = f"{'case':32} {'elem':5} {'ours ms':>9} {'GB/s':>8} {'of copy':>8} " \
             f"{'torch ms':>9} {'vs torch':>9}  torch best"
    print(header)
    for r in rows:
        torch_ms = f"{r.torch_ms:9.3f}" if r.torch_ms else f"{'-':>9}"
        ratio = f"{r.speedup_vs_torch:8.2f}x" if r.speedup_vs_torch else f"{'-':>9}"
        print(f"{r.case:32} {r.element:5} {r.ours_ms:9.3f} {r.gbps:8.0f} "
              f"{r.copy_fraction:8.1%} {torch_ms} {ratio}  {r.torch_best or ''}")


def run_bench(json_path: str | None = None, quick: bool = False) -> list[Row]:
    import cupy

    shape = QUICK_SHAPE if quick else FULL_SHAPE
    reps = 5 if quick else 20
    device = cupy.cuda.runtime.getDevice()
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
    print(f"opfacade bench on {name.decode() if isinstance(name, bytes) else name}, "
          f"ALiBi {shape}")
    rows = [r for element in ("f32", "bf16") for r in _alibi_rows(shape, element, reps)]
    _print(rows)
    if json_path:
        with open(json_path, "w") as out:
            json.dump({"gpu": str(name), "shape": shape, "rows": [asdict(r) for r in rows]}, out,
                      indent=2)
    return rows
