"""SDPA benchmark: our cuDNN plans against torch SDPA (cuDNN and flash backends) and against the
same cuDNN graph driven directly through cudnn-frontend, in one run, on the same tensors.

Figures are TFLOP/s counting 4*B*Hq*Sq*Skv*D for the forward (halved when causal) and 2.5x that
for the backward. The forward is timed as inference (no stats; torch under no_grad); the
backward from a forward's saved stats, with torch timed through autograd. The deterministic
backward is reported beside the default one with both workspaces. A last row measures host time
per call on a tiny problem: plan.run on a cached plan against the raw graph.execute call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._internal.sku import Workspace
from .._internal.tensors import wrap
from ..ops.sdpa import (
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaBackwardPlan,
    SdpaDescriptor,
    SdpaForwardPlan,
)
from ..types import PlanPreference
from .common import BenchRow, Contest, host_us_interleaved, time_contestants

# (head_dim, batch, heads_q, heads_kv, seq)
FULL_CASES = tuple(
    (d, b, h, h, s) for d in (128, 64) for (b, h, s) in ((2, 16, 8192), (8, 16, 2048),
                                                          (4, 32, 4096))
) + ((128, 4, 32, 8, 4096), (64, 4, 32, 8, 4096))
QUICK_CASES = ((128, 2, 8, 8, 1024), (64, 2, 8, 8, 1024), (128, 2, 8, 2, 1024))
TINY = (64, 1, 1, 1, 64)


def _flops(b: int, hq: int, s: int, d: int, causal: bool, backward: bool) -> float:
    flops = 4.0 * b * hq * s * s * d * (0.5 if causal else 1.0)
    return flops * (2.5 if backward else 1.0)


def _tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.0f} TFLOP/s"


class _Raw:
    """The same SDPA graph built directly with cudnn.pygraph, executed as its users do."""

    def __init__(self, torch, handle):
        import cudnn

        self.cudnn, self.torch, self.handle = cudnn, torch, handle

    def _graph(self):
        cudnn = self.cudnn
        return cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16,
                             intermediate_data_type=cudnn.data_type.FLOAT,
                             compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)

    def _finish(self, g, pack):
        cudnn = self.cudnn
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        workspace = self.torch.empty(g.get_workspace_size(), dtype=self.torch.uint8,
                                     device="cuda")
        cudnn.set_stream(self.handle, self.torch.cuda.current_stream().cuda_stream)
        return (lambda: g.execute(pack, workspace, handle=self.handle)), g, workspace

    def on_stream(self, call):
        """A maker (``common.Contest``) of ``call`` for a capture stream: each call binds the
        handle to that stream, then back to torch's default stream, where the bursts time it."""
        cudnn, torch, handle = self.cudnn, self.torch, self.handle

        def make(stream):
            def bound() -> None:
                cudnn.set_stream(handle, stream.cuda_stream)
                try:
                    call()
                finally:
                    cudnn.set_stream(handle, torch.cuda.default_stream().cuda_stream)

            return bound

        return make

    def _mask(self, causal: bool) -> dict:
        options = {"diagonal_alignment": self.cudnn.diagonal_alignment.TOP_LEFT}
        if causal:
            options["diagonal_band_right_bound"] = 0
        return options

    def forward(self, q, k, v, o, stats, scale: float, causal: bool):
        g = self._graph()
        qt, kt, vt = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        ot, st = g.sdpa(qt, kt, vt, name="sdpa", attn_scale=scale,
                        generate_stats=stats is not None, **self._mask(causal))
        ot.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride()))
        pack = {qt: q, kt: k, vt: v, ot: o}
        if stats is not None:
            st.set_output(True).set_data_type(self.cudnn.data_type.FLOAT)
            st.set_dim(list(stats.shape)).set_stride(list(stats.stride()))
            pack[st] = stats
        return self._finish(g, pack)

    def backward(self, q, k, v, o, d_o, stats, dq, dk, dv, scale: float, causal: bool,
                 deterministic: bool):
        g = self._graph()
        ts = [g.tensor_like(t) for t in (q, k, v, o, d_o, stats)]
        dqt, dkt, dvt = g.sdpa_backward(*ts, name="sdpa_backward", attn_scale=scale,
                                        use_deterministic_algorithm=deterministic,
                                        **self._mask(causal))
        for tensor, data in ((dqt, dq), (dkt, dk), (dvt, dv)):
            tensor.set_output(True).set_dim(list(data.shape)).set_stride(list(data.stride()))
        pack = dict(zip(ts, (q, k, v, o, d_o, stats), strict=True))
        pack.update({dqt: dq, dkt: dk, dvt: dv})
        return self._finish(g, pack)


@dataclass
class Problem:
    """One case's tensors: the inputs, the forward's out and stats, the gradients."""

    case: tuple
    causal: bool
    q: object
    k: object
    v: object
    d_o: object
    o: object
    stats: object
    dq: object
    dk: object
    dv: object

    @property
    def fields(self) -> dict:
        d, b, hq, hkv, s = self.case
        return dict(batch=b, heads_q=hq, heads_kv=hkv, seq_q=s, seq_kv=s, head_dim=d,
                    element="bf16", causal="top_left" if self.causal else None)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.case[0])

    @property
    def label(self) -> str:
        d, b, hq, hkv, s = self.case
        return f"bf16 d{d} B{b} H{hq}/{hkv} S{s}{' causal' if self.causal else ''}"


def problem(torch, case: tuple, causal: bool) -> Problem:
    """Random inputs in [-1, 1) for ``case`` (head_dim, batch, heads_q, heads_kv, seq)."""
    d, b, hq, hkv, s = case
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.rand(shape, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1

    q, k, v, d_o = rand(b, hq, s, d), rand(b, hkv, s, d), rand(b, hkv, s, d), rand(b, hq, s, d)
    return Problem(case, causal, q, k, v, d_o, torch.empty_like(q),
                   torch.empty(b, hq, s, 1, device="cuda", dtype=torch.float32),
                   torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))


def torch_peers(torch, p: Problem) -> tuple[dict, list[str]]:
    """{peer: (forward call, backward call, backward maker)} for torch's cuDNN and flash SDPA
    backends, and notes on the backends that decline the problem."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    extra = {"enable_gqa": True} if p.case[2] != p.case[3] else {}
    peers, notes = {}, []
    for name, backend in (("torch cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("torch flash", SDPBackend.FLASH_ATTENTION)):
        def forward(backend=backend) -> None:
            with sdpa_kernel(backend), torch.no_grad():
                sdpa(p.q, p.k, p.v, is_causal=p.causal, **extra)

        def backward_on(stream, backend=backend):
            # Autograd runs the backward on the forward's stream: a captured backward needs its
            # forward made on the capture stream.
            leaves = [t.detach().requires_grad_() for t in (p.q, p.k, p.v)]
            with torch.cuda.stream(stream), sdpa_kernel(backend):  # the forward fixes the kernel
                out = sdpa(*leaves, is_causal=p.causal, **extra)
            return lambda: torch.autograd.grad(out, leaves, p.d_o, retain_graph=True)

        try:
            forward()
            backward = backward_on(torch.cuda.current_stream())
        except RuntimeError as error:  # the backend declines this problem
            notes.append(f"{name}: {str(error).splitlines()[0][:80]}")
            continue
        peers[name] = (forward, backward, backward_on)
    return peers, notes


def _workspace(torch, plan):
    return torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")


def forward_contest(torch, raw: _Raw, p: Problem, peers: dict) -> Contest:
    """Our inference forward against the raw graph and torch's backends; ours writes o."""
    forward = SdpaForwardPlan.select(SdpaDescriptor(**p.fields), device=0)
    ws, args = _workspace(torch, forward), SdpaArgs(p.q, p.k, p.v, p.o)
    raw_fwd, *_ = raw.forward(p.q, p.k, p.v, p.o, None, p.scale, p.causal)
    # Ours launch on torch's current stream, so a host-bound row can be captured.
    return Contest({"ours": lambda: forward.run(args, workspace=ws), "cudnn graph": raw_fwd,
                    **{name: calls[0] for name, calls in peers.items()}},
                   makers={"cudnn graph": raw.on_stream(raw_fwd)}, outputs=(p.o,))


def backward_contest(torch, raw: _Raw, p: Problem, peers: dict,
                     deterministic: bool = False) -> Contest:
    """Our backward from a forward's out and stats (made here) against the raw graph and, for the
    default backward, torch's backends through autograd; ours writes dq, dk and dv."""
    stats_plan = SdpaForwardPlan.select(SdpaDescriptor(**p.fields, save_stats=True), device=0)
    stats_plan.run(SdpaArgs(p.q, p.k, p.v, p.o, p.stats), workspace=_workspace(torch, stats_plan),
                   stream=0)
    plan = SdpaBackwardPlan.select(SdpaBackwardDescriptor(**p.fields),
                                   PlanPreference(deterministic=deterministic), device=0)
    ws = _workspace(torch, plan)
    args = SdpaBackwardArgs(p.q, p.k, p.v, p.o, p.d_o, p.stats, p.dq, p.dk, p.dv)
    raw_bwd, *_ = raw.backward(p.q, p.k, p.v, p.o, p.d_o, p.stats, p.dq, p.dk, p.dv, p.scale,
                               p.causal, deterministic)
    fns = {"ours": lambda: plan.run(args, workspace=ws), "cudnn graph": raw_bwd}
    makers = {"cudnn graph": raw.on_stream(raw_bwd)}
    if not deterministic:
        fns.update({name: calls[1] for name, calls in peers.items()})
        makers.update({name: calls[2] for name, calls in peers.items()})
    return Contest(fns, makers, outputs=(p.dq, p.dk, p.dv),
                   notes=f"workspace {plan.workspace_size / 2**20:.1f} MiB")


def _case_rows(torch, raw: _Raw, case: tuple, causal: bool, reps: int) -> list[BenchRow]:
    d, b, hq, _, s = case
    p = problem(torch, case, causal)
    peers, notes = torch_peers(torch, p)
    contest = forward_contest(torch, raw, p, peers)
    timings = time_contestants(contest.fns, reps, makers=contest.makers)
    flops = _flops(b, hq, s, d, causal, backward=False)
    rows = [timings.row("sdpa_forward", p.label, lambda ms: _tflops(flops, ms),
                        "; ".join(notes))]
    flops = _flops(b, hq, s, d, causal, backward=True)
    contest = backward_contest(torch, raw, p, peers)
    timings = time_contestants(contest.fns, reps, makers=contest.makers)
    rows.append(timings.row("sdpa_backward", p.label, lambda ms: _tflops(flops, ms),
                            contest.notes))
    default = contest.fns["ours"]
    del contest  # the raw graph's workspace, before the deterministic path's
    contest = backward_contest(torch, raw, p, peers, deterministic=True)
    timings = time_contestants({**contest.fns, "ours default": default}, reps,
                               makers=contest.makers)
    rows.append(timings.row("sdpa_backward det", p.label, lambda ms: _tflops(flops, ms),
                            contest.notes))
    return rows  # the caller empties torch's cache of the deterministic path's large buffers


def _host_rows(torch, raw: _Raw, calls: int = 2000) -> list[BenchRow]:
    """Host microseconds per call on a tiny problem, forward and backward: plan.run on a cached
    plan against the raw graph.execute on the same tensors (and a prepared call, and run() on
    views wrapped ahead, as a framework integration that caches its views would)."""
    d, b, hq, hkv, s = TINY
    scale = 1.0 / math.sqrt(d)
    q = torch.rand(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
    k, v, o, d_o = (torch.rand_like(q) for _ in range(4))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    stats = torch.empty(b, hq, s, 1, device="cuda", dtype=torch.float32)
    fields = dict(batch=b, heads_q=hq, heads_kv=hkv, seq_q=s, seq_kv=s, head_dim=d,
                  element="bf16")
    forward = SdpaForwardPlan.cached(SdpaDescriptor(**fields, save_stats=True), device=0)
    backward = SdpaBackwardPlan.cached(SdpaBackwardDescriptor(**fields), device=0)
    cases = (
        ("forward", forward, SdpaArgs(q, k, v, o, stats),
         raw.forward(q, k, v, o, stats, scale, False)[0]),
        ("backward", backward, SdpaBackwardArgs(q, k, v, o, d_o, stats, dq, dk, dv),
         raw.backward(q, k, v, o, d_o, stats, dq, dk, dv, scale, False, False)[0]),
    )
    rows = []
    for direction, plan, args, raw_call in cases:
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        views = type(args)(**{name: None if t is None else wrap(t, name)
                              for name, t in vars(args).items()})
        wrapped_ws = Workspace(ws.data_ptr(), ws.numel(), 0, ws)
        calls_by_name = {
            "raw": raw_call,
            "ours": lambda plan=plan, args=args, ws=ws: plan.run(args, workspace=ws, stream=0),
            "ours_wrapped": lambda plan=plan, views=views, ws=wrapped_ws: plan.run(
                views, workspace=ws, stream=0),
            "prepared": plan.prepare(args, workspace=ws, stream=0),
        }
        us = host_us_interleaved(calls_by_name, calls)
        rows.append(BenchRow(
            "sdpa host time", f"{direction} bf16 d{d} B{b} H{hq} S{s}, per call",
            us["ours"] / 1e3,
            f"run() {us['ours'] - us['raw']:+.1f} us, prepared {us['prepared'] - us['raw']:+.1f}"
            f" us vs raw {us['raw']:.1f} us",
            {"cudnn graph.execute": us["raw"] / 1e3, "prepared": us["prepared"] / 1e3,
             "run() on pre-wrapped views": us["ours_wrapped"] / 1e3}))
    return rows


def run(quick: bool = False) -> list[BenchRow]:
    import cudnn
    import torch

    reps = 5 if quick else 30
    handle = cudnn.create_handle()
    raw = _Raw(torch, handle)
    rows = []
    for case in QUICK_CASES if quick else FULL_CASES:
        for causal in (False, True):
            rows += _case_rows(torch, raw, case, causal, reps)
            torch.cuda.empty_cache()
    rows += _host_rows(torch, raw, calls=200 if quick else 2000)
    return rows
