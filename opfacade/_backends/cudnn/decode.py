"""The cuDNN decode SKUs (f16, bf16): decode_attention over a paged or a contiguous cache through
cuDNN's SDPA graph (issue 13), an alternative to the NVRTC split-KV SKUs that a caller picks with
``PlanPreference(backends={"cudnn"})``.

One graph per (descriptor, device, ``CacheLayout``), built in graphs.py's fixed order and cached
in ``graphs.GRAPHS``:

    q, out      [b, 1, Hq, D] as [B, Hq, 1, D], their batch and head strides
    k, v        paged: the page pools as cuDNN's containers [P, Hkv, page_size, D] (an nhd pool
                [P, page_size, Hkv, D] with strides (page_size*Hkv*D, D, Hkv*D, 1), an hnd one
                [P, Hkv, page_size, D] in C order; P is the pool's page count), with
                ``paged_attention_max_seq_len_kv`` the envelope's capacity;
                contiguous: the caches as [B, Hkv, max_seq, D] (nhd [B, max_seq, Hkv, D] with
                strides (max_seq*Hkv*D, D, Hkv*D, 1), hnd in C order)
    page_table  paged: int32 [b, max_pages] as both the k and the v table [B, 1, max_pages, 1]
    seq_lens    int32 [b] as seq_len_kv [B, 1, 1, 1]
    seq_len_q   all ones [B, 1, 1, 1], in the plan's workspace
    lse         [b, 1, Hq] f32 as the stats [B, Hq, 1, 1], when save_lse

with the padding mask on. No causal mask, ever: one query per sequence attends to every key it
holds, so q_len 1 needs none, and cuDNN's release notes list a known bug, decode with a causal
mask and Hq != Hkv giving wrong results.

The contiguous form is the graph "torch sdpa" runs for a batch of full caches, plus the padding
mask. On an H200 (bf16 d 128, q_len 1, scripts/decode_rows_probe.py; record
catalog/probes/decode_many_rows_H200.json) this SKU read 100.0% of a device copy where the NVRTC
SKU read 98.3% (B64 S4096, GQA 4), 73.9% against 56.8% on MQA (B64 S32768, Hq 32, Hkv 1: two
of the NVRTC SKU's 16-row tiles a kv head) and 97.7% against 88.1% at Hq 128, Hkv 8. It splits no
sequence, so a batch of few long sequences is the NVRTC SKU's (MQA B1 S32768: 0.044 against
0.020 ms), it runs the envelope's whole batch, and it is neither deterministic nor
batch-invariant: selection keeps the NVRTC SKU first.

The graph's B is the descriptor's ``batch``: a call with fewer sequences cannot be described to
the built graph without another build, so it is a ShapeMismatch naming q (pad the batch with
sequences of length 0). A pool of another page count than the one selection built for (the
signature's, ``verification_pages``) gets its own graph on first use.

One prepared call, in stream order: checked mode's ``kv_cache_check`` (the NVRTC family's, with a
host sync); ``cuMemsetD32Async`` of the ones; the graph; ``sdpa_padding_rows``
(native/sdpa_edges.cu), which gives sequences of length 0 out 0 and lse -inf, rows cuDNN's
padded SDPA leaves unwritten (sdpa.py; nothing in the frontend's documentation promises
otherwise for decode). Unchecked, nothing is read on the host, so the call may be captured and
replayed with new lengths (and tables).

What nothing checks, explain prints beside the verdict (``note``): the call's batch is the
envelope's; cuDNN reads whole tiles of keys, possibly past a sequence's length, so those slots
must be finite (and, paged, every table entry a page of the pool); unchecked runs trust
seq_lens (checked mode tests them and the pages in use).

The paged declaration is the bench's raw peer graph (``_bench/decode_peers.py``), which built and
matched the NVRTC SKU on an H100 with cuDNN 9.19; these SKUs' own GPU tests are the cuDNN section
of tests/test_decode_attention_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..._internal.contract import BoundArgs
from ..._internal.device import current_device, on_device
from ..._internal.limits import INT32_MAX, Limit, check, workspace_limit
from ..._internal.selection import Target
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ..._internal.view import c_strides
from ...contracts.decode_attention import DECODE_ATTENTION, DecodeAttentionDescriptor
from ...contracts.kv_cache import cache_shape, verification_pages
from ...errors import BufferTooSmall, LaunchFailed, LayoutMismatch, ShapeMismatch, Unsupported
from ...types import ArchSku, BackendKind, ElementKind, MathPrecision, PrecisionGuarantee
from ..nvrtc import kv_cache as nvrtc_kv_cache
from ..nvrtc import launch as nvrtc_launch
from ..nvrtc.sdpa_edges import PaddingRows
from . import graphs, limits, runtime
from .graphs import Uid, _Builder
from .sdpa import FORWARD_BOUND, TENSOR_ALIGNMENT
from .selection import GraphSelection

__all__ = ["CACHES", "DIMS", "PAGED_RULES", "SKUS", "CacheLayout", "DecodeAttentionCudnn",
           "DecodeKey", "declare", "direction", "note"]

CACHES = ("paged", "contiguous")  # the cache forms these SKUs serve
DIMS = (64, 128, 256)  # D = Dv: what cuDNN 9.19 builds decode for (both forms, GPU tests)
TABLE_K_UID, TABLE_V_UID = 40, 41  # past every Uid and ragged.py's offsets
LAYOUT = ("q, out [B,1,Hq,D] (B the envelope's), d-contiguous, 16-byte steps; paged pools or "
          "contiguous caches dense nhd|hnd; lse [B,1,Hq] f32 dense")
# What explain says beside a viable verdict: the preconditions nothing checks unchecked.
_NOTE = ("runs the envelope's batch; {where} (cuDNN may read whole tiles past a length and weigh "
         "them by 0, and 0 * NaN is NaN); unchecked, seq_lens are trusted as given")
_NOTE_WHERE = {"paged": "every entry of a page table row must be a page of the pool, its slots "
                        "past the sequence's length finite",
               "contiguous": "a cache's slots past its sequence's length must be finite"}

PAGED_VERSION = 90500  # sdpa_support_surface.h: paged caches need cuDNN 9.5.0
WIDE_PAGED_VERSION = 91000  # ... and head dims above 128 more than 9.9

PAGED_RULES: tuple[limits.Rule, ...] = (
    limits.Rule("paged before 9.5", ReasonCode.version_blocked,
                lambda f, c: c.version is not None and c.version < PAGED_VERSION,
                lambda f, c: f"paged caches need cuDNN {limits.format_version(PAGED_VERSION)}, "
                             f"found {limits.format_version(c.version)}"),
    limits.Rule("wide paged before 9.10", ReasonCode.version_blocked,
                lambda f, c: (c.version is not None and c.version < WIDE_PAGED_VERSION
                              and max(f.head_dim, f.head_dim_v) > 128),
                lambda f, c: f"paged caches with head dims above 128 need cuDNN "
                             f"{limits.format_version(WIDE_PAGED_VERSION)}, found "
                             f"{limits.format_version(c.version)}"),
)
LIMITS: tuple[Limit[DecodeAttentionDescriptor], ...] = (
    Limit("capacity", "page_size*max_pages", "tokens",
          "cuDNN's int32 sequence lengths (seq_len_kv, paged_attention_max_seq_len_kv)",
          INT32_MAX, lambda d: d.capacity if d.cache == "paged" else None,
          "cudnn-frontend: seq_len_kv is an INT32 [B, 1, 1, 1] tensor"),
    Limit("max_seq", "max_seq", "tokens", "cuDNN's int32 sequence lengths (seq_len_kv)",
          INT32_MAX, lambda d: d.max_seq if d.cache == "contiguous" else None,
          "cudnn-frontend: seq_len_kv is an INT32 [B, 1, 1, 1] tensor"),
)
WORKSPACE = workspace_limit(lambda size: size, "the built graph's plus the ones of seq_len_q",
                            "the workspace")


def direction(desc: DecodeAttentionDescriptor) -> str:
    """The GraphKey direction of ``desc``'s graphs: one a cache form."""
    return f"{desc.cache}_decode"


def note(desc: DecodeAttentionDescriptor) -> str:
    """What explain prints beside a viable verdict for ``desc``."""
    return _NOTE.format(where=_NOTE_WHERE[desc.cache])


@dataclass(frozen=True)
class CacheLayout:
    """What a graph is declared for beyond the descriptor: q's and out's (batch, head) strides
    in elements, and a paged pool's page count (0 for a contiguous cache, whose rows are the
    envelope's batch)."""

    q: tuple[int, int]
    out: tuple[int, int]
    pages: int

    @classmethod
    def compact(cls, desc: DecodeAttentionDescriptor) -> CacheLayout:
        """Freshly allocated tensors and the signature's pool: what selection builds for."""
        return cls((desc.heads_q * desc.head_dim, desc.head_dim),
                   (desc.heads_q * desc.dim_v, desc.dim_v),
                   verification_pages(desc) if desc.cache == "paged" else 0)

    @classmethod
    def of(cls, desc: DecodeAttentionDescriptor, views: dict[str, TensorView | None]
           ) -> CacheLayout:
        q, out = views["q"], views["out"]
        return cls((q.strides[0], q.strides[2]), (out.strides[0], out.strides[2]),
                   views["k_cache"].shape[0] if desc.cache == "paged" else 0)


class DecodeKey(NamedTuple):
    """A decode graph's cache key (graphs.GraphCache reads direction, desc, variant)."""

    direction: str
    desc: DecodeAttentionDescriptor
    device: int
    variant: bool
    layout: CacheLayout

    def __str__(self) -> str:
        return (f"{self.desc.cache} decode graph on cuda:{self.device} for {self.desc!r} with "
                f"{self.layout}")

    def declare(self, handle: object) -> _Builder:
        return declare(self, handle)


def _cache(desc: DecodeAttentionDescriptor, dim: int, layout: CacheLayout
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(dims, strides) of a dense cache (``cache_shape``: a paged pool's pages, a contiguous
    cache's sequences, nhd or hnd) as cuDNN's container [rows, Hkv, tokens, D]."""
    shape = cache_shape(desc, dim, layout.pages if desc.cache == "paged" else desc.batch)
    strides = c_strides(shape)
    order = (0, 2, 1, 3) if desc.kv_layout == "nhd" else (0, 1, 2, 3)  # nhd: [rows, tokens, ...]
    return tuple(shape[i] for i in order), tuple(strides[i] for i in order)


def declare(key: DecodeKey, handle: object) -> _Builder:
    """The decode graph with its tensors and the sdpa node declared, nothing built."""
    desc, layout = key.desc, key.layout
    b = _Builder(desc, handle)
    i32 = b.cudnn.data_type.INT32
    batch, hq, mp = desc.batch, desc.heads_q, desc.max_pages
    (qb, qh), (ob, oh) = layout.q, layout.out
    q = b.tensor(Uid.Q, (batch, hq, 1, desc.head_dim), (qb, qh, qb, 1), name="q")
    k = b.tensor(Uid.K, *_cache(desc, desc.head_dim, layout), name="k_cache")
    v = b.tensor(Uid.V, *_cache(desc, desc.dim_v, layout), name="v_cache")
    lengths = ((batch, 1, 1, 1), (1, 1, 1, 1), i32)
    seq_len_q = b.tensor(Uid.SEQ_LEN_Q, *lengths, name="seq_len_q")
    seq_len_kv = b.tensor(Uid.SEQ_LEN_KV, *lengths, name="seq_lens")
    paged = {}
    if desc.cache == "paged":
        table = ((batch, 1, mp, 1), (mp, mp, 1, 1), i32)
        paged = dict(
            paged_attention_k_table=b.tensor(TABLE_K_UID, *table, name="page_table_k"),
            paged_attention_v_table=b.tensor(TABLE_V_UID, *table, name="page_table_v"),
            paged_attention_max_seq_len_kv=desc.capacity)
    # No causal mask (the module docstring says why): the padding mask alone.
    out, stats = b.graph.sdpa(
        q, k, v, name=direction(desc), attn_scale=float(desc.softmax_scale),
        use_padding_mask=True, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv,
        generate_stats=bool(desc.save_lse), **paged)
    b.output(out, Uid.O, (batch, hq, 1, desc.dim_v), (ob, oh, ob, 1), name="out")
    if desc.save_lse:  # lse [B, 1, Hq] dense
        b.output(stats, Uid.STATS, (batch, hq, 1, 1), (hq, 1, hq, 1), b.f32, name="lse")
    return b


def _fill_ones(ptr: int, count: int, stream: int) -> None:
    """``count`` int32 ones at ``ptr``, enqueued on ``stream`` (a memset node when captured)."""
    from cuda.bindings import driver

    (status,) = driver.cuMemsetD32Async(ptr, 1, count, stream)
    if status != driver.CUresult.CUDA_SUCCESS:
        raise LaunchFailed(f"filling seq_len_q with ones failed: {status}")


class DecodeAttentionCudnn(GraphSelection, SkuImpl[DecodeAttentionDescriptor]):
    limits = LIMITS
    WORKSPACE = WORKSPACE

    def __init__(self, element: ElementKind):
        self.sku = DECODE_ATTENTION.sku(
            BackendKind.cudnn, element, layout=LAYOUT, arch=ArchSku.sm80,
            aux_element=ElementKind.f32,
            guarantee=PrecisionGuarantee(
                # cuDNN's tensor-core products take the probabilities rounded to the element,
                # as its dense SDPA does (sdpa.py): math in the element, sums in f32.
                math_precision=MathPrecision(element.value), accumulator=ElementKind.f32,
                deterministic=False, bit_stable=False,
                # Seen not bitwise run to run at batch >= 16 on an H100; nothing says a
                # sequence's bits are independent of the rest of the batch either.
                batch_invariant=False, max_rel_error=FORWARD_BOUND[element], capture_safe=True),
            description="cuDNN's SDPA graph for one query per sequence (no causal mask) over "
                        "a paged cache (its paged-attention tables) or a contiguous one, built "
                        "for the envelope's batch; lengths (and page tables) read on the "
                        "device; sequences of length 0 zeroed after it.")

    # -- selection -------------------------------------------------------------------------
    def _data_unfit(self, desc: DecodeAttentionDescriptor, ctx: limits.Context
                    ) -> Unfit | None:
        what = None
        if desc.cache not in CACHES:
            what = f"a paged or contiguous cache; problem has a {desc.cache} cache"
        elif desc.q_len != 1:
            what = f"q_len 1; problem has q_len {desc.q_len}"
        elif desc.window is not None:
            what = f"no sliding window; problem has window=({desc.window.left}, None)"
        if what is not None:
            return Unfit(ReasonCode.feature_unsupported, f"cuDNN decode serves {what}")
        if desc.head_dim not in DIMS or desc.dim_v != desc.head_dim:
            return Unfit(ReasonCode.shape_unsupported,
                         f"cuDNN decode serves head_dim = head_dim_v in {DIMS}; problem has "
                         f"head_dim={desc.head_dim}, head_dim_v={desc.dim_v}")
        facts = limits.Facts(
            direction="forward", element=desc.element, batch=desc.batch, heads_q=desc.heads_q,
            seq_q=1, seq_kv=desc.capacity, head_dim=desc.head_dim, head_dim_v=desc.dim_v,
            bias=None, alibi=False, dropout=False, padding=True, right_bound=None,
            left_bound=None, bottom_right=False, heads_kv=desc.heads_kv,
            workspace=self._workspace(desc, self._estimate(desc)))
        for rule in PAGED_RULES if desc.cache == "paged" else ():
            if rule.rejects(facts, ctx):
                return Unfit(rule.code, rule.why(facts, ctx))
        return limits.check(facts, ctx) or check(self.limits, desc)

    def _selection_key(self, desc: DecodeAttentionDescriptor, device: int) -> DecodeKey:
        return DecodeKey(direction(desc), desc, device, False, CacheLayout.compact(desc))

    def _workspace(self, desc: DecodeAttentionDescriptor, graph_bytes: int) -> int:
        """The graph's own, then seq_len_q's ones (int32 [B]), each on a 256-byte line."""
        return Workspace.round_up(graph_bytes) + Workspace.round_up(4 * desc.batch)

    def _estimate(self, desc: DecodeAttentionDescriptor) -> int:
        """The graph's workspace without a GPU: none assumed (the built graph's figure replaces
        it wherever selection has a device; a run that finds it short raises BufferTooSmall)."""
        return 0

    def plan_for(self, desc: DecodeAttentionDescriptor, pref, target: Target | None
                 ) -> tuple[int, str]:
        return self.workspace_size_on(desc, target), note(desc)

    def unavailable(self) -> str | None:
        return runtime.available() or nvrtc_launch.available()

    def release(self, desc: DecodeAttentionDescriptor) -> None:
        graphs.GRAPHS.discard(desc, direction(desc), False)  # every pool size and layout

    # -- running ---------------------------------------------------------------------------
    def check_args(self, desc: DecodeAttentionDescriptor, args: BoundArgs) -> None:
        sequences = args["q"].shape[0]
        if sequences != desc.batch:
            raise ShapeMismatch(
                f"q holds {sequences} sequences; the cuDNN decode SKU runs the envelope's "
                f"batch = {desc.batch}: pad the batch with seq_len 0 sequences", argument="q")
        for name in ("q", "out"):
            view = args[name]
            expect_aligned(view, name, TENSOR_ALIGNMENT)
            if view.strides[3] != 1 or any(
                    s * view.itemsize % TENSOR_ALIGNMENT for s in (view.strides[0],
                                                                    view.strides[2])):
                raise LayoutMismatch(
                    f"{name} must have unit stride along D and batch and head strides that are "
                    f"multiples of {TENSOR_ALIGNMENT // view.itemsize} elements (cuDNN loads "
                    f"{TENSOR_ALIGNMENT} bytes at a time), got strides {view.strides}",
                    argument=name)
        for name in ("k_cache", "v_cache", "page_table", "seq_lens", "lse"):
            view = args[name]
            if view is None:
                continue
            if not view.is_contiguous:
                raise LayoutMismatch(f"{name} must be dense in its own layout (C order), got "
                                     f"strides {view.strides} for shape {view.shape}",
                                     argument=name)
            expect_aligned(view, name, TENSOR_ALIGNMENT if view.element.is_float
                           else view.itemsize)

    def _graph_for_run(self, desc: DecodeAttentionDescriptor, device: int,
                       layout: CacheLayout, workspace: Workspace) -> graphs.BuiltGraph:
        built = graphs.GRAPHS.get(DecodeKey(direction(desc), desc, device, False, layout))
        if isinstance(built, graphs.Declined):
            raise Unsupported(f"{self.sku.id} cannot serve {layout} on cuda:{device}: "
                              f"{built.reason}")
        need = self._workspace(desc, built.workspace_size)
        if workspace.size < need:
            raise BufferTooSmall(
                f"workspace has {workspace.size} bytes; the graph built on cuda:{device} for "
                f"{layout} needs {need}", argument="workspace")
        return built

    def prepared(self, desc: DecodeAttentionDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None) -> Callable[[], None]:
        views = args.views
        device, stream = views["q"].device, stream or 0
        layout = CacheLayout.of(desc, views)
        built = self._graph_for_run(desc, device, layout, workspace)
        ones = workspace.ptr + Workspace.round_up(built.workspace_size)
        found = {name: view.ptr for name, view in args.present().items()}
        found["seq_len_q"] = ones
        if desc.cache == "paged":  # one table for both
            found.update(page_table_k=found["page_table"], page_table_v=found["page_table"])
        handle = runtime.handle_for(device)
        execute = built.launch.bind([found[name] for name in built.names], workspace.ptr,
                                    handle)
        out, lse = views["out"], views["lse"]
        fix = PaddingRows(desc.element, device, (desc.batch, desc.heads_q, 1, desc.dim_v),
                          (out.strides[0], out.strides[2], out.strides[1]),
                          None if lse is None else (lse.strides[0], lse.strides[2],
                                                    lse.strides[1]))
        zero_empty = fix.bind(out.ptr, None if lse is None else lse.ptr, ones,
                              found["seq_lens"], stream)
        set_stream, batch = runtime.stream_setter(), desc.batch
        elsewhere = current_device() != device

        def step() -> None:
            _fill_ones(ones, batch, stream)
            set_stream(handle, stream)
            execute()
            zero_empty()

        def run() -> None:
            if elsewhere:
                with on_device(device):  # cuDNN and the memset act on the current device
                    step()
            else:
                step()

        if not desc.checked:
            return run
        cache = nvrtc_kv_cache.DecodeCache.of(desc, layout.pages)
        return nvrtc_kv_cache.check_call(device, cache, batch, desc.q_len, found["k_cache"],
                                       found["v_cache"], found.get("page_table", 0),
                                       found["seq_lens"], stream, run)


SKUS = {DECODE_ATTENTION.name: tuple(DecodeAttentionCudnn(e) for e in limits.ELEMENTS)}
