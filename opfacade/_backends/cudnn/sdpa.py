"""The cuDNN SDPA SKUs: one forward per element, a default and a deterministic backward per element.

Selection first applies the limits stated as data (``limits.py``), which need no GPU. When a GPU
is visible the graph is then built (and cached) during selection, so cuDNN's own verdict and the
exact workspace size are known before anything runs; cuDNN's "not supported" becomes an Unfit
naming the cuDNN version (``feature_unsupported``, cached), and a build that fails otherwise (out
of memory, say) an Unfit ``build_failed`` that is not cached: the next selection tries again.
With only an architecture to go on (no GPU), a problem that passes the data limits is viable
pending graph support: its workspace size is an estimate (documented below), the graph is built
on the first run, and a run that finds cuDNN declining raises ``Unsupported``, one whose build
fails ``LaunchFailed``, and one that finds the workspace too small ``BufferTooSmall``.

``unfit_on``/``workspace_size_on`` take the selection's target; the plan machinery calls the
target-less ``unfit``/``workspace_size``, which use the current device when a GPU is visible.
``release`` (``Plan.free``) drops the graphs built for a problem; ``clear`` what the SKUs memoise.

SDPA's edges (the contract's docstring states them) run in the same prepared call, around the
graph, as NVRTC kernels (``_backends/nvrtc/sdpa_edges.py``) on the run's stream: before a forward
given a ``dropout_counter``, the draw of its offset; after a padded forward, the rows the lengths
leave out (sequences with no keys, which cuDNN leaves unwritten, and rows past seq_len_q).
Without padding or a counter the prepared call is the graph's alone; the backward has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ..._internal.contract import BoundArgs, OpContract
from ..._internal.device import current_device, on_device
from ..._internal.graph_replay import library_call
from ..._internal.limits import workspace_limit
from ..._internal.log import LOG
from ..._internal.selection import Target
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, c_strides, expect_aligned
from ...contracts.sdpa import (
    SDPA_BACKWARD,
    SDPA_FORWARD,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
)
from ...errors import BufferTooSmall, LayoutMismatch, Unsupported
from ...types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    PrecisionGuarantee,
)
from ..nvrtc.sdpa_edges import DropoutDraw, PaddingRows
from . import graphs, limits, runtime
from .selection import GraphSelection

__all__ = ["SKUS", "SdpaBackwardCudnn", "SdpaForwardCudnn", "clear",
           "estimate_workspace", "run_forward_dumping_dropout"]

P = TypeVar("P", SdpaDescriptor, SdpaBackwardDescriptor)
V = TypeVar("V")

# Relative error bounds (Frobenius, against the float64 reference on uniform [-1, 1) inputs).
# Outputs are rounded once to the element (u = 2^-8 for bf16, 2^-11 for f16) and the
# probabilities are rounded to it again before the P.V product, so the forward sits near 1-2 u;
# the backward also rounds dS before its two products and cancels in dP - rowsum(dO * O).
# Conservative starting bounds, to be tightened from measurements on a GPU.
FORWARD_BOUND = {ElementKind.bf16: 1e-2, ElementKind.f16: 5e-3}
BACKWARD_BOUND = {ElementKind.bf16: 2e-2, ElementKind.f16: 1e-2}
# Device pointers cuDNN's SDPA kernels load with 16-byte vectors.
TENSOR_ALIGNMENT = 16
LAYOUT = ("bhsd|bshd|sbhd dense, d-contiguous (q, k, v: any 16-byte strides); stats "
          "[B,Hq,Sq,1] f32")
# What explain says beside a padded problem's verdict: the precondition nothing checks.
PADDING_NOTE = ("padding: content past the lengths must be finite (a NaN in q, k, v, bias or "
                "grad_out there can reach valid outputs); rows without keys get out 0, stats -inf")
# The workspace a graph built on a GPU asks for (limits.SIZE_LIMITS weighs the estimate first).
WORKSPACE = workspace_limit(lambda size: size, "the built graph's get_workspace_size()",
                            "the graph's workspace")


def _guarantee(element: ElementKind, bound: float, deterministic: bool) -> PrecisionGuarantee:
    return PrecisionGuarantee(
        math_precision=MathPrecision(element.value),  # tensor-core products in the element
        accumulator=ElementKind.f32,
        deterministic=deterministic,
        bit_stable=False,  # cuDNN picks tilings per GPU model: equal bits on one device only
        max_rel_error=bound,
        # Not claimed: with ALiBi the frontend copies the slopes from host memory on each
        # execute, which a CUDA graph would freeze; graph capture is not verified for SDPA yet.
        capture_safe=False,
    )


def estimate_workspace(desc: SdpaDescriptor | SdpaBackwardDescriptor, direction: str,
                       deterministic: bool = False) -> int:
    """Workspace bytes cuDNN's sm90 plans take, for selections without a GPU (an estimate).

    Forward: the ALiBi slopes cuDNN writes into the workspace. Backward: the f32 dQ
    accumulator and the rowsum(dO * O) vector; the deterministic and dBias plans instead keep
    dP for every (query, key) pair in 2 bytes, padded to multiples of 64.
    """
    slopes = -(-desc.heads_q * 4 // 16) * 16 if desc.alibi else 0
    if direction == "forward":
        return Workspace.round_up(slopes)
    rows = desc.batch * desc.heads_q * desc.seq_q
    row_sums = rows * 4
    accumulator = rows * desc.head_dim * 4
    d_p = desc.batch * desc.heads_q * (-(-desc.seq_q // 64) * 64) * (-(-desc.seq_kv // 64) * 64) * 2
    if deterministic:
        return Workspace.round_up(slopes + row_sums + d_p)
    if desc.need_bias_grad:
        return Workspace.round_up(slopes + row_sums + d_p + accumulator)
    return Workspace.round_up(slopes + row_sums + accumulator)


class _ByDescriptor(Generic[V]):
    """What a SKU derived for one descriptor object, found by the object's identity: a plan
    passes its own descriptor on every run, so a hit costs no hashing of it. Bounded; ``discard``
    (a freed plan) and ``clear`` (``clear_caches``) drop entries."""

    __slots__ = ("_items",)
    CAPACITY = 1024

    def __init__(self) -> None:
        self._items: dict[tuple[int, int], tuple[object, V]] = {}

    def get(self, desc: object, device: int = -1) -> V | None:
        entry = self._items.get((id(desc), device))
        return entry[1] if entry is not None and entry[0] is desc else None

    def put(self, desc: object, value: V, device: int = -1) -> V:
        if len(self._items) >= self.CAPACITY:
            self._items.clear()
        self._items[(id(desc), device)] = (desc, value)
        return value

    def discard(self, desc: object) -> None:
        for key, (held, _) in list(self._items.items()):
            if held == desc:
                self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()


def _expect_strides(view: TensorView, name: str, expected: tuple[int, ...], what: str) -> None:
    for extent, actual, wanted in zip(view.shape, view.strides, expected, strict=True):
        if extent > 1 and actual != wanted:
            raise LayoutMismatch(
                f"{name} must have the {what} strides {expected} this plan's graph was built "
                f"for, got {view.strides}", argument=name)


def _strides_unfit(desc: P) -> Unfit | None:
    """q, k, v with their own strides (views into a packed QKV) need every stride of an extent
    above 1 to be a multiple of 16 bytes: the kernels load rows 16 bytes at a time."""
    if desc.qkv_strides is None:
        return None
    itemsize = desc.element.itemsize
    for name in ("q", "k", "v"):
        shape, strides = getattr(desc, f"{name}_shape"), desc.input_strides(name)
        if any(n > 1 and s * itemsize % TENSOR_ALIGNMENT
               for n, s in zip(shape[:3], strides[:3], strict=True)):
            return Unfit(ReasonCode.shape_unsupported,
                         f"qkv_strides.{name} {strides}: cuDNN needs the batch, head and seq "
                         f"strides to be multiples of {TENSOR_ALIGNMENT // itemsize} elements "
                         f"({TENSOR_ALIGNMENT} bytes)")
    return None


class _SdpaCudnn(GraphSelection, SkuImpl[P]):
    direction: str
    contract: OpContract[P]
    WORKSPACE = WORKSPACE

    def __init__(self, sku: KernelSku, variant: bool):
        self.sku = sku
        self.variant = variant  # forward: dump the dropout mask; backward: deterministic
        self._graphs: _ByDescriptor[graphs.BuiltGraph] = _ByDescriptor()
        self._strides: _ByDescriptor[dict[str, tuple[tuple[int, ...], str]]] = _ByDescriptor()

    # -- selection -------------------------------------------------------------------------
    def _facts(self, desc: P) -> limits.Facts:
        return limits.Facts(
            direction=self.direction, element=desc.element, batch=desc.batch,
            heads_q=desc.heads_q, seq_q=desc.seq_q, seq_kv=desc.seq_kv, head_dim=desc.head_dim,
            head_dim_v=desc.dim_v, bias=desc.bias, alibi=desc.alibi,
            dropout=desc.dropout_p > 0.0, padding=desc.padding, right_bound=desc.right_bound,
            left_bound=desc.left_bound, bottom_right=desc.alignment == "bottom_right",
            bias_grad=isinstance(desc, SdpaBackwardDescriptor) and desc.need_bias_grad,
            deterministic=self.sku.precision_guarantee.deterministic, heads_kv=desc.heads_kv,
            workspace=estimate_workspace(desc, self.direction,
                                         self.sku.precision_guarantee.deterministic))

    def _data_unfit(self, desc: P, ctx: limits.Context) -> Unfit | None:
        return _strides_unfit(desc) or limits.check(self._facts(desc), ctx)

    def _selection_key(self, desc: P, device: int) -> graphs.GraphKey:
        return self._key(desc, device)

    def _estimate(self, desc: P) -> int:
        return estimate_workspace(desc, self.direction, self.sku.precision_guarantee.deterministic)

    def plan_for(self, desc: P, pref, target: Target | None) -> tuple[int, str]:
        """The workspace, and for a padded problem the precondition it runs under."""
        return self.workspace_size_on(desc, target), PADDING_NOTE if desc.padding else ""

    def unavailable(self) -> str | None:
        return runtime.available()

    # -- what was built --------------------------------------------------------------------
    def _graph(self, desc: P, device: int) -> graphs.BuiltGraph | graphs.Declined:
        """This SKU's graph for ``desc`` on ``device``, from ``graphs.GRAPHS``; raises what a
        failed build raises (LaunchFailed, BackendUnavailable)."""
        return graphs.GRAPHS.get(self._key(desc, device))

    def _key(self, desc: P, device: int) -> graphs.GraphKey:
        return graphs.GraphKey(self.direction, desc, device, self.variant)

    def release(self, desc: P) -> None:
        """Drops this SKU's graphs for ``desc`` (every device) and what it derived from them."""
        graphs.GRAPHS.discard(desc, self.direction, self.variant)
        self._graphs.discard(desc)
        self._strides.discard(desc)

    def clear(self) -> None:
        """Drops what this SKU memoises per descriptor (``clear_caches`` calls it)."""
        self._graphs.clear()
        self._strides.clear()

    # -- running ---------------------------------------------------------------------------
    def _graph_for_run(self, desc: P, device: int) -> graphs.BuiltGraph:
        built = self._graphs.get(desc, device)  # the plan's own descriptor: no hashing
        if built is not None:
            return built
        built = self._graph(desc, device)
        if isinstance(built, graphs.Declined):
            raise Unsupported(f"{self.sku.id} cannot serve this problem on cuda:{device}: "
                              f"{built.reason}")
        return self._graphs.put(desc, built, device)

    def _expected_strides(self, desc: P) -> dict[str, tuple[tuple[int, ...], str]]:
        """Strides each float argument must have, by name, as the contract lays them out (and
        the graph declares them); computed once per descriptor."""
        table = self._strides.get(desc)
        if table is not None:
            return table
        # The signature's strides: the layout's (or qkv_strides') for the [B, H, S, D] tensors,
        # the contract's stats_strides for the stats, C order (None) for the bias and its
        # gradient.
        table = {}
        for name, spec in self.contract.signature(desc).items():
            if spec.element.is_float:
                if name in ("q", "k", "v") and desc.qkv_strides is not None:
                    what = "qkv_strides"
                elif spec.strides is not None and name != "stats":
                    what = f"dense {desc.layout}"
                else:
                    what = "row-major"
                table[name] = (spec.strides or c_strides(spec.shape), what)
        return self._strides.put(desc, table)

    def check_args(self, desc: P, args: BoundArgs) -> None:
        expected = self._expected_strides(desc)
        for name, view in args.views.items():
            if view is None:
                continue
            expect_aligned(view, name, TENSOR_ALIGNMENT if view.element.is_float
                           else view.itemsize)
            wanted = expected.get(name)
            if wanted is not None and view.strides != wanted[0]:
                _expect_strides(view, name, *wanted)  # differences in size-1 extents pass

    def prepared(self, desc: P, args: BoundArgs, workspace: Workspace, stream: int | None
                 ) -> Callable[[], None]:
        """Graph, handle, pointers and stream resolved once; a call binds the stream (the handle
        is this thread's, shared with other plans) and executes the graph's bound call, making
        the graph's device current around it when it is not current here.

        On the current device the call, edges included, replays from a CUDA graph once it has
        been made ``LIBRARY_CAPTURE_AT`` times (``GraphedLaunches``): one cuGraphLaunch on the
        caller's stream, where cuDNN's execute and the stream bind cost the host 12-14 us on an
        H100 host. run()'s memo keeps the call, so repeated runs on the same tensors replay
        too."""
        views = args.views
        device = views["q"].device
        built = self._graph_for_run(desc, device)
        self._check_workspace(built, workspace, device)
        handle = runtime.handle_for(device)
        execute = built.launch.bind([views[name].ptr for name in built.names], workspace.ptr,
                                    handle)
        set_stream, stream = runtime.stream_setter(), stream or 0
        if current_device() != device:
            LOG.debug("%s: its tensors are on cuda:%d, not the current device; each run makes "
                      "it current", self.sku.id, device)

            def run_on_its_device() -> None:
                # Bound inside: stream 0 is the current device's null stream, and cuDNN
                # refuses a stream of another device than its handle's.
                with on_device(device):  # cuDNN launches on the current device
                    set_stream(handle, stream)
                    execute()

            return self._with_edges(desc, views, device, stream, run_on_its_device)

        def launches(on: int) -> list[Callable[[], None]]:
            def run_prepared() -> None:
                set_stream(handle, on)
                execute()

            return [self._with_edges(desc, views, device, on, run_prepared)]

        return library_call(launches, stream, device)

    def _edges(self, desc: P, views: dict, device: int, stream: int
               ) -> tuple[list[Callable[[], None]], list[Callable[[], None]]]:
        """The NVRTC launches before and after the graph (the module docstring says which)."""
        return [], []

    def _with_edges(self, desc: P, views: dict, device: int, stream: int,
                    graph: Callable[[], None]) -> Callable[[], None]:
        """``graph`` alone, or wrapped in the edges' launches: one call, in stream order."""
        before, after = self._edges(desc, views, device, stream)
        if not before and not after:
            return graph  # no padding, no counter: nothing added to the call
        steps = (*before, graph, *after)

        def run_with_edges() -> None:
            for step in steps:
                step()

        return run_with_edges

    @staticmethod
    def _check_workspace(built: graphs.BuiltGraph, workspace: Workspace, device: int) -> None:
        if workspace.size < built.workspace_size:
            raise BufferTooSmall(
                f"workspace has {workspace.size} bytes; the graph built on cuda:{device} needs "
                f"{built.workspace_size} (select the plan with a device for an exact size)",
                argument="workspace")


def _sku(op: OpContract, element: ElementKind, bound: float, deterministic: bool,
         qualifier: str, description: str) -> KernelSku:
    return op.sku(BackendKind.cudnn, element, guarantee=_guarantee(element, bound, deterministic),
                  qualifier=qualifier, aux_element=ElementKind.f32, layout=LAYOUT,
                  arch=ArchSku.sm80, description=description)


def _padding_rows(desc: SdpaDescriptor, views: dict, rows: str, stats: str | None, device: int,
                  stream: int) -> Callable[[], None]:
    """The fix-up of ``rows`` ([B, Hq, Sq, *]) and ``stats`` after a padded run."""
    row_view, stats_view = views[rows], views[stats] if stats is not None else None
    fix = PaddingRows(desc.element, device, row_view.shape, row_view.strides,
                      None if stats_view is None else stats_view.strides)
    return fix.bind(row_view.ptr, None if stats_view is None else stats_view.ptr,
                    views["seq_len_q"].ptr, views["seq_len_kv"].ptr, stream)


class SdpaForwardCudnn(_SdpaCudnn[SdpaDescriptor]):
    direction = "forward"
    contract = SDPA_FORWARD

    def _edges(self, desc, views, device, stream):
        before, after = [], []
        counter = views.get("dropout_counter")
        if counter is not None:
            draw = DropoutDraw(device, desc.dropout_offset_stride)
            before.append(draw.bind(counter.ptr, views["dropout_offset"].ptr, stream))
        if desc.padding:
            after.append(_padding_rows(desc, views, "out", "stats" if desc.save_stats else None,
                                       device, stream))
        return before, after

    def __init__(self, element: ElementKind):
        super().__init__(_sku(
            SDPA_FORWARD, element, FORWARD_BOUND[element], True, "",
            "cuDNN fused flash attention forward (softmax stats optional): every row is reduced "
            "by one thread block, so runs repeat bitwise on one GPU."), variant=False)


class SdpaBackwardCudnn(_SdpaCudnn[SdpaBackwardDescriptor]):
    # No edges: cuDNN 9.19 writes grad_q 0 for a sequence without keys itself (both algorithms,
    # measured on an H100), and it reads the forward's out and stats, which the forward's edge
    # leaves finite past seq_len_q.
    direction = "backward"
    contract = SDPA_BACKWARD

    def __init__(self, element: ElementKind, deterministic: bool):
        if deterministic:
            description = ("cuDNN fused attention backward with use_deterministic_algorithm: dQ "
                           "from a dP workspace in a fixed order (large workspace, "
                           "B*Hq*Sq*Skv*2 bytes on sm90); bitwise repeatable on one GPU.")
        else:
            description = ("cuDNN fused attention backward (default algorithm): dQ is "
                           "accumulated with atomics, so bits may differ run to run.")
        super().__init__(_sku(SDPA_BACKWARD, element, BACKWARD_BOUND[element], deterministic,
                              "deterministic" if deterministic else "", description),
                         variant=deterministic)


SKUS = {
    SDPA_FORWARD.name: tuple(SdpaForwardCudnn(e) for e in limits.ELEMENTS),
    # The default backward first (faster, smaller workspace); PlanPreference(deterministic=True)
    # or a workspace limit picks between them.
    SDPA_BACKWARD.name: tuple(SdpaBackwardCudnn(e, deterministic)
                              for deterministic in (False, True) for e in limits.ELEMENTS),
}


def clear() -> None:
    """Drops what every cuDNN SDPA SKU memoises (the graphs themselves live in graphs.GRAPHS)."""
    for impls in SKUS.values():
        for impl in impls:
            impl.clear()


def run_forward_dumping_dropout(desc: SdpaDescriptor, views: dict[str, TensorView],
                                mask: TensorView, stream: int) -> None:
    """Testing aid: runs the forward graph variant that also writes cuDNN's dropout mask.

    ``mask`` is float32 [B, Hq, Sq, Skv], contiguous; cuDNN writes 1 where a probability is
    kept and 0 where it is dropped. ``views`` are the forward's arguments by name, already
    checked (a bound SdpaArgs). Allocates its own workspace with CuPy.
    """
    import cupy

    device = views["q"].device
    built = graphs.forward_graph(desc, device, dump_dropout=True)
    if isinstance(built, graphs.Declined):
        raise Unsupported(f"the dropout-mask variant of this forward: {built.reason}")
    handle = runtime.handle_for(device)
    pointers = [mask.ptr if name == "dropout_mask" else views[name].ptr for name in built.names]
    with cupy.cuda.Device(device):  # the stream (0 included) and the launch are the device's
        workspace = cupy.empty(max(built.workspace_size, 1), dtype=cupy.uint8)
        runtime.set_stream(handle, stream)
        built.launch.bind(pointers, workspace.data.ptr, handle)()
        cupy.cuda.runtime.streamSynchronize(stream)  # the workspace dies with this frame
