"""The linear backward's activation step as one bespoke kernel (native/linear_grad.cu).

``d_pre = grad_out * act'(pre)`` for GELU (tanh or erf) and SiLU from the saved pre-activation,
or ReLU from cuBLASLt's bit-mask (the linear contract's activation table names each one's
kernel, ``ActivationSpec.d_pre``, and the aux it reads), with the bias gradient's column sums
reduced in a fixed order: per (chunk of rows, column) partials in the workspace, then one pass
adding each column's partials in chunk order. The chunking is a function of the problem alone,
never of the device, so the bias gradient is deterministic and bit-stable. It reads grad_out and
the aux once and writes d_pre once: the memory floor of the step (torch runs the same work as an
elementwise kernel and a separate sum).

``LIMITS``: what the kernel can index, as data (the backward SKUs check them at selection). Row
indices and strides are ``i64``; the grid is at most 2**24 column tiles by MAX_CHUNKS chunks; the
``int`` indices that can overflow are the column (a lane's ``j0``, ``j0 + 16 bytes``, a block's
``j``) and the rows per chunk, which few chunks over many rows make large.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._internal.limits import INT32_MAX, Limit
from ...contracts.linear import ActivationSpec, LinearBackwardDescriptor
from ...types import ElementKind
from .launch import element_suffix, get_kernel, launch

__all__ = ["LIMITS", "ActivationGrad", "chunking", "column_reach", "partials_bytes"]

SOURCE = "linear_grad.cu"  # the d_pre kernels' and the bias-gradient finalize's
THREADS = 256
WARPS = THREADS // 32
# Blocks the activation kernel aims for: enough to fill any current GPU several times over.
# Fixed, so that how rows are chunked (and so the bias gradient's summation order) depends on
# the problem alone.
TARGET_BLOCKS = 2048
MAX_CHUNKS = 65535  # the grid's y extent


def _pack(element: ElementKind) -> int:
    """Elements per 16-byte pack, and per lane of a block's column tile."""
    return 16 // element.itemsize


def chunking(rows: int, n: int, element: ElementKind) -> tuple[int, int, int]:
    """(column tiles, rows per chunk, chunks): a block per (tile, chunk)."""
    tiles = -(-n // (32 * _pack(element)))
    chunks = max(1, min(-(-TARGET_BLOCKS // tiles), -(-rows // WARPS)))
    per_chunk = -(-rows // chunks)
    per_chunk = max(-(-per_chunk // WARPS) * WARPS, -(-rows // MAX_CHUNKS))
    return tiles, per_chunk, -(-rows // per_chunk)


def partials_bytes(rows: int, n: int, element: ElementKind) -> int:
    """Workspace for the bias gradient's f32 partials: one per (chunk, column)."""
    return chunking(rows, n, element)[2] * n * 4


def column_reach(n: int, element: ElementKind) -> int:
    """The largest value the kernel forms in its ``int`` column index for rows of ``n``: the
    last pack's ``j0 + 16 bytes``, or the last column of the last tile (``j``)."""
    pack = _pack(element)
    tiles = -(-n // (32 * pack))
    return max(-(-n // pack) * pack, tiles * 32 * pack - 1)


def _with_kernel(desc: LinearBackwardDescriptor) -> bool:
    return desc.activation_spec.d_pre is not None


def _reach(desc: LinearBackwardDescriptor) -> int | None:
    return column_reach(desc.n, desc.element) if _with_kernel(desc) else None


def _rows_per_chunk(desc: LinearBackwardDescriptor) -> int | None:
    if not _with_kernel(desc):
        return None
    return chunking(desc.m * (desc.batch or 1), desc.n, desc.element)[1]


LIMITS: tuple[Limit[LinearBackwardDescriptor], ...] = (
    Limit("d_pre columns", "n rounded up to whole 16-byte packs", "columns",
          "the d_pre kernel's int column index", INT32_MAX, _reach,
          "native/linear_grad.cu activation_grad: `int n`, `int j0`, `int j`"),
    Limit("rows per chunk", "batch*m / chunks", "rows per chunk",
          "the d_pre kernel's int rows_per_chunk", INT32_MAX, _rows_per_chunk,
          "native/linear_grad.cu activation_grad: `int rows_per_chunk`"),
)


class ActivationGrad:
    """One problem's launch: the layout fixed at build time, the pointers given per run.

    ``pointers`` at run time maps argument names (grad_out, aux, grad_bias, and ``d_pre_name``,
    plus the workspace's "partials") to addresses.
    """

    def __init__(self, spec: ActivationSpec, element: ElementKind, device: int, rows: int,
                 n: int, ld_grad: int, ld_aux: int, ld_pre: int, alignment: int, d_pre_name: str,
                 bias_grad: bool):
        if spec.d_pre is None:
            raise ValueError(f"activation {spec.name} has no derivative kernel: d_pre is grad_out")
        self.activation, self.spec, self.device = spec.name, spec, device
        self.rows, self.n = rows, n
        self.d_pre_name, self.bias_grad = d_pre_name, bias_grad
        self.source = spec.d_pre.source
        self.name = f"{spec.d_pre.name}_{element_suffix(element)}"
        self.finalize = f"linear_bias_grad_finalize_{element_suffix(element)}"
        self.tiles, self.per_chunk, self.chunks = chunking(rows, n, element)
        pack = _pack(element)
        aux_packed = spec.aux.mask or ld_aux % pack == 0  # the mask is read bytewise
        self.vec = alignment >= 16 and ld_grad % pack == 0 and ld_pre % pack == 0 and aux_packed
        self.strides = (np.int64(ld_grad), np.int64(ld_aux), np.int64(ld_pre))

    def describe(self) -> str:
        return (f"d_pre: nvrtc {self.name} ({self.tiles}x{self.chunks} blocks, "
                f"{self.per_chunk} rows each{', 16-byte packs' if self.vec else ''})")

    def bind(self, pointers: dict[str, int], stream: int) -> Callable[[], None]:
        """The kernel (and the dbias finalize) with every argument packed once."""
        partials = pointers["partials"] if self.bias_grad else 0
        calls = [(get_kernel(self.source, self.name, self.device), (self.tiles, self.chunks), (
            np.uint64(pointers["grad_out"]), np.uint64(pointers["aux"]),
            np.uint64(pointers[self.d_pre_name]), np.uint64(partials), np.int64(self.rows),
            np.int32(self.n), *self.strides, np.int32(self.per_chunk), np.int32(self.vec)))]
        if self.bias_grad:
            calls.append((get_kernel(SOURCE, self.finalize, self.device),
                          (-(-self.n // THREADS),), (
                np.uint64(partials), np.uint64(pointers["grad_bias"]), np.int32(self.n),
                np.int32(self.chunks))))
        device = self.device

        def run() -> None:
            for kernel, grid, args in calls:
                launch(kernel, grid, (THREADS,), args, stream, device)

        return run
