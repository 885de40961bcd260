"""Row-major problems as the column-major GEMMs cuBLASLt computes: index arithmetic, no GPU.

A row-major ``[R, C]`` tensor whose rows are ``ld`` elements apart is, byte for byte, the
column-major ``[C, R]`` matrix with leading dimension ``ld``: its transpose. So the row-major

    out[M, N] = x[M, K] @ W[K, N]

is handed to cuBLASLt as the column-major ``out^T[N, M] = W^T[N, K] @ x^T[K, M]``, with A := W,
B := x and D := out. cuBLASLt's m is our N: the bias vector runs along the rows of D, which is
along N, as it must; the aux matrix has D's shape. W in "kn" layout (``[K, N]`` rows) is already
``W^T`` column-major (op N); in nn.Linear's "nk" layout (``[N, K]`` rows) it is ``W`` column-major
(op T). The backward's GEMMs follow the same rule; each function below says which.

A 3-D operand is a strided batch. When one weight serves the whole batch and every other operand
is contiguous across it (batch stride = M * row stride), the batch is folded into the rows
(``B*M`` rows, one GEMM) while B*M stays an int32 extent (cuBLASLt's ROWS and COLS): that is how
the shared-weight backward sums dW and dbias over the batch (``limits.SUMMED_ROWS``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..._internal.limits import INT32_MAX
from ...contracts.linear import LinearBackwardDescriptor, LinearDescriptor

__all__ = [
    "OP_N", "OP_T", "Gemm", "Matrix", "Rows", "batch_contiguous", "bias_grad_gemv",
    "forward_gemm", "input_grad_gemm", "weight_grad_gemm",
]

OP_N, OP_T = 0, 1  # cublasOperation_t
Problem = LinearDescriptor | LinearBackwardDescriptor


@dataclass(frozen=True)
class Rows:
    """A row-major operand's strides in elements: between rows, and between batch entries."""

    ld: int
    batch_stride: int = 0


def batch_contiguous(rows: Rows, m: int) -> bool:
    """Whether batch entry b+1 starts right after the M rows of entry b."""
    return rows.batch_stride == m * rows.ld


@dataclass(frozen=True)
class Matrix:
    """One cuBLASLt operand: column-major ``rows x cols``, leading dimension, batch stride."""

    rows: int
    cols: int
    ld: int
    batch_stride: int = 0

    @classmethod
    def of_rows(cls, r: int, c: int, strides: Rows, batched: bool) -> Matrix:
        """The row-major ``[r, c]`` operand as cuBLASLt's column-major ``[c, r]``."""
        ld = strides.ld if r > 1 else max(strides.ld, c)  # one row: the stride is never used
        return cls(c, r, ld, strides.batch_stride if batched else 0)


@dataclass(frozen=True)
class Gemm:
    """``D = op(A) @ op(B)`` in column-major terms, over ``batch`` strided instances."""

    transa: int
    transb: int
    a: Matrix
    b: Matrix
    d: Matrix
    batch: int = 1

    @property
    def m(self) -> int:
        return self.d.rows

    @property
    def n(self) -> int:
        return self.d.cols

    @property
    def k(self) -> int:
        return self.a.cols if self.transa == OP_N else self.a.rows

    def like_d(self, strides: Rows) -> Matrix:
        """A matrix shaped like D over another row-major operand (residual, aux, grad_out)."""
        return Matrix(self.d.rows, self.d.cols,
                      strides.ld if self.d.cols > 1 else max(strides.ld, self.d.rows),
                      strides.batch_stride if self.batch > 1 else 0)


def _folded(desc: Problem, operands: Iterable[Rows]) -> bool:
    """One weight over a batch of contiguous operands: fold the batch into the rows, unless
    B*M would exceed the int32 extent cuBLASLt takes (the batch then stays a strided batch)."""
    return (desc.batch is not None and not desc.weight_batched
            and desc.batch * desc.m <= INT32_MAX
            and all(batch_contiguous(rows, desc.m) for rows in operands))


def _weight(desc: Problem, w: Rows, wanted_kn_transposed: bool) -> tuple[int, Matrix]:
    """op and matrix giving ``W^T`` [N, K] (or ``W`` [K, N] when not ``wanted_kn_transposed``)."""
    batched = bool(desc.batch and desc.weight_batched)  # else batch stride 0: one W for all
    if desc.weight_layout == "kn":  # rows [K, N] are W^T column-major
        matrix = Matrix.of_rows(desc.k, desc.n, w, batched)
        return (OP_N if wanted_kn_transposed else OP_T), matrix
    matrix = Matrix.of_rows(desc.n, desc.k, w, batched)  # rows [N, K] are W column-major
    return (OP_T if wanted_kn_transposed else OP_N), matrix


def forward_gemm(desc: LinearDescriptor, x: Rows, w: Rows, out: Rows,
                 others: Iterable[Rows] = ()) -> Gemm:
    """``out^T [N, R] = W^T [N, K] @ x^T [K, R]``; ``others`` (residual, aux) share out's shape."""
    fold = _folded(desc, [x, out, *others])
    batch = 1 if fold or desc.batch is None else desc.batch
    r = desc.m * (desc.batch if fold else 1)
    transa, a = _weight(desc, w, wanted_kn_transposed=True)
    b = Matrix.of_rows(r, desc.k, x, batch > 1)
    d = Matrix.of_rows(r, desc.n, out, batch > 1)
    return Gemm(transa, OP_N, a, b, d, batch)


def _all_rows(desc: Problem) -> int:
    return desc.m * (desc.batch or 1)


def weight_grad_gemm(desc: LinearBackwardDescriptor, x: Rows, d_pre: Rows, dw: Rows) -> Gemm:
    """dW = x^T @ d_pre over R rows (all B*M rows when the weight is shared).

    "kn" (dW rows [K, N]): ``dW^T [N, K] = d_pre^T [N, R] @ x [R, K]``: A = d_pre, op(B) = T;
    the bias gradient of d_pre is then BGRADA (A reduced over k = R).
    "nk" (dW rows [N, K]): ``dW^T [K, N] = x^T [K, R] @ d_pre [R, N]``: op(B) = T on d_pre;
    the bias gradient is then BGRADB (B reduced over k).
    """
    per_batch = bool(desc.batch and desc.weight_batched)
    batch = desc.batch if per_batch else 1
    r = desc.m if per_batch else _all_rows(desc)
    xm = Matrix.of_rows(r, desc.k, x, per_batch)  # [K, R]
    pm = Matrix.of_rows(r, desc.n, d_pre, per_batch)  # [N, R]
    if desc.weight_layout == "kn":
        return Gemm(OP_N, OP_T, pm, xm, Matrix.of_rows(desc.k, desc.n, dw, per_batch), batch)
    return Gemm(OP_N, OP_T, xm, pm, Matrix.of_rows(desc.n, desc.k, dw, per_batch), batch)


def input_grad_gemm(desc: LinearBackwardDescriptor, d_pre: Rows, w: Rows, dx: Rows) -> Gemm:
    """``dx^T [K, R] = W [K, N] @ d_pre^T [N, R]``."""
    fold = _folded(desc, [d_pre, dx])
    batch = 1 if fold or desc.batch is None else desc.batch
    r = desc.m * (desc.batch if fold else 1)
    transa, a = _weight(desc, w, wanted_kn_transposed=False)
    b = Matrix.of_rows(r, desc.n, d_pre, batch > 1)
    return Gemm(transa, OP_N, a, b, Matrix.of_rows(r, desc.k, dx, batch > 1), batch)


def bias_grad_gemv(desc: LinearBackwardDescriptor, d_pre: Rows) -> Gemm:
    """``dbias [N, 1] = d_pre^T [N, R] @ ones [R, 1]``: a plain GEMM, no epilogue reduction."""
    r = _all_rows(desc)
    return Gemm(OP_N, OP_N, Matrix.of_rows(r, desc.n, d_pre, False), Matrix(r, 1, r),
                Matrix(desc.n, 1, desc.n))
