"""ALiBi forward and backward as bespoke NVRTC kernels (native/alibi.cu), one SKU per element.

What the kernels can index is data (``FORWARD_LIMITS``, ``BACKWARD_LIMITS``), checked first by
each SKU's ``unfit``. Indices that cannot overflow are left out of the tables: query_len and
key_len are below 2**24 (the descriptor's bound) in ``int``; the forward's grid has at most
MAX_FORWARD_BLOCKS blocks; the backward's rows per chunk are at most BYTES_PER_CHUNK / 2 in
``int``, and its per-head row index (``i64``) stays below chunks * rows per chunk, which the
chunk limits keep under 2**48.
"""

from __future__ import annotations

import functools

import numpy as np

from ..._internal.contract import BoundArgs, OpContract
from ..._internal.limits import (
    GRID_X_MAX,
    GRID_YZ_MAX,
    INT32_MAX,
    INT64_MAX,
    Limit,
    check,
    workspace_limit,
)
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.alibi import (
    ALIBI_BACKWARD,
    ALIBI_FORWARD,
    AlibiBackwardDescriptor,
    AlibiForwardDescriptor,
    accumulator,
)
from ...types import ArchSku, BackendKind, ElementKind, KernelSku, MathPrecision, PrecisionGuarantee
from .launch import available, get_kernel, launch, pointer

__all__ = ["BACKWARD_LIMITS", "FORWARD_LIMITS", "SKUS", "backward_chunking"]

SOURCE = "alibi.cu"
ELEMENTS = (ElementKind.f64, ElementKind.f32, ElementKind.f16, ElementKind.bf16)
THREADS = 256
WARPS = THREADS // 32
# The forward walks rows with a grid-stride loop; more blocks than this only adds scheduling.
MAX_FORWARD_BLOCKS = 16384
# Bytes one backward block reads: large enough to amortise the block's reduction, small enough to
# give thousands of blocks at training sizes. Fixed, so the reduction order depends on the
# problem alone (never on the device).
BYTES_PER_CHUNK = 256 * 1024


def _forward_bound(element: ElementKind) -> float:
    # One fma in the accumulator, then one rounding to the output: 2u of the output covers both.
    return 2 * element.unit_roundoff


def _backward_bound(element: ElementKind) -> float:
    # dA is an exact copy; dslope sums up to ~1e9 terms in the accumulator, in fixed blocks and
    # then a tree, so its error stays near sqrt(terms) roundings: far under 1e-5 (f32) on random
    # inputs (measured worst 7e-7 on an H100).
    return 1e-13 if element is ElementKind.f64 else 1e-5


def _vector_ok(views: list[TensorView], element: ElementKind) -> bool:
    """16-byte packs need each row start 16-byte aligned: base pointer and row strides."""
    per_pack = 16 // element.itemsize
    return all(v.ptr % 16 == 0 and all(s % per_pack == 0 for s in v.strides[:-1]) for v in views)


def _sku(op: OpContract, element: ElementKind, bound: float, description: str) -> KernelSku:
    acc = accumulator(element)
    guarantee = PrecisionGuarantee(math_precision=MathPrecision(acc.value), accumulator=acc,
                                   deterministic=True, bit_stable=True, max_rel_error=bound)
    return op.sku(BackendKind.nvrtc, element, guarantee=guarantee, aux_element=acc,
                  layout="bhqk,k-contiguous", arch=ArchSku.sm80, description=description)


def backward_chunking(desc: AlibiBackwardDescriptor) -> tuple[int, int]:
    """(rows_per_chunk, chunks) for one head's B*Q rows: a function of the problem alone."""
    rows_per_head = desc.batch * desc.query_len
    row_bytes = desc.key_len * desc.element.itemsize
    rows = max(WARPS, -(-BYTES_PER_CHUNK // row_bytes))
    rows = -(-rows // WARPS) * WARPS
    rows = min(rows, rows_per_head)
    return rows, -(-rows_per_head // rows)


def _rows(desc: AlibiForwardDescriptor) -> int:
    return desc.batch * desc.heads * desc.query_len


def _elements(desc: AlibiForwardDescriptor | AlibiBackwardDescriptor) -> int:
    return desc.batch * desc.heads * desc.query_len * desc.key_len


def _slope_chunks(desc: AlibiBackwardDescriptor) -> int | None:
    return backward_chunking(desc)[1] if desc.need_slope_grad else None


def _partials_bytes(desc: AlibiBackwardDescriptor) -> int:
    _, chunks = backward_chunking(desc)
    return Workspace.round_up(desc.heads * chunks * accumulator(desc.element).itemsize)


_HEADS = "heads"
_ELEMENTS = Limit(
    "elements", "batch*heads*query_len*key_len", "elements of each score tensor",
    "the kernel's int64 element offsets", INT64_MAX, _elements,
    "native/alibi.cu: b * sb + h * sh + i * sq with i64 strides, then + j")
# The forward's grid-stride loop adds up to MAX_FORWARD_BLOCKS * WARPS to an i64 row below
# `rows`: rows stay that far below INT64_MAX so the step cannot overflow.
FORWARD_LIMITS: tuple[Limit[AlibiForwardDescriptor], ...] = (
    Limit(_HEADS, _HEADS, "heads", "the forward kernel's int heads", INT32_MAX,
          lambda d: d.heads, "native/alibi.cu alibi_forward: `int heads`, `int h`"),
    Limit("rows", "batch*heads*query_len", "rows", "the kernel's int64 row index",
          INT64_MAX - MAX_FORWARD_BLOCKS * WARPS + 1, _rows,
          "native/alibi.cu alibi_forward: `i64 rows`, `row += warp_stride`"),
    _ELEMENTS,
)
# The backward's grid is (chunks, heads); the finalize walks a head's chunks with an int index
# stepping by the block size, so with dslope the chunks stay a block below INT32_MAX.
BACKWARD_LIMITS: tuple[Limit[AlibiBackwardDescriptor], ...] = (
    Limit(_HEADS, _HEADS, "heads", "the grid's y extent (one block row per head)", GRID_YZ_MAX,
          lambda d: d.heads, "alibi_backward_partials is launched on (chunks, heads) blocks"),
    _ELEMENTS,
    Limit("chunks", "batch*query_len / rows per chunk", "chunks per head",
          "the grid's x extent", GRID_X_MAX, lambda d: backward_chunking(d)[1],
          "alibi_backward_partials is launched on (chunks, heads) blocks"),
    Limit("finalize chunks", "batch*query_len / rows per chunk", "chunks per head",
          "the finalize's int chunk index (c += blockDim.x)", INT32_MAX - THREADS + 1,
          _slope_chunks, "native/alibi.cu alibi_backward_finalize: `int chunks`, `int c`"),
    workspace_limit(lambda d: _partials_bytes(d) if d.need_slope_grad else None,
                    "one f32/f64 partial per (head, chunk)", "heads*chunks dslope partials"),
)


class _AlibiNvrtc(SkuImpl):
    limits: tuple[Limit, ...]  # what its kernels can index, checked before anything else

    def __init__(self, sku: KernelSku):
        self.sku = sku
        self.element = sku.element

    def unfit(self, desc: AlibiForwardDescriptor | AlibiBackwardDescriptor) -> Unfit | None:
        if desc.element is not self.element:
            return Unfit(ReasonCode.element_unsupported,
                         f"serves {self.element}, problem is {desc.element}")
        return check(self.limits, desc)

    def unavailable(self) -> str | None:
        return available()

    def check_args(self, desc: AlibiForwardDescriptor | AlibiBackwardDescriptor,
                   args: BoundArgs) -> None:
        # Element alignment is what the scalar path needs; 16-byte packs are used when possible.
        for name, view in args.present().items():
            expect_aligned(view, name, view.element.itemsize)


class AlibiForwardNvrtc(_AlibiNvrtc, SkuImpl[AlibiForwardDescriptor]):
    limits = FORWARD_LIMITS

    def __init__(self, element: ElementKind):
        super().__init__(_sku(
            ALIBI_FORWARD, element, _forward_bound(element),
            "Y = A + slope[h]*(j - i), one fma in the accumulator type; in place allowed."))

    def prepared(self, desc: AlibiForwardDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        x, out, slopes = args["input"], args["output"], args["slopes"]
        rows = desc.batch * desc.heads * desc.query_len
        blocks = min(-(-rows // WARPS), MAX_FORWARD_BLOCKS)
        kernel = get_kernel(SOURCE, f"alibi_forward_{self.element}", x.device)
        arguments = (
            pointer(x), pointer(out), pointer(slopes), np.int64(rows), np.int32(desc.heads),
            np.int32(desc.query_len), np.int32(desc.key_len),
            *(np.int64(s) for s in x.strides[:3]), *(np.int64(s) for s in out.strides[:3]),
            np.int32(_vector_ok([x, out], self.element)),
        )
        return functools.partial(launch, kernel, (blocks,), (THREADS,), arguments, stream,
                                 x.device)


class AlibiBackwardNvrtc(_AlibiNvrtc, SkuImpl[AlibiBackwardDescriptor]):
    limits = BACKWARD_LIMITS

    def __init__(self, element: ElementKind):
        super().__init__(_sku(
            ALIBI_BACKWARD, element, _backward_bound(element),
            "dA = dY; dslope[h] = sum dY*(j - i) in fixed-order blocks (no atomics), "
            "then a fixed tree over each head's partials."))

    def workspace_size(self, desc: AlibiBackwardDescriptor) -> int:
        return _partials_bytes(desc) if desc.need_slope_grad else 0

    def prepared(self, desc: AlibiBackwardDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        dy, d_in, d_slopes = args["grad_output"], args["grad_input"], args["grad_slopes"]
        device = dy.device
        if d_in is not None and d_in.same_layout(dy):
            d_in = None  # dA aliases dY exactly: dA = dY is already true
        launches = []
        if d_in is None and d_slopes is None:
            return lambda: None
        rows_per_chunk, chunks = backward_chunking(desc)
        partials = workspace.ptr if d_slopes is not None else 0
        din_strides = d_in.strides[:3] if d_in is not None else (0, 0, 0)
        kernel = get_kernel(SOURCE, f"alibi_backward_partials_{self.element}", device)
        launches.append(functools.partial(launch, kernel, (chunks, desc.heads), (THREADS,), (
            pointer(dy), pointer(d_in), np.uint64(partials), np.int32(desc.query_len),
            np.int32(desc.key_len), np.int64(desc.batch * desc.query_len),
            np.int32(rows_per_chunk), *(np.int64(s) for s in dy.strides[:3]),
            *(np.int64(s) for s in din_strides),
            np.int32(_vector_ok([v for v in (dy, d_in) if v is not None], self.element)),
        ), stream, device))
        if d_slopes is not None:
            finalize = get_kernel(SOURCE, f"alibi_backward_finalize_{accumulator(self.element)}",
                                  device)
            launches.append(functools.partial(
                launch, finalize, (desc.heads,), (THREADS,),
                (np.uint64(partials), pointer(d_slopes), np.int32(chunks)), stream, device))

        def run_in_order() -> None:
            for step in launches:
                step()

        return run_in_order


SKUS = {
    ALIBI_FORWARD.name: tuple(AlibiForwardNvrtc(e) for e in ELEMENTS),
    ALIBI_BACKWARD.name: tuple(AlibiBackwardNvrtc(e) for e in ELEMENTS),
}
