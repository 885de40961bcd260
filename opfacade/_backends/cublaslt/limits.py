"""What cuBLASLt can index, stated as data: the linear SKUs' limits, checked first at selection.

From ``cublasLt.h``: a matrix layout's ROWS and COLS are ``uint64_t`` but "usually only values
that can be expressed as int32_t are supported"; its LD and STRIDED_BATCH_OFFSET are
``int64_t`` element counts; BATCH_COUNT is ``int32_t``; the epilogue's AUX_LD and
AUX_BATCH_STRIDE are ``int64_t``. So each operand's last element, at ``(batch - 1) *
batch_stride + (rows - 1) * ld + cols - 1``, must be an int64 element offset, and every extent
of every GEMM an int32.

The descriptor bounds M, N, K and the batch by INT32_MAX, and ``layouts.py`` folds a batch into
the rows only while B*M stays an int32 extent, so the one extent that can exceed it is the
backward's B*M rows where they cannot stay a batch: the K of dW summed over a batch that shares
one weight, and the rows of the dbias GEMV. The NVRTC kernels around the GEMMs index the same
operands with ``i64`` element offsets, so the element rows here bound them too; their ``int``
indices are their own tables (``nvrtc/linear_act.py``, ``nvrtc/linear_grad.py``). The forward's
workspace is the GEMM's budget alone (``WORKSPACE_LIMIT``, 32 MiB) and needs no row; the
backward's, with its intermediate buffers, is a row of ``backward.LIMITS``.
"""

from __future__ import annotations

import math

from ..._internal.limits import INT32_MAX, INT64_MAX, Limit
from ...contracts.linear import LinearBackwardDescriptor, LinearDescriptor

__all__ = ["BACKWARD_OPERANDS", "FORWARD_OPERANDS", "SUMMED_ROWS"]

_ELEMENT_SOURCE = ("cublasLt.h: LD and STRIDED_BATCH_OFFSET are int64_t element counts; the "
                   "NVRTC passes' offsets are i64")
_BOUND = "the int64 element offsets of cuBLASLt and the NVRTC passes"


def _operand(name: str, quantity: str, shape) -> Limit:
    """The element count of the operand ``shape(desc)`` describes (None: not an operand)."""
    def elements(desc) -> int | None:
        extents = shape(desc)
        return None if extents is None else math.prod(extents)

    return Limit(f"{name} elements", quantity, f"elements of {name}", _BOUND, INT64_MAX, elements,
                 _ELEMENT_SOURCE)


def _aux(desc: LinearDescriptor) -> tuple[int, ...] | None:
    """The saved aux as the GEMM writes it: rows padded to the stride cuBLASLt needs."""
    if not desc.save_aux:
        return None
    return (*desc.lead, desc.m, desc.aux_layout.row_stride(desc.n))


_X = _operand("x", "batch*m*k", lambda d: d.x_shape)
_WEIGHT = _operand("weight", "[batch*]n*k", lambda d: d.weight_shape)
FORWARD_OPERANDS: tuple[Limit[LinearDescriptor], ...] = (
    _X,
    _WEIGHT,
    _operand("out", "batch*m*n", lambda d: d.out_shape),  # and the residual, of its shape
    _operand("aux", "batch*m*(padded aux row)", _aux),
)
# The backward's aux and d_pre have out's rows; they cannot outgrow the d_pre kernel's rows per
# chunk and the workspace before they outgrow an int64, so no row of their own.
BACKWARD_OPERANDS: tuple[Limit[LinearBackwardDescriptor], ...] = (
    _operand("grad_out", "batch*m*n", lambda d: d.out_shape),  # and grad_pre
    _X,  # and grad_x
    _WEIGHT,  # and grad_weight
)


def _summed_rows(desc: LinearBackwardDescriptor) -> int | None:
    """B*M when a GEMM of the backward takes them as one extent: dW of a weight the batch shares
    (a sum over every row) or dbias by a GEMM (dbias by the d_pre kernel has i64 rows)."""
    if desc.batch is None:
        return None  # M alone: an int32 by the descriptor
    shared_dw = desc.need_weight_grad and not desc.weight_batched
    gemm_dbias = desc.need_bias_grad and desc.activation_spec.d_pre is None
    return desc.batch * desc.m if shared_dw or gemm_dbias else None


SUMMED_ROWS: Limit[LinearBackwardDescriptor] = Limit(
    "summed rows", "batch*m", "rows summed in one GEMM",
    "cuBLASLt's int32 matrix extent (dW of a shared weight, or the dbias GEMM)", INT32_MAX,
    _summed_rows, "cublasLt.h: ROWS and COLS, usually only values that fit int32_t")
