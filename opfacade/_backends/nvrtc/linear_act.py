"""The linear forward's activation as a pass of its own (native/linear_act.cu), for the
activations cuBLASLt has no epilogue for: exact (erf) GELU and SiLU (the linear contract's
activation table names each one's kernel, ``ActivationSpec.act_pass``).

A cublasLtMatmul writes ``pre = x @ W + bias (+ residual)`` into the output (or into the aux a
training forward saves), then this kernel writes ``out = act(pre)``, in place or from the aux. It
reads and writes each element once: the memory floor of an unfused activation. Element-wise with
no reduction, so its bits depend on nothing but its input.

``LIMITS``: what the kernel can index, as data (the +act SKUs check them at selection). Rows,
batch entries and strides are ``i64``, bounded by the operands' element limits (cuBLASLt's table);
the grid's y and z extents are clamped below; the one ``int`` index that can overflow is the
column: a lane's first column ``j0`` and ``j0 + 16 bytes`` in ``load_pack``/``store_pack``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._internal.limits import INT32_MAX, Limit
from ...contracts.linear import ActivationSpec, LinearDescriptor
from ...types import ElementKind
from .launch import element_suffix, get_kernel, launch

__all__ = ["LIMITS", "ActivationPass", "column_reach", "row_shift"]

THREADS = 256
# Blocks: enough, over column tiles, row blocks and batch entries, to fill any current GPU several
# times over; the kernel strides over rows and entries beyond them.
TARGET_BLOCKS = 2048
MAX_GRID_YZ = 65535


def row_shift(packs: int) -> int:
    """log2 of the lanes per row: the row's packs, as a power of two between a warp and the
    block."""
    return min(max(packs - 1, 31).bit_length(), THREADS.bit_length() - 1)


def column_reach(n: int, element: ElementKind) -> int:
    """The largest value the kernel forms in its ``int`` column index for rows of ``n``: the
    last lane's ``j0`` (lanes past the row included) or the last pack's ``j0 + 16 bytes``."""
    pack = 16 // element.itemsize
    packs = -(-n // pack)
    shift = row_shift(packs)
    tiles = -(-packs >> shift)
    return max(packs * pack, ((tiles << shift) - 1) * pack)


def _reach(desc: LinearDescriptor) -> int | None:
    return None if desc.activation_spec.act_pass is None else column_reach(desc.n, desc.element)


LIMITS: tuple[Limit[LinearDescriptor], ...] = (
    Limit("activation columns", "n rounded up to whole 16-byte packs", "columns",
          "the activation kernel's int column index", INT32_MAX, _reach,
          "native/linear_act.cu activation_forward: `int n`, `int j0`, j0 + Pack<T>::N"),
)


class ActivationPass:
    """One problem's launch: rows of ``n`` columns in ``batch`` entries of ``m`` rows, the
    layouts ``(row stride, batch stride)`` of pre and out in elements fixed at build time, the
    pointers given per run."""

    def __init__(self, spec: ActivationSpec, element: ElementKind, device: int, batch: int,
                 m: int, n: int, pre: tuple[int, int], out: tuple[int, int], alignment: int):
        if spec.act_pass is None:
            raise ValueError(f"activation {spec.name} has no separate pass: cuBLASLt fuses it")
        self.activation, self.device = spec.name, device
        self.batch, self.m, self.n, self.pre, self.out = batch, m, n, pre, out
        self.source = spec.act_pass.source
        self.name = f"{spec.act_pass.name}_{element_suffix(element)}"
        pack = 16 // element.itemsize
        packs = -(-n // pack)
        self.row_shift = row_shift(packs)  # lanes per row: 2**row_shift
        self.tiles = -(-packs >> self.row_shift)
        if batch > 1 and pre[1] == m * pre[0] and out[1] == m * out[0]:
            batch, m = 1, batch * m  # contiguous entries: one block of rows
        self.entries = min(batch, MAX_GRID_YZ)  # the kernel strides over the rest
        rows_per_block = THREADS >> self.row_shift
        self.row_blocks = max(1, min(-(-TARGET_BLOCKS // (self.tiles * self.entries)),
                                     -(-m // rows_per_block), MAX_GRID_YZ))
        self.vec = alignment >= 16 and all(ld % pack == 0 for ld in (pre[0], out[0])) and (
            batch == 1 or all(stride % pack == 0 for stride in (pre[1], out[1])))
        self.args = (np.int64(batch), np.int64(m), np.int32(n), np.int64(pre[0]),
                     np.int64(pre[1]), np.int64(out[0]), np.int64(out[1]),
                     np.int32(self.row_shift), np.int32(self.vec))

    def describe(self) -> str:
        return (f"then nvrtc {self.name} ({self.tiles}x{self.row_blocks}x{self.entries} blocks, "
                f"{1 << self.row_shift} lanes per row"
                f"{', 16-byte packs' if self.vec else ''})")

    def bind(self, pre: int, out: int, stream: int) -> Callable[[], None]:
        """The kernel with every argument packed once."""
        kernel, device = get_kernel(self.source, self.name, self.device), self.device
        grid = (self.tiles, self.row_blocks, self.entries)
        args = (np.uint64(pre), np.uint64(out), *self.args)

        def run() -> None:
            launch(kernel, grid, (THREADS,), args, stream, device)

        return run
