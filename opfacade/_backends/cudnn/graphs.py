"""SDPA forward and backward as cudnn-frontend graphs: tensor UIDs, building, caching, executing.

A graph is built once per ``GraphKey`` (direction, descriptor, device, variant) in the fixed
order validate -> build_operation_graph -> create_execution_plans -> check_support ->
build_plans, and its workspace size read right after. ``GRAPHS`` (a ``GraphCache``) keeps what
was built, and cuDNN's genuine verdicts: the frontend's "not supported" at any of those steps
becomes a cached ``Declined`` carrying cuDNN's version and message, which selection turns into a
rejection reason. Every other failure (out of memory, a driver error, no CuPy) is raised as a
typed error and never cached, so the next selection or run tries again.

Tensors are bound by UID. Each built graph knows its operands' argument names in ascending UID
order, so a run only collects pointers. ``BuiltGraph.launch.bind`` makes the one call a run
makes: through the backend's raw-pointer entry point when the frontend exposes it for the
selected plan (the same call ``pygraph.execute`` makes after normalising its arguments), else
through the public ``execute`` with a ``{uid: pointer}`` dict; ``EXECUTE_PATH = "public"``
forces the latter. Taking the public path is logged at DEBUG, with the reason.

The masks are the contract's (``contracts/sdpa.py``: the descriptor's ``alignment``,
``left_bound`` and ``right_bound``, in the reference's convention); cuDNN's band parameters
differ by one on the left (``d`` the diagonal offset):

    keys j <= i + d + right      diagonal_band_right_bound = right   (causal: right = 0)
    keys j >= i + d - left       diagonal_band_left_bound  = left + 1 (cuDNN keeps j > i + d - L)
    alignment                    diagonal_alignment TOP_LEFT / BOTTOM_RIGHT
"""

from __future__ import annotations

import ctypes
import enum
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..._internal.device import on_device
from ..._internal.log import LOG, timed
from ..._internal.sku import ReasonCode, Unfit
from ..._internal.tensors import c_strides
from ...contracts.sdpa import (
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    dense_strides,
    stats_strides,
)
from ...errors import BackendUnavailable, LaunchFailed, OpFacadeError
from ...types import ElementKind
from . import plan_store, runtime
from .limits import format_version

__all__ = ["EXECUTE_PATH", "GRAPHS", "BuiltGraph", "Declined", "GraphCache", "GraphKey", "Uid",
           "backward_graph", "build_in_order", "built_or_unfit", "declare_backward",
           "declare_forward", "diagonal_band", "forward_graph", "mask_options"]

# "auto": the backend's raw-pointer call when available; "public": always pygraph.execute.
EXECUTE_PATH = "auto"

Problem = SdpaDescriptor | SdpaBackwardDescriptor


class Uid(enum.IntEnum):
    """The UIDs of the graphs' user tensors (internal tensors get the frontend's own)."""

    Q = 1
    K = 2
    V = 3
    O = 4  # noqa: E741 - cuDNN's name for the output
    STATS = 5
    BIAS = 6
    SEQ_LEN_Q = 7
    SEQ_LEN_KV = 8
    SEED = 9
    OFFSET = 10
    DO = 11
    DQ = 12
    DK = 13
    DV = 14
    DBIAS = 15
    DROPOUT_MASK = 16


# Argument names of the op layer's Args dataclasses, per UID.
ARGUMENT = {
    Uid.Q: "q", Uid.K: "k", Uid.V: "v", Uid.O: "out", Uid.STATS: "stats", Uid.BIAS: "bias",
    Uid.SEQ_LEN_Q: "seq_len_q", Uid.SEQ_LEN_KV: "seq_len_kv", Uid.SEED: "dropout_seed",
    Uid.OFFSET: "dropout_offset", Uid.DO: "grad_out", Uid.DQ: "grad_q", Uid.DK: "grad_k",
    Uid.DV: "grad_v", Uid.DBIAS: "grad_bias", Uid.DROPOUT_MASK: "dropout_mask",
}


def diagonal_band(desc: Problem) -> tuple[str, int | None, int | None]:
    """(alignment, cuDNN left bound, cuDNN right bound) for the descriptor's causal/window."""
    left = None if desc.left_bound is None else desc.left_bound + 1
    return desc.alignment, left, desc.right_bound


def mask_options(cudnn, desc, top_left: bool = False) -> dict:
    """The sdpa/sdpa_backward keywords of the softmax scale and the diagonal band, for any
    attention descriptor (``attention_masks.AttentionMask``); ``top_left`` aligns the band
    top-left whatever the descriptor says (the caller knows the two are the same mask)."""
    alignment, left, right = diagonal_band(desc)
    if top_left:
        alignment = "top_left"
    options = {
        "attn_scale": float(desc.softmax_scale),
        "diagonal_alignment": (cudnn.diagonal_alignment.BOTTOM_RIGHT
                               if alignment == "bottom_right"
                               else cudnn.diagonal_alignment.TOP_LEFT),
    }
    if left is not None:
        options["diagonal_band_left_bound"] = left
    if right is not None:
        options["diagonal_band_right_bound"] = right
    return options


@dataclass(frozen=True)
class Declined:
    """cuDNN will not serve this graph; ``reason`` names the cuDNN version and its message."""

    reason: str


def _raw_entry(graph, uids: tuple[int, ...]) -> tuple[tuple[object, int] | None, str]:
    """((lowered graph, plan index), "") when the backend's raw-pointer call serves this graph,
    else (None, why not): the public execute serves it."""
    try:
        if graph.selected_engine is not None:
            return None, f"frontend engine {graph.selected_engine.name} (a python engine)"
        lowered = graph._lowered_graph
        order = tuple(int(u) for u in graph._variant_pack_uids() or ())
        if order != uids:
            return None, f"the plan's operand UIDs {order} are not the graph's {uids}"
        if not hasattr(lowered, "_execute_with_raw_ptrs"):
            return None, "this frontend has no raw-pointer entry point"
        # A deserialized graph has no plan list: the backend runs the plan it loaded (index -1),
        # as the public execute then does.
        config = graph._materialize_backend_plan(graph._plan_index) if graph._plans else None
        index = -1 if config is None or config.cpp_index is None else int(config.cpp_index)
        return (lowered, index), ""
    except Exception as error:  # the frontend's private surface moved: the public path works
        why = f"the raw-pointer entry point is unreachable: {type(error).__name__}: {error}"
        LOG.debug("cuDNN graph: %s", why)
        return None, why


class _Launcher:
    """Executes one built graph on pointers given in ascending-UID order."""

    def __init__(self, graph, uids: tuple[int, ...]):
        self._graph = graph
        self._uids = uids
        self._fast, self._why_public = _raw_entry(graph, uids)

    @property
    def raw(self) -> bool:
        return self._fast is not None

    def bind(self, pointers: list[int], workspace: int, handle) -> Callable[[], None]:
        """The call that executes on these fixed pointers (argument lists built once): a
        prepared run keeps it, a one-off run is ``bind(...)()``."""
        if self._fast is not None and EXECUTE_PATH == "auto":
            lowered, index = self._fast
            array = (ctypes.c_void_p * len(pointers))(*pointers)
            address, count, backend = ctypes.addressof(array), len(pointers), handle.backend_handle
            execute_raw = lowered._execute_with_raw_ptrs

            def execute_bound() -> None:
                execute_raw(address, count, workspace, backend, index)
                array  # noqa: B018 - the closure keeps the pointer array alive

            return execute_bound
        LOG.debug("cuDNN graph executes through the public graph.execute: %s",
                  self._why_public or f"EXECUTE_PATH is {EXECUTE_PATH!r}")
        pack = dict(zip(self._uids, pointers, strict=True))
        execute = self._graph.execute

        def execute_public() -> None:
            execute(pack, workspace, handle=handle)

        return execute_public


@dataclass(frozen=True)
class BuiltGraph:
    """A graph ready to run: its operands' argument names (ascending UID), workspace, plan."""

    graph: object
    names: tuple[str, ...]
    workspace_size: int
    served_by: str
    launch: _Launcher


def _served_by(graph) -> str:
    """Which engine runs the graph: a label for diagnostics and the bench's notes."""
    try:
        engine = graph.selected_engine
        if engine is not None:
            return f"frontend engine {engine.name}"
        return "cuDNN backend " + graph.get_plan_name_at_index(graph._plan_index)
    except Exception as error:  # only the label is lost
        LOG.debug("cuDNN graph: no plan name: %s: %s", type(error).__name__, error)
        return "cuDNN backend"


def _dtypes(cudnn, element: ElementKind):
    io = cudnn.data_type.HALF if element is ElementKind.f16 else cudnn.data_type.BFLOAT16
    return io, cudnn.data_type.FLOAT


def build_in_order(graph, cudnn):
    """``graph`` built in the fixed order (the module's docstring), and returned; the
    frontend's "not supported" at any step comes back as it raised it. The probes in scripts/
    build their graphs this way too."""
    graph.validate()  # the frontend's own checks of the support surface; needs no GPU
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return graph


class _Builder:
    """Declares one graph's user tensors with fixed UIDs."""

    def __init__(self, desc: Problem, handle: object):
        self.cudnn = runtime.cudnn_module()
        self.desc = desc
        self.io, self.f32 = _dtypes(self.cudnn, desc.element)
        self.graph = self.cudnn.pygraph(io_data_type=self.io, intermediate_data_type=self.f32,
                                        compute_data_type=self.f32, handle=handle)
        self.names: dict[int, str] = {}  # UID -> the name a run finds the tensor's pointer by

    def tensor(self, uid: int, shape, strides, data_type=None, name: str | None = None):
        name = ARGUMENT[Uid(uid)] if name is None else name
        self.names[int(uid)] = name
        return self.graph.tensor(dim=list(shape), stride=list(strides), uid=int(uid),
                                 data_type=self.io if data_type is None else data_type, name=name)

    def output(self, tensor, uid: int, shape, strides, data_type=None,
               name: str | None = None):
        self.names[int(uid)] = ARGUMENT[Uid(uid)] if name is None else name
        tensor.set_output(True).set_dim(list(shape)).set_stride(list(strides))
        tensor.set_data_type(self.io if data_type is None else data_type).set_uid(int(uid))
        return tensor

    def qkv(self):
        d = self.desc
        return (self.tensor(Uid.Q, d.q_shape, d.input_strides("q")),
                self.tensor(Uid.K, d.k_shape, d.input_strides("k")),
                self.tensor(Uid.V, d.v_shape, d.input_strides("v")))

    def options(self) -> dict:
        """The sdpa/sdpa_backward keywords shared by both directions."""
        d, cudnn = self.desc, self.cudnn
        # Without padding and with as many queries as keys, the bottom-right diagonal is the
        # top-left one, and cuDNN 9.19's backward runs the top-left one 1.8x faster (H100, B4
        # H32/8 S4096 d128 causal: 2.93 against 5.23 ms, scripts/varlen_backward_probe.py).
        square = d.alignment == "bottom_right" and not d.padding and d.seq_q == d.seq_kv
        options = {**mask_options(cudnn, d, top_left=square), "use_alibi_mask": bool(d.alibi),
                   "use_padding_mask": bool(d.padding)}
        if d.bias is not None:
            options["bias"] = self.tensor(Uid.BIAS, d.bias_shape, c_strides(d.bias_shape))
        if d.padding:
            lengths = ((d.batch, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT32)
            options["seq_len_q"] = self.tensor(Uid.SEQ_LEN_Q, *lengths)
            options["seq_len_kv"] = self.tensor(Uid.SEQ_LEN_KV, *lengths)
        if d.dropout_p > 0.0:
            scalar = ((1, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT64)
            options["dropout"] = (float(d.dropout_p), self.tensor(Uid.SEED, *scalar),
                                  self.tensor(Uid.OFFSET, *scalar))
        return options

    def finish(self) -> BuiltGraph:
        """The fixed build order; declines come back as the frontend raised them."""
        return self.adopt(build_in_order(self.graph, self.cudnn))

    def adopt(self, graph, source: str | None = None) -> BuiltGraph:
        """A built graph whose operands are this declaration's: the one ``finish`` built, or one
        built elsewhere (``source``: where it came from)."""
        uids = tuple(sorted(self.names))
        served_by = _served_by(graph) if source is None else f"{_served_by(graph)} ({source})"
        return BuiltGraph(graph, tuple(self.names[u] for u in uids),
                          int(graph.get_workspace_size()), served_by, _Launcher(graph, uids))


def declare_forward(desc: SdpaDescriptor, handle: object, dump_dropout: bool = False
                    ) -> _Builder:
    """The forward graph with its tensors and the sdpa node declared, nothing built yet."""
    b = _Builder(desc, handle)
    q, k, v = b.qkv()
    options = b.options()
    if dump_dropout:
        shape = (desc.batch, desc.heads_q, desc.seq_q, desc.seq_kv)
        options["rng_dump"] = b.tensor(Uid.DROPOUT_MASK, shape, c_strides(shape), b.f32)
    out, stats = b.graph.sdpa(q, k, v, name="sdpa", generate_stats=bool(desc.save_stats),
                              **options)
    b.output(out, Uid.O, desc.o_shape, dense_strides(desc.layout, *desc.o_shape))
    if desc.save_stats:
        b.output(stats, Uid.STATS, desc.stats_shape, stats_strides(desc), b.f32)
    return b


def declare_backward(desc: SdpaBackwardDescriptor, handle: object, deterministic: bool = False
                     ) -> _Builder:
    """The backward graph with its tensors and the sdpa_backward node declared."""
    b = _Builder(desc, handle)
    q, k, v = b.qkv()
    o_strides = dense_strides(desc.layout, *desc.o_shape)
    o = b.tensor(Uid.O, desc.o_shape, o_strides)
    d_o = b.tensor(Uid.DO, desc.o_shape, o_strides)
    stats = b.tensor(Uid.STATS, desc.stats_shape, stats_strides(desc), b.f32)
    options = b.options()
    if desc.need_bias_grad:
        options["dBias"] = b.tensor(Uid.DBIAS, desc.bias_shape, c_strides(desc.bias_shape))
    dq, dk, dv = b.graph.sdpa_backward(q, k, v, o, d_o, stats, name="sdpa_backward",
                                       use_deterministic_algorithm=bool(deterministic),
                                       **options)
    for tensor, uid, shape in ((dq, Uid.DQ, desc.q_shape), (dk, Uid.DK, desc.k_shape),
                               (dv, Uid.DV, desc.v_shape)):
        b.output(tensor, uid, shape, dense_strides(desc.layout, *shape))
    return b


class GraphKey(NamedTuple):
    """What a graph is built for. ``variant``: the forward that dumps its dropout mask, the
    deterministic backward."""

    direction: str  # "forward" or "backward"
    desc: Problem
    device: int
    variant: bool

    def __str__(self) -> str:
        variant = {"forward": "dumping dropout", "backward": "deterministic"}[self.direction]
        return (f"{self.direction} graph{f' ({variant})' if self.variant else ''} on "
                f"cuda:{self.device} for {self.desc!r}")

    def declare(self, handle: object) -> _Builder:
        if self.direction == "forward":
            return declare_forward(self.desc, handle, self.variant)
        return declare_backward(self.desc, handle, self.variant)


def _build(key) -> BuiltGraph | Declined:
    """Builds one graph. cuDNN's "not supported" comes back as a Declined; any other failure
    raises: LaunchFailed naming cuDNN's version and the error, or BackendUnavailable."""
    missing = runtime.available()
    if missing is not None:
        raise BackendUnavailable(missing)
    where = f"cuDNN {format_version(runtime.backend_version())}"
    declines = runtime.not_supported_types()
    try:
        with on_device(key.device), timed("cuDNN %s", key):  # graphs bind the current device
            handle = runtime.handle_for(key.device)
            runtime.bind_build_stream(handle)  # not the last run's stream, which may be gone
            declared = key.declare(handle)
            stored = plan_store.load(key, handle)
            if stored is not None:
                return declared.adopt(stored, "deserialized from the plan store")
            built = declared.finish()
            plan_store.store(key, built.graph)
            return built
    except OpFacadeError:
        raise  # ours, typed already (BackendUnavailable is a NotImplementedError: not a decline)
    except declines as error:
        LOG.debug("%s declines the %s: %s", where, key, error)
        return Declined(f"{where}: {error}")
    except Exception as error:
        raise LaunchFailed(f"{where} failed to build the {key.direction} graph on "
                           f"cuda:{key.device}: {type(error).__name__}: {error}") from error


class GraphCache:
    """Built graphs and cuDNN's genuine declines, by GraphKey; FIFO-bounded.

    Built under one lock (a cold build takes about a second; racing builders would waste it). A
    failed build stores nothing: its error reaches the caller, and the next ``get`` builds again.
    ``discard`` drops what was built for one problem (``Plan.free`` through the SKU's
    ``release``), ``clear`` everything (``clear_caches``). Hits and misses are logged at DEBUG.
    """

    def __init__(self, capacity: int = 256,
                 build: Callable[[GraphKey], BuiltGraph | Declined] = _build):
        self._capacity = capacity
        self._build = build
        self._entries: OrderedDict[GraphKey, BuiltGraph | Declined] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: GraphKey) -> BuiltGraph | Declined:
        found = self._entries.get(key)
        if found is None:
            with self._lock:
                found = self._entries.get(key)  # another thread may have built it meanwhile
                if found is None:
                    LOG.debug("cuDNN graph cache miss: %s", key)
                    found = self._entries[key] = self._build(key)
                    while len(self._entries) > self._capacity:
                        self._entries.popitem(last=False)
                    return found
        LOG.debug("cuDNN graph cache hit: %s", key)
        return found

    def discard(self, desc: Problem, direction: str | None = None,
                variant: bool | None = None) -> None:
        """Drops what was built (or declined) for ``desc`` on every device; ``direction`` and
        ``variant`` narrow it to one SKU's graphs."""
        with self._lock:
            for key in list(self._entries):
                if key.desc == desc and (direction is None or key.direction == direction) and (
                        variant is None or key.variant == variant):
                    del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


GRAPHS = GraphCache()


def built_or_unfit(key) -> BuiltGraph | Unfit:
    """The graph for ``key`` from GRAPHS, or selection's verdict on why there is none: cuDNN's
    decline (cached), a failed build (not cached: the next selection builds again), or no
    cuDNN."""
    try:
        built = GRAPHS.get(key)
    except BackendUnavailable as error:
        return Unfit(ReasonCode.backend_unavailable, str(error))
    except LaunchFailed as error:
        return Unfit(ReasonCode.build_failed, str(error))
    if isinstance(built, Declined):
        return Unfit(ReasonCode.feature_unsupported, built.reason)
    return built


def forward_graph(desc: SdpaDescriptor, device: int, *, dump_dropout: bool = False
                  ) -> BuiltGraph | Declined:
    return GRAPHS.get(GraphKey("forward", desc, device, dump_dropout))


def backward_graph(desc: SdpaBackwardDescriptor, device: int, *, deterministic: bool
                   ) -> BuiltGraph | Declined:
    return GRAPHS.get(GraphKey("backward", desc, device, deterministic))
