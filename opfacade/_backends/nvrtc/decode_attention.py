"""The split-KV decode attention and kv_append SKUs (issue 13) over native/decode_attention.cu
(launched by ``decode.py``): ``decode_attention.nvrtc.{f32,f16,bf16}`` and
``kv_append.nvrtc.{f32,f16,bf16}``.

Decode splits each sequence's keys into chunks of a fixed 512, computes the query heads of a kv
head's group together (each K and V byte read once per row tile), and merges the chunks in
order: deterministic and batch-invariant by construction, with every sum in f32. In f16/bf16,
kv heads of up to 8 query rows at D 128 run on the kq tile and those of more than 4 rows at
D 64, or more than 8 at D 128, on the 16-row tile (both mma.sync, f32 accumulators); the rest
on CUDA cores in f32 (decode.py's row_tile).
A plan covers its descriptor's envelope: any batch up to ``batch``, any lengths up to the
capacity, read on the device only, so one captured CUDA graph replays for new lengths, page
tables and batch compositions.
"""

from __future__ import annotations

from ..._internal.contract import BoundArgs
from ..._internal.limits import (
    GRID_YZ_MAX,
    INT32_MAX,
    Limit,
    check,
    workspace_limit,
)
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.decode_attention import DECODE_ATTENTION, DecodeAttentionDescriptor
from ...contracts.kv_append import KV_APPEND, KvAppendDescriptor
from ...errors import LayoutMismatch
from ...types import ArchSku, BackendKind, ElementKind, MathPrecision, PrecisionGuarantee
from . import decode as kernels
from . import kv_cache
from .launch import available

__all__ = ["APPEND_SKUS", "DECODE_SKUS"]

ELEMENTS = (ElementKind.f32, ElementKind.f16, ElementKind.bf16)
# ||out - ref|| <= bound ||mag|| + ||ufl|| (catalog/PRECISION.md). Every exp and sum is f32 and
# the products of elements are exact. The weights stay f32 on CUDA cores; on tensor cores each
# is carried as a high and a low half of the element type (16 significant bits for bf16, 22 for
# f16), never rounded to one. So the output's own rounding dominates: 2^-9 relative for bf16,
# 2^-12 for f16, a few f32 roundings of the magnitude for f32. The bounds keep room above those
# for long caches.
DECODE_BOUNDS = {ElementKind.f32: 5e-6, ElementKind.f16: 1e-3, ElementKind.bf16: 5e-3}
COPY_BOUND = 1e-12  # kv_append copies bits: any error at all is a bug
ARCH = ArchSku.sm80
LAYOUT = "q [b,T,Hq,D] strided; caches dense nhd|hnd, 16-byte aligned; lse [b,T,Hq] f32"


def _guarantee(bound: float) -> PrecisionGuarantee:
    return PrecisionGuarantee(math_precision=MathPrecision.f32, accumulator=ElementKind.f32,
                              deterministic=True, bit_stable=True, batch_invariant=True,
                              max_rel_error=bound, capture_safe=True)


def _pool_pages(args: BoundArgs, desc) -> int:
    return args["k_cache"].shape[0] if desc.cache == "paged" else 0


def _expect_dense_cache(desc, args: BoundArgs) -> None:
    """Caches (or their address arrays) dense in their own layout, cache tensors 16-byte
    aligned; tables and lengths dense."""
    for name in ("k_cache", "v_cache", "seq_lens", "page_table"):
        view = args[name]
        if view is None:
            continue
        if not view.is_contiguous:
            raise LayoutMismatch(f"{name} must be dense in its own layout (C order), got strides "
                                 f"{view.strides} for shape {view.shape}", argument=name)
        if name in ("k_cache", "v_cache") and desc.cache != "pointers":
            expect_aligned(view, name, 16)


def _strides(view: TensorView) -> tuple[int, int, int]:
    """(batch, token, head) strides of a [b, T, H, D] view."""
    return view.strides[0], view.strides[1], view.strides[2]


def _unfit_common(desc) -> Unfit | None:
    if desc.element not in ELEMENTS:
        return Unfit(ReasonCode.element_unsupported,
                     f"serves {', '.join(e.value for e in ELEMENTS)}; problem is "
                     f"{desc.element.value}")
    if desc.head_dim not in kernels.DIMS or desc.dim_v != desc.head_dim:
        return Unfit(ReasonCode.shape_unsupported,
                     f"head_dim = head_dim_v in {kernels.DIMS} (the kernels are built per "
                     f"head dim); problem has head_dim={desc.head_dim}, "
                     f"head_dim_v={desc.dim_v}")
    return None


def _decode_workspace(desc: DecodeAttentionDescriptor) -> int:
    return kernels.workspace_bytes(desc.batch, desc.heads_q, desc.q_len, desc.capacity,
                                   desc.dim_v)


def _capacity(desc) -> int:
    return desc.capacity


CAPACITY_LIMIT = Limit("capacity", "capacity (page_size*max_pages or max_seq)", "tokens",
                       "the kernels' int positions", INT32_MAX, _capacity,
                       "native/decode_attention.cu: `int` positions and capacity")

DECODE_LIMITS: tuple[Limit[DecodeAttentionDescriptor], ...] = (
    CAPACITY_LIMIT,
    Limit("chunks", f"capacity / {kernels.CHUNK}", "chunks", "the partial grid's y extent",
          GRID_YZ_MAX, lambda d: kernels.chunks(d.capacity),
          "decode.py: partial grid (heads_kv x tiles, chunks, batch)"),
    Limit("batch", "batch", "sequences", "the partial grid's z extent", GRID_YZ_MAX,
          lambda d: d.batch, "decode.py: partial grid (heads_kv x tiles, chunks, batch)"),
    Limit("heads_q", "heads_q", "query heads", "the merge grid's y extent", GRID_YZ_MAX,
          lambda d: d.heads_q, "decode.py: merge grid (batch, heads_q, q_len)"),
    workspace_limit(_decode_workspace, "decode.workspace_bytes",
                    "the partials (Dv + 2 floats per query row and chunk)"),
)


class _KvCacheSku(SkuImpl):
    """What both families' SKUs share: one element each, NVRTC's availability, and the head
    dims and limits the kernels are built for."""

    element: ElementKind
    limits: tuple[Limit, ...]

    def unavailable(self) -> str | None:
        return available()

    def unfit(self, desc) -> Unfit | None:
        if desc.element is not self.element:
            return Unfit(ReasonCode.element_unsupported,
                         f"serves {self.element.value}, problem is {desc.element.value}")
        return _unfit_common(desc) or check(self.limits, desc)


class DecodeAttentionNvrtc(_KvCacheSku, SkuImpl[DecodeAttentionDescriptor]):
    limits = DECODE_LIMITS

    def __init__(self, element: ElementKind):
        self.element = element
        self.sku = DECODE_ATTENTION.sku(
            BackendKind.nvrtc, element, layout=LAYOUT, arch=ARCH,
            guarantee=_guarantee(DECODE_BOUNDS[element]),
            description="Split-KV decode: fixed 512-key chunks merged in order (deterministic, "
                        "batch-invariant), a kv head's query rows together; contiguous, paged "
                        "or per-sequence caches; GQA, q_len 1-8, window; f32 math. On sm_90 its "
                        "kernels launch as programmatic dependents of the stream's previous "
                        "kernel and wait for it before touching memory.")

    def workspace_size(self, desc: DecodeAttentionDescriptor) -> int:
        return _decode_workspace(desc)

    def check_args(self, desc: DecodeAttentionDescriptor, args: BoundArgs) -> None:
        _expect_dense_cache(desc, args)
        lse = args["lse"]
        if lse is not None and not lse.is_contiguous:
            raise LayoutMismatch(f"lse must be dense [b, q_len, heads_q], got strides "
                                 f"{lse.strides}", argument="lse")

    def prepared(self, desc: DecodeAttentionDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        q, out, lse, table = args["q"], args["out"], args["lse"], args["page_table"]
        cache = kv_cache.DecodeCache.of(desc, _pool_pages(args, desc))
        sequences = q.shape[0]
        window = None if desc.window is None else desc.window.left
        table_ptr = 0 if table is None else table.ptr
        call = kernels.decode_call(
            desc.element, q.device, cache, sequences, desc.heads_q, desc.q_len,
            desc.softmax_scale, window, q.ptr, _strides(q), args["k_cache"].ptr,
            args["v_cache"].ptr, table_ptr, args["seq_lens"].ptr, out.ptr, _strides(out),
            None if lse is None else lse.ptr, workspace.ptr, stream)
        if not desc.checked:
            return call
        return kv_cache.check_call(q.device, cache, sequences, desc.q_len, args["k_cache"].ptr,
                                  args["v_cache"].ptr, table_ptr, args["seq_lens"].ptr, stream,
                                  call)


APPEND_LIMITS: tuple[Limit[KvAppendDescriptor], ...] = (
    CAPACITY_LIMIT,
    # A head's key (or value) fits one CTA's threads at every head dim built (DIMS): at most
    # 256 * 4 / 16 = 64 of kv_append's 1024.
    Limit("head_groups", "2 x heads_kv/heads per CTA", "CTAs", "the grid's z extent", 65535,
          lambda d: kv_cache.append_shape(kv_cache.DecodeCache.of(d), d.element, 1, 1)[0][2],
          "native/kv_append.cu: kv_append's grid (sequences, q_len, 2 x head groups)"),
)


class KvAppendNvrtc(_KvCacheSku, SkuImpl[KvAppendDescriptor]):
    limits = APPEND_LIMITS

    def __init__(self, element: ElementKind):
        self.element = element
        self.sku = KV_APPEND.sku(
            BackendKind.nvrtc, element, layout="k_new, v_new [b,T,Hkv,D] strided (strides "
            "< 2 GiB), 16-byte vectors; caches dense nhd|hnd, 16-byte aligned", arch=ARCH,
            guarantee=_guarantee(COPY_BOUND),
            description="One launch writes every sequence's new keys and values at their "
                        "positions, 16 bytes a thread; positions outside a sequence's capacity "
                        "or pages outside the pool are skipped. On sm_90 it launches as a "
                        "programmatic dependent of the stream's previous kernel: it may start "
                        "while that kernel ends and waits for it before its first load.")

    def check_args(self, desc: KvAppendDescriptor, args: BoundArgs) -> None:
        _expect_dense_cache(desc, args)
        vec = 16 // desc.element.itemsize
        for name in ("k_new", "v_new"):
            view = args[name]
            expect_aligned(view, name, 16)
            strides = _strides(view)
            if any(stride % vec for stride in strides):
                raise LayoutMismatch(f"{name} must have batch, token and head strides that are "
                                     f"multiples of {vec} elements (16 bytes), got "
                                     f"{view.strides}", argument=name)
            widest = max(abs(stride) for stride in strides) * desc.element.itemsize
            if widest >= kv_cache.APPEND_STRIDE_BYTES:
                raise LayoutMismatch(f"{name} must have batch, token and head strides below "
                                     f"{kv_cache.APPEND_STRIDE_BYTES} bytes, got {view.strides} "
                                     f"({widest} bytes)", argument=name)

    def prepared(self, desc: KvAppendDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        k_new, v_new, table = args["k_new"], args["v_new"], args["page_table"]
        cache = kv_cache.DecodeCache.of(desc, _pool_pages(args, desc))
        sequences = k_new.shape[0]
        table_ptr = 0 if table is None else table.ptr
        call = kv_cache.append_call(
            desc.element, k_new.device, cache, sequences, desc.q_len, k_new.ptr,
            _strides(k_new), v_new.ptr, _strides(v_new), args["k_cache"].ptr,
            args["v_cache"].ptr, table_ptr, args["seq_lens"].ptr, stream)
        if not desc.checked:
            return call
        return kv_cache.check_call(k_new.device, cache, sequences, desc.q_len,
                                  args["k_cache"].ptr, args["v_cache"].ptr, table_ptr,
                                  args["seq_lens"].ptr, stream, call)


DECODE_SKUS = {DECODE_ATTENTION.name: tuple(DecodeAttentionNvrtc(e) for e in ELEMENTS)}
APPEND_SKUS = {KV_APPEND.name: tuple(KvAppendNvrtc(e) for e in ELEMENTS)}
