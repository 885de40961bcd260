"""GEMM + bias + GELU in bf16 against torch, forward and backward, plus host overhead.

GELU(tanh), fused in cuBLASLt's epilogue: forward peers ``torch._addmm_activation(bias, x, W^T,
use_gelu=True)`` (torch's own cuBLASLt GELU_BIAS path) and the unfused ``gelu(x @ W^T + bias)``.
GELU(erf), torch's default, which cuBLASLt has no epilogue for (our GEMM, then a separate pass):
forward peers ``gelu(addmm(bias, x, W^T))`` (torch's best: bias fused in cuBLAS, then its gelu
kernel) and the unfused form. Backward peer: torch autograd of ``gelu(linear(x, W, b))`` (gelu
backward, then dx, dW and the bias sum), timed alone on a kept graph. The weight is nn.Linear's
[N, K] ("nk"), as torch users hold it. The host-overhead row times ``plan.run`` on a cached plan
(workspace and stream given) against a bare cublasLtMatmul through the nvmath binding on the same
prepared descriptor, on a tiny problem; once with torch tensors and once with tensors wrapped
beforehand (TensorViews), which shows what the argument checks cost.
"""

from __future__ import annotations

from ..contracts.linear import ACTIVATIONS, padded_row
from ..ops.linear import (
    LinearArgs,
    LinearBackwardArgs,
    LinearDescriptor,
    LinearForwardPlan,
)
from .common import BenchRow, Contest, host_us_interleaved, time_contestants

SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (16384, 4096, 1024), (64, 8192, 8192))
ERF_SHAPES = ((4096, 4096, 4096), (16384, 4096, 1024))
QUICK_SHAPES = ((1024, 1024, 1024), (2048, 1024, 512))
# How each GELU is named in the rows, and torch's name for it.
_LABEL = {"gelu_tanh": "gelu", "gelu_erf": "gelu(erf)"}
_APPROXIMATE = {"gelu_tanh": "tanh", "gelu_erf": "none"}


def _tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.0f} TFLOP/s"


def _inputs(torch, m: int, n: int, k: int):
    """x [M, K], the weight [N, K] and the bias, uniform in [-1, 1), and a maker of more."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def uniform(*shape):
        return (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)

    return uniform(m, k), uniform(n, k), uniform(n), uniform


def forward_contest(m: int, n: int, k: int, activation: str = "gelu_tanh") -> Contest:
    """Our forward against torch's best form of it and the unfused one; ours writes y."""
    import torch
    import torch.nn.functional as F

    x, w, b, _ = _inputs(torch, m, n, k)
    approximate = _APPROXIMATE[activation]
    plan = LinearForwardPlan.select(LinearDescriptor(m=m, n=n, k=k, element="bf16",
                                                     activation=activation))
    y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    args = LinearArgs(x, w, b, out=y)
    wt = w.t()
    if ACTIVATIONS[activation].fused:  # torch's own cuBLASLt GELU_BIAS path is the peer
        best = {"torch._addmm_activation": lambda: torch._addmm_activation(b, x, wt,
                                                                           use_gelu=True)}
    else:
        best = {"torch gelu(addmm)": lambda: F.gelu(torch.addmm(b, x, wt))}
    # Every call launches on torch's current stream (stream=None), so that a row with a
    # host-bound contestant can be captured in a CUDA graph.
    return Contest({
        "ours": lambda: plan.run(args, workspace=ws),
        **best,
        "torch unfused": lambda: F.gelu(torch.matmul(x, wt) + b, approximate=approximate),
    }, outputs=(y,), notes=f"{plan.sku.id}; {plan.report.chosen.detail}")


def backward_contest(m: int, n: int, k: int, activation: str = "gelu_tanh") -> Contest:
    """Our backward, from the aux our training forward saves, against torch autograd and
    torch's two GEMMs alone; ours writes dx, dW and dbias."""
    import torch
    import torch.nn.functional as F

    x, w, b, uniform = _inputs(torch, m, n, k)
    approximate = _APPROXIMATE[activation]
    pair = LinearForwardPlan.select_for_training(LinearDescriptor(
        m=m, n=n, k=k, element="bf16", activation=activation, save_aux=True))
    y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    aux = torch.empty((m, padded_row(n)), device="cuda", dtype=torch.bfloat16)[:, :n]
    ws = torch.empty(max(pair.workspace_size, 1), device="cuda", dtype=torch.uint8)
    pair.forward.run(LinearArgs(x, w, b, out=y, aux=aux), workspace=ws, stream=0)
    dy = uniform(m, n)
    grads = (torch.empty_like(x), torch.empty_like(w), torch.empty_like(b))
    bargs = LinearBackwardArgs(dy, x, w, aux, *grads)
    backward = pair.backward

    def autograd_on(stream):
        # Autograd runs each backward op on its forward op's stream, and syncs with the stream
        # each leaf's gradient node was made on: a captured backward needs its own leaves and
        # its forward made on the capture stream (leaves shared with the burst's forward made
        # the capture fail: "would make the legacy stream depend on a capturing stream").
        leaves = tuple(t.detach().clone().requires_grad_() for t in (x, w, b))
        with torch.cuda.stream(stream):
            out = F.gelu(F.linear(*leaves), approximate=approximate)
        return lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)

    return Contest({
        "ours": lambda: backward.run(bargs, workspace=ws),
        "torch autograd": autograd_on(torch.cuda.current_stream()),
        # The floor of any backward that takes dY as an input: torch's two GEMMs, nothing else.
        "torch dx+dW GEMMs only": lambda: (torch.mm(dy, w), torch.mm(dy.t(), x)),
    }, makers={"torch autograd": autograd_on}, outputs=grads,
        notes=f"{backward.sku.id}: {backward.report.chosen.detail}")


def _case_rows(m: int, n: int, k: int, reps: int, activation: str = "gelu_tanh"
               ) -> list[BenchRow]:
    label, flops = _LABEL[activation], 2.0 * m * n * k
    contest = forward_contest(m, n, k, activation)
    timings = time_contestants(contest.fns, reps, makers=contest.makers)
    rows = [timings.row("linear", f"fwd bias+{label} bf16 {m}x{n}x{k}",
                        lambda ms: _tflops(flops, ms), notes=contest.notes)]
    del contest  # its tensors, before the backward's are made
    contest = backward_contest(m, n, k, activation)
    timings = time_contestants(contest.fns, reps, makers=contest.makers)
    rows.append(timings.row("linear", f"bwd d{label}+dbias+dx+dW bf16 {m}x{n}x{k}",
                            lambda ms: _tflops(2 * flops, ms), notes=contest.notes))
    return rows


def _host_overhead_row(repeats: int) -> BenchRow:
    """Host microseconds per call: plan.run on a cached plan vs a bare cublasLtMatmul."""
    import torch

    from .._backends.cublaslt import library
    from .._internal.sku import Workspace
    from .._internal.tensors import wrap

    m = n = k = 64
    x = torch.rand((m, k), device="cuda").to(torch.bfloat16)
    w = torch.rand((n, k), device="cuda").to(torch.bfloat16)
    b = torch.rand((n,), device="cuda").to(torch.bfloat16)
    y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    desc = LinearDescriptor(m=m, n=n, k=k, element="bf16", activation="gelu_tanh")
    plan = LinearForwardPlan.cached(desc)
    buffer = torch.empty(max(plan.workspace_size, 256), device="cuda", dtype=torch.uint8)
    ws = Workspace(buffer.data_ptr(), buffer.numel(), x.device.index, buffer)
    stream = torch.cuda.current_stream().cuda_stream
    args = LinearArgs(x, w, b, out=y)
    plan.run(args, workspace=ws, stream=stream)

    low = 256  # the recipe run() picks: same strides and pointer alignment
    for t in (x, w, b, y):
        low |= t.data_ptr()
    layout = ((x.stride(), w.stride(), y.stride(), None, None), low & -low)
    recipe = plan._live_impl()._recipes.get(desc, x.device.index, layout, ws.size)
    matmul, lt = recipe.matmul, library.binding()
    lt_handle = library.handle(x.device.index)
    # The raw calls run on a descriptor of the recipe's problem pointing its bias at b, made once
    # (as every bound call of ours has one of its own).
    own = matmul.own_desc(bias=b.data_ptr())
    raw_args = (lt_handle, own.desc, matmul.alpha_ptr, w.data_ptr(), matmul.a_layout,
                x.data_ptr(), matmul.b_layout, matmul.beta_ptr, y.data_ptr(), matmul.c_layout,
                y.data_ptr(), matmul.d_layout, matmul._algo_ptr, ws.ptr, ws.size, stream)

    # What a torch user's own raw call pays: the pointers read from the tensors on each call.
    head, tail = raw_args[:2], raw_args[-1:]
    a_layout, b_layout, c_layout, d_layout = (matmul.a_layout, matmul.b_layout, matmul.c_layout,
                                              matmul.d_layout)
    alpha, beta, algo = matmul.alpha_ptr, matmul.beta_ptr, matmul._algo_ptr
    views = LinearArgs(wrap(x, "x"), wrap(w, "weight"), wrap(b, "bias"), out=wrap(y, "out"))
    # Batches of 200 calls never fill the launch queue (when it is full, the host waits for the
    # GPU and the figure would be the kernels' time).
    us = host_us_interleaved({
        "raw": lambda: lt.matmul(*raw_args),
        "raw_read": lambda: lt.matmul(
            *head, alpha, w.data_ptr(), a_layout, x.data_ptr(), b_layout, beta, y.data_ptr(),
            c_layout, y.data_ptr(), d_layout, algo, buffer.data_ptr(), ws.size, *tail),
        "run": lambda: plan.run(args, workspace=buffer, stream=stream),
        "run_views": lambda: plan.run(views, workspace=ws, stream=stream),
        "prepared": plan.prepare(args, workspace=ws, stream=stream),
        # Where run()'s time goes: finding the checked launch without calling it.
        "lookup": lambda: plan._calls.launch_for(args, buffer, stream),
    }, calls=200, rounds=repeats)
    raw_us, raw_read_us, ours_us = us["raw"], us["raw_read"], us["run"]
    prepared_us, wrapped_us = us["prepared"], us["run_views"]
    return BenchRow("linear", "host us/call, cached plan, 64^3 bf16", ours_us / 1000,
                    f"run() {ours_us - raw_us:+.2f} us over raw {raw_us:.2f} us "
                    f"({ours_us - raw_read_us:+.2f} us over raw reading data_ptr()); "
                    f"prepared {prepared_us - raw_us:+.2f} us; memo lookup alone "
                    f"{us['lookup']:.2f} us",
                    {"raw cublasLtMatmul": raw_us / 1000,
                     "raw reading data_ptr()": raw_read_us / 1000,
                     "prepared": prepared_us / 1000,
                     "run() on pre-wrapped views": wrapped_us / 1000})


def run(quick: bool = False) -> list[BenchRow]:
    reps = 5 if quick else 30
    rows = [r for shape in (QUICK_SHAPES if quick else SHAPES) for r in _case_rows(*shape, reps)]
    rows += [r for shape in (QUICK_SHAPES[:1] if quick else ERF_SHAPES)
             for r in _case_rows(*shape, reps, activation="gelu_erf")]
    rows.append(_host_overhead_row(5 if quick else 25))
    return rows
