"""ALiBi benchmark: memory bound, so judged by bandwidth against a device-to-device copy of the
same bytes in the same run, and by time against torch eager doing the same math (the ratio is
reported against every torch formulation tried)."""

from __future__ import annotations

from ..ops.alibi import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiBackwardPlan,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    AlibiForwardPlan,
)
from .common import BenchRow, time_contestants, time_ms

FULL_SHAPE = dict(batch=8, heads=32, query_len=2048, key_len=2048)
QUICK_SHAPE = dict(batch=2, heads=8, query_len=512, key_len=512)


def _rows_for(shape: dict, element: str, reps: int) -> list[BenchRow]:
    import torch

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[element]
    b, h, q, k = shape["batch"], shape["heads"], shape["query_len"], shape["key_len"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand((b, h, q, k), device="cuda", dtype=dtype, generator=gen) * 2 - 1
    slopes = torch.rand((h,), device="cuda", dtype=torch.float32, generator=gen)
    dist = (torch.arange(k, device="cuda")[None, :] - torch.arange(q, device="cuda")[:, None])
    dist = dist.to(torch.float32)
    y = torch.empty_like(a)
    copy_ms = time_ms(lambda: y.copy_(a), reps)
    nbytes = a.numel() * a.element_size()
    copy_tbps = 2 * nbytes / copy_ms / 1e9

    def row(case: str, ours, moved: int, peers: dict) -> BenchRow:
        # Calls launch on torch's current stream, so a host-bound row can be captured.
        timings = time_contestants({"ours": ours, **peers}, reps)

        def figure(ms: float) -> str:
            tbps = moved / ms / 1e9
            return f"{tbps:.2f} TB/s, {tbps / copy_tbps:.1%} of copy"

        return timings.row("alibi", f"{case} {element} {b}x{h}x{q}x{k}", figure)

    rows = []
    forward = AlibiForwardPlan.select(AlibiForwardDescriptor(**shape, element=element))
    fwd_args = AlibiForwardArgs(a, slopes, y)
    rows.append(row("forward", lambda: forward.run(fwd_args), 2 * nbytes, {
                        "torch (a.float()+s*d).to": lambda: (
                            a.float() + slopes.view(1, h, 1, 1) * dist).to(dtype),
                        "torch a+(s*d).to": lambda: a + (slopes.view(1, h, 1, 1) * dist).to(dtype),
                    }))
    dy, d_in = a, y
    d_slopes = torch.empty((h,), device="cuda", dtype=torch.float32)
    slope_grad = {
        "torch (dy*d).sum": lambda: (dy.float() * dist).sum((0, 2, 3)),
        "torch einsum": lambda: torch.einsum("bhqk,qk->h", dy.float(), dist),
    }
    for need_input_grad in (True, False):
        desc = AlibiBackwardDescriptor(**shape, element=element, need_input_grad=need_input_grad)
        plan = AlibiBackwardPlan.select(desc)
        workspace = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
        args = AlibiBackwardArgs(dy, d_in if need_input_grad else None, d_slopes)
        def ours(plan=plan, args=args, ws=workspace) -> None:
            plan.run(args, workspace=ws)

        if need_input_grad:
            peers = {f"clone+{n}": (lambda f=f: (dy.clone(), f())) for n, f in slope_grad.items()}
            rows.append(row("backward dA+dslope", ours, 2 * nbytes, peers))
        else:
            rows.append(row("backward dslope only", ours, nbytes, slope_grad))
    rows.append(BenchRow("alibi", f"d2d copy {element}", copy_ms, f"{copy_tbps:.2f} TB/s"))
    return rows


def run(quick: bool = False) -> list[BenchRow]:
    shape = QUICK_SHAPE if quick else FULL_SHAPE
    reps = 5 if quick else 20
    return [r for element in ("f32", "bf16") for r in _rows_for(shape, element, reps)]
