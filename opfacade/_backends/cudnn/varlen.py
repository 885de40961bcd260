"""The cuDNN varlen attention SKUs (f16, bf16): ragged (THD) graphs built for a bucket.

One prepared call is, in stream order:
1. ``ragged_prepare`` (NVRTC): starts, lengths and element offsets from cu_seqlens, into the
   workspace, for the graph's B sequences (sequences past the call's b get length 0);
2. backward only, ``ragged_gather_stats``: the padded stats the graph reads, from lse;
3. the graph (``ragged.py``), on the workspace's buffers and the caller's tensors;
4. ``ragged_forward_rows`` / ``ragged_backward_rows``: the contract's edges, whatever cuDNN left
   there: rows with no allowed key get out 0 and lse -inf (and lse from the padded stats
   elsewhere), grad_q 0; keys no query sees get grad_k and grad_v 0.

Nothing is read on the host, so a call may be captured in a CUDA graph and replayed with new
lengths written into the same cu_seqlens. Garbage offsets are clamped into the tensors by step 1;
checked mode (``desc.checked``) tests them first and raises (``varlen_checks``).

Selection applies cuDNN's SDPA rules (``limits.py``, with the padding mask on and the bucket's
lengths) and this module's own (``RAGGED_RULES``, ``LIMITS``), then, with a GPU, builds the graph
for compact tensors: cuDNN's verdict and the workspace are exact. A run with strided views
(packed QKV) builds the graph for its strides on first use; should its workspace exceed the
plan's, the run raises BufferTooSmall naming both.

Self-attention passes one cu_seqlens buffer as both cu_seqlens_q and cu_seqlens_kv. Every
sequence then has as many queries as keys, so a bottom-right mask (causal or window) is the same
mask aligned top-left, and the run uses a graph that declares it so (``RaggedKey.square``). On
cuDNN 9.19 (H100) that backward took 15.2 ms where the bottom-right one took 28.2 ms on the
bench's bf16 set (the forwards 4.8 and 4.9; ``scripts/varlen_backward_probe.py``). The check
is a comparison of two addresses at prepare time; it reads no data. Should the square graph
need more workspace than the plan holds, the bottom-right one runs. Results of the two graphs
may differ in their last bits, so a deterministic plan repeats bitwise for a given choice of
buffers.

cuDNN 9.19 takes the bucket as graph dimensions. cuDNN 9.21's override shapes and 9.24's
cu_seq_len inputs (with its ragged offset multiplier) were measured on cuDNN 9.24.1 and 9.28.1
on an H200 and are not used on any version: the forward ran no faster with them, even in a
bucket of twice the batch and length; the ragged backward, where a bucket costs, declined
override shapes; and the caller's cu_seqlens bound as is would skip step 1's clamp. explain
says so (``_NEWER_UNUSED``; docs/VARLEN-CUDNN.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..._internal.contract import BoundArgs, OpContract
from ..._internal.device import current_device, on_device
from ..._internal.limits import GRID_YZ_MAX, Limit, check, workspace_limit
from ..._internal.log import LOG
from ..._internal.selection import Target
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.varlen_attention import (
    VARLEN_ATTENTION_BACKWARD,
    VARLEN_ATTENTION_FORWARD,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from ...errors import (
    BufferTooSmall,
    LayoutMismatch,
    Unsupported,
)
from ...types import ArchSku, BackendKind, ElementKind, KernelSku, MathPrecision, PrecisionGuarantee
from ..nvrtc import launch as nvrtc_launch
from ..nvrtc import varlen_ragged as edges
from ..nvrtc.varlen_checks import checked
from . import graphs, limits, runtime
from .ragged import RaggedKey, RaggedLayout
from .sdpa import BACKWARD_BOUND, FORWARD_BOUND
from .selection import GraphSelection

__all__ = ["RAGGED_RULES", "SKUS", "VarlenBackwardCudnn", "VarlenForwardCudnn",
           "estimate_graph_workspace"]

P = TypeVar("P", VarlenAttentionDescriptor, VarlenAttentionBackwardDescriptor)

LAYOUT = "packed [T,H,D], token and head strides multiples of 8; lse [Hq,Tq] f32"
# cuDNN's SDPA kernels load with 16-byte vectors: pointers and token/head strides.
TENSOR_ALIGNMENT = 16
# The frontend 1.9 release (cuDNN 9.6 era) added the THD layout with bottom-right causal masks
# and sliding windows; these SKUs were measured on cuDNN 9.19.0 (H100).
MIN_RAGGED_VERSION = 90600
OVERRIDE_SHAPES_VERSION = 92100  # graph dimensions set per execute
CU_SEQ_LEN_VERSION = 92400  # cu_seqlens as graph inputs

RAGGED_RULES: tuple[limits.Rule, ...] = (
    limits.Rule("ragged before 9.6", ReasonCode.version_blocked,
                lambda f, c: c.version is not None and c.version < MIN_RAGGED_VERSION,
                lambda f, c: f"ragged (THD) attention with these masks needs cuDNN "
                             f"{limits.format_version(MIN_RAGGED_VERSION)}, found "
                             f"{limits.format_version(c.version)}"),
)

# What the kernels around the graph index (native/varlen_ragged.cu): heads on the grid's y,
# sequences on its z.
LIMITS: tuple[Limit, ...] = (
    Limit("heads", "max(heads_q, heads_kv)", "heads", "the row kernels' grid y extent",
          GRID_YZ_MAX, lambda d: max(d.heads_q, d.heads_kv),
          "varlen_ragged.py: grid (rows / 128, heads, batch)"),
    Limit("batch", "batch", "sequences", "the row kernels' grid z extent", GRID_YZ_MAX,
          lambda d: d.batch, "varlen_ragged.py: grid (rows / 128, heads, batch)"),
)
WORKSPACE = workspace_limit(lambda size: size, "the built graph plus varlen_ragged's buffers",
                            "the workspace")


def estimate_graph_workspace(desc: VarlenAttentionDescriptor | VarlenAttentionBackwardDescriptor,
                             direction: str, deterministic: bool) -> int:
    """The graph's workspace for selections without a GPU, fitted to cuDNN 9.19 on an H100
    (``scripts/cudnn_ragged_probe.py``: 4 x 980 and 16 x 4600 tokens, H 8/2, D 128): the
    forward takes none to speak of; the default backward two f32 dQ accumulators; the
    deterministic one dP for every (query, key) pair of the bucket in 2 bytes, 64-padded, beside
    one accumulator. Each within 1% of the measured bytes."""
    if direction == "forward":
        return 0
    rows = desc.batch * desc.heads_q * desc.max_seqlen_q
    accumulator = rows * desc.head_dim * 4
    if not deterministic:
        return Workspace.round_up(2 * accumulator + rows * 4)
    pad = lambda n: -(-n // 64) * 64  # noqa: E731
    d_p = desc.batch * desc.heads_q * pad(desc.max_seqlen_q) * pad(desc.max_seqlen_kv) * 2
    return Workspace.round_up(d_p + accumulator + rows * 4)


# Why a plan on a newer cuDNN keeps the offsets form, as explain says it (measured on cuDNN
# 9.24.1 and 9.28.1 on an H200: docs/VARLEN-CUDNN.md, "What a newer cuDNN offers").
_NEWER_UNUSED = {
    OVERRIDE_SHAPES_VERSION: ("override shapes",
                              "declined for the ragged backward, no faster forward"),
    CU_SEQ_LEN_VERSION: ("cu_seq_len inputs", "the same results in the same time, and cu_seqlens "
                         "bound as is would skip the clamp of garbage offsets"),
}


def _path(version: int | None) -> str:
    """Which of cuDNN's varlen paths a plan takes, for explain; where the cuDNN found offers
    newer inputs (or its version is unknown), why they are not used."""
    found = "cuDNN" if version is None else f"cuDNN {limits.format_version(version)}"
    unused = [f"{name} ({limits.format_version(since)}): {why}"
              for since, (name, why) in _NEWER_UNUSED.items()
              if version is None or version >= since]
    why = f"; not used: {'; '.join(unused)}" if unused else ""
    return f"{found}: ragged offsets, the bucket as graph dimensions{why}"


class _RaggedSku(GraphSelection, SkuImpl[P]):
    direction: str
    contract: OpContract[P]
    names: tuple[str, ...]  # the packed tensors the graph binds
    limits = LIMITS
    WORKSPACE = WORKSPACE

    def __init__(self, sku: KernelSku, deterministic: bool = False):
        self.sku = sku
        self.deterministic = deterministic

    # -- selection -------------------------------------------------------------------------
    def _facts(self, desc: P) -> limits.Facts:
        return limits.Facts(
            direction=self.direction, element=desc.element, batch=desc.batch,
            heads_q=desc.heads_q, seq_q=desc.max_seqlen_q, seq_kv=desc.max_seqlen_kv,
            head_dim=desc.head_dim, head_dim_v=desc.dim_v, bias=None, alibi=False,
            dropout=False, padding=True, right_bound=desc.right_bound,
            left_bound=desc.left_bound, bottom_right=desc.alignment == "bottom_right",
            deterministic=self.deterministic, heads_kv=desc.heads_kv,
            workspace=self._size(desc, self._estimate(desc)))

    def _regions(self, desc: P, graph_bytes: int) -> edges.RaggedWorkspace:
        stats = self.direction == "backward" or desc.save_lse
        return edges.RaggedWorkspace.plan(graph_bytes, desc.batch, desc.heads_q,
                                          desc.max_seqlen_q, stats)

    def _size(self, desc: P, graph_bytes: int) -> int:
        return self._regions(desc, graph_bytes).size

    def _data_unfit(self, desc: P, ctx: limits.Context) -> Unfit | None:
        facts = self._facts(desc)
        unfit = limits.check(facts, ctx) or check(self.limits, desc)
        for rule in RAGGED_RULES:
            if unfit is None and rule.rejects(facts, ctx):
                unfit = Unfit(rule.code, rule.why(facts, ctx))
        return unfit

    def _selection_key(self, desc: P, device: int) -> RaggedKey:
        return self._key(desc, device, RaggedLayout.compact(desc, self.names))

    def _workspace(self, desc: P, graph_bytes: int) -> int:
        return self._size(desc, graph_bytes)

    def _estimate(self, desc: P) -> int:
        return estimate_graph_workspace(desc, self.direction, self.deterministic)

    def plan_for(self, desc: P, pref, target: Target | None) -> tuple[int, str]:
        return self.workspace_size_on(desc, target), _path(runtime.backend_version())

    def unavailable(self) -> str | None:
        return runtime.available() or nvrtc_launch.available()

    # -- what was built --------------------------------------------------------------------
    def _graph(self, desc: P, device: int, layout: RaggedLayout, square: bool = False
               ) -> graphs.BuiltGraph | graphs.Declined:
        return graphs.GRAPHS.get(self._key(desc, device, layout, square))

    def _key(self, desc: P, device: int, layout: RaggedLayout, square: bool = False
             ) -> RaggedKey:
        return RaggedKey(self.direction, desc, device, self.deterministic, layout, square)

    def release(self, desc: P) -> None:
        graphs.GRAPHS.discard(desc, self.direction, self.deterministic)  # square ones too

    # -- running ---------------------------------------------------------------------------
    def check_args(self, desc: P, args: BoundArgs) -> None:
        for name, view in args.present().items():
            if name not in self.names:  # cu_seqlens and lse: read by our kernels only
                expect_aligned(view, name, view.itemsize)
                continue
            expect_aligned(view, name, TENSOR_ALIGNMENT)
            if view.strides[2] != 1 or any(s * view.itemsize % TENSOR_ALIGNMENT
                                           for s in view.strides[:2]):
                raise LayoutMismatch(
                    f"{name} must have unit stride along D and token and head strides that are "
                    f"multiples of {TENSOR_ALIGNMENT // view.itemsize} elements (cuDNN loads "
                    f"{TENSOR_ALIGNMENT} bytes at a time), got strides {view.strides}",
                    argument=name)

    def _pointers(self, built: graphs.BuiltGraph, views: dict[str, TensorView], base: int,
                  regions: edges.RaggedWorkspace, batch: int) -> list[int]:
        """Each graph operand's address: the caller's tensors, the workspace's buffers."""
        found: dict[str, int] = {name: views[name].ptr for name in self.names}
        found["seq_len_q"] = base + regions.lens
        found["seq_len_kv"] = base + regions.lens + 4 * batch
        if regions.stats is not None:
            found["stats_padded"] = base + regions.stats
        for g in range(edges.MAX_GROUPS):
            found[f"ragged_offsets_{g}"] = base + regions.offsets + g * (batch + 1) * 8
        return [found[name] for name in built.names]

    def _graph_for_run(self, desc: P, views: dict[str, TensorView], layout: RaggedLayout,
                       workspace: Workspace) -> tuple[graphs.BuiltGraph, edges.RaggedWorkspace]:
        """The run's graph and its workspace regions: the square graph of a bottom-right mask
        when both cu_seqlens are one buffer and it fits the workspace (the module docstring says
        why), else ``desc``'s own."""
        device = views["q"].device
        if desc.alignment == "bottom_right" and (
                views["cu_seqlens_q"].ptr == views["cu_seqlens_kv"].ptr):
            built = self._graph(desc, device, layout, square=True)
            if isinstance(built, graphs.BuiltGraph):
                regions = self._regions(desc, built.workspace_size)
                if regions.size <= workspace.size:
                    return built, regions
        built = self._graph(desc, device, layout)
        if isinstance(built, graphs.Declined):
            raise Unsupported(f"{self.sku.id} cannot serve these strides {layout.strides} on "
                              f"cuda:{device}: {built.reason}")
        regions = self._regions(desc, built.workspace_size)
        if workspace.size < regions.size:
            raise BufferTooSmall(
                f"workspace has {workspace.size} bytes; the graph built on cuda:{device} for "
                f"strides {layout.strides} needs {regions.size}", argument="workspace")
        return built, regions

    def prepared(self, desc: P, args: BoundArgs, workspace: Workspace, stream: int | None
                 ) -> Callable[[], None]:
        views = args.views
        device, stream = views["q"].device, stream or 0
        layout = RaggedLayout.of(views, self.names)
        built, regions = self._graph_for_run(desc, views, layout, workspace)
        base, batch = workspace.ptr, desc.batch
        handle = runtime.handle_for(device)
        execute = built.launch.bind(self._pointers(built, views, base, regions, batch),
                                    base + regions.graph, handle)
        set_stream = runtime.stream_setter()
        elsewhere = current_device() != device
        if elsewhere:
            LOG.debug("%s: its tensors are on cuda:%d, not the current device; each run makes "
                      "it current", self.sku.id, device)

        def bound_execute() -> None:
            set_stream(handle, stream)
            execute()

        def graph() -> None:
            if elsewhere:
                # The stream is bound inside too: stream 0 is the current device's null
                # stream, and cuDNN refuses a stream of another device than its handle's.
                with on_device(device):  # cuDNN launches on the current device
                    bound_execute()
            else:
                bound_execute()

        prepare = edges.prepare_call(
            device, views["cu_seqlens_q"].ptr, views["cu_seqlens_kv"].ptr,
            views["cu_seqlens_q"].shape[0], views["q"].shape[0], views["k"].shape[0], batch,
            desc.max_seqlen_q, desc.max_seqlen_kv, base, regions, layout.groups(), stream)
        steps = (prepare, *self._around(desc, views, base, regions, device, stream, graph))

        def run() -> None:
            for step in steps:
                step()

        return checked(desc, args, stream, run) if desc.checked else run

    def _around(self, desc: P, views: dict[str, TensorView], base: int,
                regions: edges.RaggedWorkspace, device: int, stream: int,
                graph: Callable[[], None]) -> tuple[Callable[[], None], ...]:
        """The steps after ``ragged_prepare``: the graph and its direction's edges."""
        raise NotImplementedError


def _sku(op: OpContract, element: ElementKind, bound: float, deterministic: bool,
         qualifier: str, description: str) -> KernelSku:
    return op.sku(BackendKind.cudnn, element, qualifier=qualifier, aux_element=ElementKind.f32,
                  layout=LAYOUT, arch=ArchSku.sm80, description=description,
                  guarantee=PrecisionGuarantee(
                      math_precision=MathPrecision(element.value), accumulator=ElementKind.f32,
                      deterministic=deterministic,
                      bit_stable=False,  # cuDNN picks tilings per GPU model
                      max_rel_error=bound, capture_safe=True))


class VarlenForwardCudnn(_RaggedSku[VarlenAttentionDescriptor]):
    direction = "forward"
    contract = VARLEN_ATTENTION_FORWARD
    names = ("q", "k", "v", "out")

    def __init__(self, element: ElementKind):
        super().__init__(_sku(
            VARLEN_ATTENTION_FORWARD, element, FORWARD_BOUND[element], True, "",
            "cuDNN ragged (THD) flash attention forward over packed sequences, built for the "
            "plan's bucket; offsets, lengths and lse moved on the device; every row is reduced "
            "by one thread block, so runs repeat bitwise on one GPU."))

    def _around(self, desc, views, base, regions, device, stream, graph):
        out, lse = views["out"], views["lse"]
        rows = edges.forward_rows_call(
            desc.element, device, out.ptr, out.strides[:2], None if lse is None else lse.ptr,
            0 if lse is None else lse.strides[0], base, regions, desc.batch, desc.heads_q,
            desc.max_seqlen_q, desc.dim_v, edges.RaggedMask.of(desc), stream)
        return graph, rows


class VarlenBackwardCudnn(_RaggedSku[VarlenAttentionBackwardDescriptor]):
    direction = "backward"
    contract = VARLEN_ATTENTION_BACKWARD
    names = ("q", "k", "v", "out", "grad_out", "grad_q", "grad_k", "grad_v")

    def __init__(self, element: ElementKind, deterministic: bool):
        if deterministic:
            description = ("cuDNN ragged attention backward with use_deterministic_algorithm: "
                           "dQ from a dP workspace of the whole bucket in a fixed order (large: "
                           "B*Hq*S_q*S_kv*2 bytes); bitwise repeatable on one GPU.")
        else:
            description = ("cuDNN ragged attention backward (default algorithm): dQ is "
                           "accumulated with atomics, so bits may differ run to run.")
        super().__init__(_sku(VARLEN_ATTENTION_BACKWARD, element, BACKWARD_BOUND[element],
                              deterministic, "deterministic" if deterministic else "",
                              description), deterministic)

    def _around(self, desc, views, base, regions, device, stream, graph):
        lse = views["lse"]
        gather = edges.gather_stats_call(device, lse.ptr, lse.strides[0], base, regions,
                                         desc.batch, desc.heads_q, desc.max_seqlen_q, stream)
        grads = tuple(views[name] for name in ("grad_q", "grad_k", "grad_v"))
        rows = edges.backward_rows_call(
            desc.element, device, tuple(g.ptr for g in grads),
            tuple(g.strides[:2] for g in grads), base, regions, desc.batch, desc.heads_q,
            desc.heads_kv, desc.head_dim, desc.dim_v, desc.max_seqlen_q, desc.max_seqlen_kv,
            edges.RaggedMask.of(desc), stream)
        return gather, graph, rows


SKUS = {
    VARLEN_ATTENTION_FORWARD.name: tuple(VarlenForwardCudnn(e) for e in limits.ELEMENTS),
    # The default backward first (faster, far smaller workspace); PlanPreference(
    # deterministic=True) or a workspace limit picks between them.
    VARLEN_ATTENTION_BACKWARD.name: tuple(VarlenBackwardCudnn(e, deterministic)
                                          for deterministic in (False, True)
                                          for e in limits.ELEMENTS),
}
