"""varlen_attention benchmark (issue 12 section 7): packed attention, forward and backward,
against its peers in one run on the same values. Every row's op starts with varlen_attention;
the peers carry the names the issue gives them.

bf16: 16 sequences with lengths drawn uniformly from [512, 8192] by
``numpy.random.default_rng(LENGTHS_SEED)``, Hq 32, Hkv 8, d 128, causal. Ours are the cuDNN
SKUs selected for ``desc.bucketed()``, so what the bucket costs (a graph batch and max length
above the call's) is in our time. Peers:
- "cudnn graph": the raw ragged (THD) graph at the same bucket, its offsets and lengths made
  ahead (target: ours at 0.97x of its speed or better);
- "torch varlen_attn": ``torch.nn.attention.varlen.varlen_attn`` (target 1.5x);
- "torch sdpa loop": torch's scaled_dot_product_attention once per sequence.
The deterministic backward has a row of its own ("varlen_attention_backward det") against the
raw deterministic graph and our default backward, with the workspaces in its notes.

f32: dense B4 H16 S2048 at d 64 and d 128 (plain and causal; ours are the sdpa f32 SKUs), and
the varlen set above in f32 (ours the varlen f32 SKUs, bucketed alike). Peers:
- "torch sdpa f32": scaled_dot_product_attention held to its memory-efficient backend, dense,
  or once per sequence for the varlen set (target 1.0x forward and backward);
- "cudnn f32": cuDNN's f32 forward graph, dense or ragged (target 2x).

Forward rows time the training forward of ours and of the "cudnn graph" (both write the
log-sum-exp the backward reads); cuDNN's f32 graph and torch's forwards run as inference (torch
under no_grad), which can only favour them. Backward rows start from saved forwards, torch's
through autograd on a kept graph. Figures count only unmasked work: a causal sequence of n
tokens has n(n+1)/2 (query, key) pairs, a forward 4*d FLOPs per pair and query head, a
backward 2.5 times that. Notes carry our SKU and workspace bytes, and why a peer is missing
("<peer>: declined: <first line of its error>"); one peer failing never stops the bench.
The problems and the peers are built in ``varlen_peers.py``; this module makes the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..errors import Unsupported
from ..ops.sdpa import SdpaArgs, SdpaBackwardArgs, SdpaBackwardDescriptor, SdpaDescriptor
from ..ops.varlen_attention import (
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from ..plan import Plan
from ..types import PlanPreference
from . import graph_timing
from .common import (
    BenchRow,
    Timings,
    host_us_interleaved,
    suspects,
    time_contestants,
    time_interleaved,
)
from .cudnn_peers import RawCudnn, first_line
from .sustained import sustained_note, time_sustained
from .varlen_peers import (
    Contestant,
    Packed,
    VarlenSet,
    cudnn_dense,
    cudnn_ragged,
    gather,
    packed,
    ragged_peer,
    sdpa_peer,
    torch_varlen,
)

# Seed 12, the number: every run packs the same 16 lengths (65,499 tokens, the longest
# 7,985: a bucket of 16 sequences of 8,192).
LENGTHS_SEED = 12
FULL_SET = VarlenSet(16, 512, 8192, 32, 8, 128, LENGTHS_SEED)
QUICK_SET = VarlenSet(3, 64, 256, 4, 2, 64, LENGTHS_SEED)
# Dense f32 problems: (batch, heads, seq, head_dim).
FULL_DENSE = ((4, 16, 2048, 64), (4, 16, 2048, 128))
QUICK_DENSE = ((1, 4, 256, 64),)
# Rounds of bursts per row; the f32 varlen set runs ~0.1 s a forward and more a backward.
REPS, F32_VARLEN_REPS, QUICK_REPS = 15, 5, 5
# A row whose every call takes this long cannot be host-bound (a host issues any call here in
# a few milliseconds at most): its host time is read from single calls rather than the six
# batches of 20 calls a contestant that ``time_contestants`` times, a minute at ~0.5 s a call.
LONG_CALL_MS = 10.0
CUDNN = PlanPreference(backends={"cudnn"})
NVRTC = PlanPreference(backends={"nvrtc"})


def _causal_pairs(n: int) -> float:
    return n * (n + 1) / 2


def _tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.1f} TFLOP/s"


def _workspace(torch, nbytes: int):
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")


def _plan_note(plan: Plan) -> str:
    return f"ours {plan.sku.id}, workspace {plan.workspace_size} B"


# ----------------------------------------------------------------------------- ours


class OurVarlen:
    """Our varlen plans for a packed problem, selected for its bucket: the forward writes out
    and lse, each backward the gradients from them. Raises Unsupported where no SKU serves."""

    def __init__(self, torch, p: Packed, element: str, pref: PlanPreference):
        self.torch, self.p, self.pref = torch, p, pref
        fields = p.fields(element)
        self.forward_plan = Plan.select(
            VarlenAttentionDescriptor(**fields, save_lse=True).bucketed(), pref)
        self.backward_desc = VarlenAttentionBackwardDescriptor(**fields).bucketed()
        self.backward_plan = Plan.select(self.backward_desc, pref)
        tokens = p.q.shape[0]
        self.out = torch.empty_like(p.q)
        self.lse = torch.empty((p.spec.heads_q, tokens), dtype=torch.float32, device="cuda")
        self.grads = [torch.empty_like(t) for t in (p.q, p.k, p.v)]

    def _args(self):
        p = self.p
        return (VarlenAttentionArgs(p.q, p.k, p.v, p.cu, p.cu, self.out, self.lse),
                VarlenAttentionBackwardArgs(p.q, p.k, p.v, self.out, p.d_out, self.lse, p.cu,
                                            p.cu, *self.grads))

    def contestant(self) -> Contestant:
        """Forward and default backward (the forward run once: the backward reads its lse)."""
        fwd_args, bwd_args = self._args()
        fwd_ws = _workspace(self.torch, self.forward_plan.workspace_size)
        bwd_ws = _workspace(self.torch, self.backward_plan.workspace_size)
        forward, backward = self.forward_plan, self.backward_plan
        forward.run(fwd_args, workspace=fwd_ws)
        return Contestant(lambda: forward.run(fwd_args, workspace=fwd_ws),
                          lambda: backward.run(bwd_args, workspace=bwd_ws),
                          forward_note=_plan_note(forward), backward_note=_plan_note(backward))

    def deterministic(self) -> Plan:
        return Plan.select(self.backward_desc,
                           PlanPreference(backends=self.pref.backends, deterministic=True))

    def deterministic_call(self, plan: Plan, workspace) -> Callable[[], None]:
        """``plan`` (the deterministic backward) on ``workspace``, which it may share."""
        _, bwd_args = self._args()
        return lambda: plan.run(bwd_args, workspace=workspace)


def _our_dense(torch, fields: dict, q, k, v, d_out) -> Contestant:
    """Our f32 sdpa forward (saving stats) and backward; raises Unsupported without a SKU."""
    forward = Plan.select(SdpaDescriptor(**fields, save_stats=True), NVRTC)
    backward = Plan.select(SdpaBackwardDescriptor(**fields), NVRTC)
    out = torch.empty_like(q)
    stats = torch.empty((*q.shape[:3], 1), dtype=torch.float32, device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    ws = _workspace(torch, max(forward.workspace_size, backward.workspace_size))
    fwd_args = SdpaArgs(q, k, v, out, stats)
    bwd_args = SdpaBackwardArgs(q, k, v, out, d_out, stats, *grads)
    forward.run(fwd_args, workspace=ws)
    return Contestant(lambda: forward.run(fwd_args, workspace=ws),
                      lambda: backward.run(bwd_args, workspace=ws),
                      forward_note=_plan_note(forward), backward_note=_plan_note(backward))


def _ours(build: Callable[[], object], notes: list[str]):
    """What ``build`` makes, or None with the reason in ``notes`` when no SKU serves (the row
    still times the peers). Any other error is ours to fix and stops the bench."""
    try:
        return build()
    except Unsupported as error:
        notes.append(f"ours: no SKU: {first_line(error)}")
        return None


# ----------------------------------------------------------------------------- rows


def _timings(fns: dict[str, Callable[[], object]], reps: int,
             makers: dict[str, graph_timing.Maker]) -> Timings:
    """``time_contestants``, except where a first round shows every call taking LONG_CALL_MS
    or more: then bursts, and host time from single calls (a host-bound contestant found there
    after all gets the full judgement)."""
    first = time_interleaved(fns, reps=1, warmup=1)
    if min(first.values()) < LONG_CALL_MS:
        return time_contestants(fns, reps, makers=makers)
    gpu = time_interleaved(fns, reps, warmup=0)
    host = {name: us / 1e3 for name, us in host_us_interleaved(fns, 1, rounds=3).items()}
    if suspects(gpu, host):
        return time_contestants(fns, reps, makers=makers)
    return Timings(gpu, host, {}, [])


def _row(op: str, case: str, fns: dict[str, Callable[[], object]],
         makers: dict[str, graph_timing.Maker], reps: int, flops: float, notes: list[str],
         sustained: bool = False) -> BenchRow:
    """One row: ours against the peers in ``fns``; without ours (no SKU), the peers alone, with
    ours_ms NaN and the fastest peer's figure. ``sustained``: each contestant also alone, back to
    back (``_bench/sustained.py``; the f32 rows, whose kernels meet the power cap)."""
    note = "; ".join(n for n in notes if n)
    if not fns:
        return BenchRow(op, case, math.nan, "nothing ran", notes=note)
    timings = _timings(fns, reps, makers)
    if "ours" in fns:
        row = timings.row(op, case, lambda ms: _tflops(flops, ms), note)
        if sustained:
            alone = time_sustained(fns)
            row.sustained_ms = {name: r.ms for name, r in alone.items()}
            row.notes = "; ".join(filter(None, (row.notes, sustained_note(alone))))
        return row
    best = min(timings.gpu_ms, key=timings.gpu_ms.get)
    return BenchRow(op, case, math.nan, f"no ours; {best} {_tflops(flops, timings.gpu_ms[best])}",
                    dict(timings.gpu_ms), "; ".join(filter(None, (note, timings.graph_notes))),
                    host_ms=dict(timings.host_ms), graph_ms=dict(timings.graph_ms),
                    host_bound=list(timings.host_bound))


def _training_rows(case: str, contestants: dict[str, Contestant], reps: int, flops: float,
                   notes: list[str], sustained: bool = False) -> list[BenchRow]:
    """The forward row (``flops`` of work) and the backward row (2.5 times that) of the
    contestants that have each; ``sustained`` as ``_row``'s."""
    backward = {n: c for n, c in contestants.items() if c.backward is not None}
    return [
        _row("varlen_attention_forward", case, {n: c.forward for n, c in contestants.items()},
             {}, reps, flops, notes + [c.forward_note for c in contestants.values()],
             sustained),
        _row("varlen_attention_backward", case, {n: c.backward for n, c in backward.items()},
             {n: c.backward_on for n, c in backward.items() if c.backward_on is not None},
             reps, 2.5 * flops, notes + [c.backward_note for c in backward.values()],
             sustained),
    ]


def _varlen_flops(p: Packed) -> float:
    pairs = sum(_causal_pairs(n) for n in p.lengths)
    return 4.0 * pairs * p.spec.heads_q * p.spec.head_dim


def _bf16_rows(torch, raw: RawCudnn, spec: VarlenSet, reps: int) -> list[BenchRow]:
    p = packed(torch, spec, torch.bfloat16)
    bucket = VarlenAttentionDescriptor(**p.fields("bf16")).bucketed()
    notes = [p.about(bucket)]
    ours = _ours(lambda: OurVarlen(torch, p, "bf16", CUDNN), notes)
    contestants = {"ours": ours.contestant()} if ours else {}
    contestants.update(gather({
        "cudnn graph": lambda: cudnn_ragged(raw, p, bucket, True, "cudnn graph"),
        "torch varlen_attn": lambda: torch_varlen(torch, p),
        "torch sdpa loop": lambda: sdpa_peer(torch, *p.sequences(), True,
                                              name="torch sdpa loop"),
    }, notes))
    flops, case = _varlen_flops(p), p.case("bf16")
    rows = _training_rows(case, contestants, reps, flops, notes)
    default = contestants.get("ours")
    del contestants  # the peers' buffers and kept graphs, before the deterministic ones
    torch.cuda.empty_cache()
    rows.append(_deterministic_row(torch, raw, p, ours, default, bucket, case, reps,
                                   2.5 * flops, notes[0]))
    return rows


def _deterministic_row(torch, raw: RawCudnn, p: Packed, ours: OurVarlen | None,
                       default: Contestant | None, bucket, case: str, reps: int, flops: float,
                       about: str) -> BenchRow:
    """Our deterministic backward against cuDNN's deterministic ragged graph at the bucket, our
    default backward beside them. The two deterministic workspaces (tens of GB at the full
    set) are one buffer, since they never run at once."""
    op, notes = "varlen_attention_backward det", [about]
    plan = _ours(ours.deterministic, notes) if ours else None
    graph = None
    try:
        peer = ragged_peer(raw, p, bucket)
        peer.forward()
        graph = peer.backward(p.d_out, deterministic=True)
    except Exception as error:  # whatever cuDNN raises, the row goes on without it
        notes.append(f"cudnn graph: declined: {first_line(error)}")
    size = max((x.workspace_size for x in (plan, graph) if x is not None), default=0)
    try:
        shared = _workspace(torch, size)
    except torch.cuda.OutOfMemoryError as error:
        notes.append(f"the deterministic workspace of {size} B did not fit: {first_line(error)}")
        return BenchRow(op, case, math.nan, "not run", notes="; ".join(notes))
    fns = {}
    if plan is not None:
        fns["ours"] = ours.deterministic_call(plan, shared)
        notes.append(_plan_note(plan))
    if graph is not None:
        fns["cudnn graph"] = graph.bind(shared)
        notes.append(f"cudnn graph deterministic workspace {graph.workspace_size} B")
    if default is not None:
        fns["ours default"] = default.backward
        notes.append(f"ours default: {default.backward_note.removeprefix('ours ')}")
    return _row(op, case, fns, {}, reps, flops, notes)


def _f32_varlen_rows(torch, raw: RawCudnn, spec: VarlenSet, reps: int) -> list[BenchRow]:
    from torch.nn.attention import SDPBackend

    p = packed(torch, spec, torch.float32)
    bucket = VarlenAttentionDescriptor(**p.fields("f32")).bucketed()
    notes = [p.about(bucket)]
    ours = _ours(lambda: OurVarlen(torch, p, "f32", NVRTC), notes)
    contestants = {"ours": ours.contestant()} if ours else {}
    contestants.update(gather({
        "torch sdpa f32": lambda: sdpa_peer(torch, *p.sequences(), True,
                                             SDPBackend.EFFICIENT_ATTENTION, "torch sdpa f32"),
        "cudnn f32": lambda: cudnn_ragged(raw, p, bucket, False, "cudnn f32"),
    }, notes))
    return _training_rows(p.case("f32"), contestants, reps, _varlen_flops(p), notes,
                          sustained=True)


def _dense_rows(torch, raw: RawCudnn, shape: tuple[int, int, int, int], causal: bool,
                reps: int) -> list[BenchRow]:
    from torch.nn.attention import SDPBackend

    b, h, s, d = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, d_out = (torch.rand((b, h, s, d), device="cuda", generator=gen) * 2 - 1
                      for _ in range(4))
    fields = dict(batch=b, heads_q=h, heads_kv=h, seq_q=s, seq_kv=s, head_dim=d, element="f32",
                  causal="top_left" if causal else None)
    notes: list[str] = []
    ours = _ours(lambda: _our_dense(torch, fields, q, k, v, d_out), notes)
    contestants = {"ours": ours} if ours else {}
    contestants.update(gather({
        "torch sdpa f32": lambda: sdpa_peer(torch, [q], [k], [v], [d_out], causal,
                                             SDPBackend.EFFICIENT_ATTENTION, "torch sdpa f32"),
        "cudnn f32": lambda: cudnn_dense(raw, q, k, v, causal),
    }, notes))
    pairs = b * h * (_causal_pairs(s) if causal else s * s)
    case = f"f32 dense d{d} B{b} H{h} S{s}" + (" causal" if causal else "")
    return _training_rows(case, contestants, reps, 4.0 * pairs * d, notes, sustained=True)


def run(quick: bool = False) -> list[BenchRow]:
    import torch

    spec, dense = (QUICK_SET, QUICK_DENSE) if quick else (FULL_SET, FULL_DENSE)
    reps = QUICK_REPS if quick else REPS
    raw = RawCudnn(torch)
    rows = _bf16_rows(torch, raw, spec, reps)
    torch.cuda.empty_cache()
    for shape in dense:
        for causal in (False, True):
            rows += _dense_rows(torch, raw, shape, causal, reps)
            torch.cuda.empty_cache()
    rows += _f32_varlen_rows(torch, raw, spec, QUICK_REPS if quick else F32_VARLEN_REPS)
    return rows
