"""Flash attention in true f32 (native/flash_f32.cu): a forward and a deterministic backward over
dense [B, H, S, D] or packed varlen [T, H, D] tensors, as plain launches for a plan to wire.

The math is f32 FMA on CUDA cores (no TF32), except on sm_90 (MMA_ARCHES): there the forward's
Q K^T and P V and the backward's S = Q K^T and dP = dO V^T are products and sums in f64 on the
FP64 tensor cores, each sum rounded once to f32. The backward sums dK, dV and
dQ in a fixed order (dQ's L2 reductions come one key block at a time), so it is bitwise
reproducible.
Nothing here takes a descriptor: a ``FlashProblem`` of plain values says what to compute,
``FlashStrides`` where the tensors are, and the ``*_call`` functions pack the arguments once and
return a call that only launches.

What the kernels can index: element offsets in ``i64`` from ``i64`` strides; extents (lengths,
rows, heads) in ``int``, below 2**31; the grids are (heads, batch, query blocks) for the forward,
(query blocks, heads, batch) for Delta and (kv heads, batch, key blocks) for dK/dV, so heads,
batch, query blocks and key blocks stay at or below 65535 (``supported`` says so).
Varlen offsets are read on the device and never trusted: every sequence is clamped into the
tensors' ``total_q``/``total_kv`` rows and to ``max_seqlen_*``, so garbage offsets cannot move an
access outside the tensors.

A CTA runs 128 threads (the Delta kernel's 256) and needs up to 108 KiB of dynamic shared
memory (D = Dv = 128) and cp.async, so the kernels run on sm_80 and sm_90; sm_86/sm_89 allow
99 KiB a block, which every pair but D = Dv = 128 fits. At D = Dv = 128 a GPU other than sm_90
that gives a block 198 KiB (sm_100) runs a wide forward instead: 128-row blocks of 256 threads.
On sm_90 the forward at D = Dv (32, 64, 96, 128) runs 32-row blocks of 128 threads, at D = 128 in
96.25 KiB, two an SM, at D <= 64 three an SM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..._internal.device import device_arch
from ..._internal.limits import GRID_YZ_MAX, INT32_MAX, INT64_MAX
from ..._internal.sku import Workspace
from ...errors import InvalidArgument, InvalidProblem, Unsupported
from ...types import ArchSku
from .flash_f32_tiles import (
    DELTA_ROWS,
    DELTA_THREADS,
    DKDV_KEYS,
    DKDV_ROWS,
    DKDV_THREADS,
    DMMA_ROWS,
    DMMA_THREADS,
    FORWARD_ROWS,
    FORWARD_THREADS,
    QUERY_BLOCK_ROWS,
    SHARED_PER_BLOCK,
    WIDE_FORWARD_ROWS,
    WIDE_FORWARD_THREADS,
    shared_bytes,
)
from .flash_f32_tiles import FLOAT_BYTES as _FLOAT
from .flash_f32_tiles import dkdv_shared as _dkdv_shared
from .flash_f32_tiles import dmma_forward_shared as _dmma_forward_shared
from .flash_f32_tiles import forward_shared as _forward_shared
from .launch import kernel_with_shared, launch

__all__ = ["CAUSAL_MODES", "HEAD_DIMS", "SOURCE", "FlashProblem", "FlashStrides",
           "backward_call", "backward_workspace_bytes", "forward_call", "kernel_names",
           "key_blocks", "query_blocks", "shared_bytes", "supported"]

SOURCE = "flash_f32.cu"
# (head_dim, head_dim_v) pairs with kernels: FLASH_KERNELS(D, DV) in native/flash_f32.cu.
HEAD_DIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (128, 64), (64, 128))
CAUSAL_MODES = {None: 0, "top_left": 1, "bottom_right": 2}  # the kernels' `causal` codes

# The (head_dim, head_dim_v) pairs with a wide forward (ForwardShape there).
WIDE_FORWARD_DIMS = ((128, 128),)
# Where the kernels take products on the FP64 tensor cores (the forward's fwd_dmma kernels, the
# backward's bwd_dkdv_mma): mma.sync's m16n8k16 f64 shape is sm_90's, and only there was it
# measured. On an H100 (B4 H16 S2048, scripts/f32_time.py, each in one call) the DMMA forward beat
# the forward with only its scores there (dropped since, docs/PERF-NOTES.md) at every pair, in
# ms: d32 0.91 against 1.10, d64 1.56 against 1.65, d64 causal 0.80-0.82 against 0.82, d96 2.58
# against 2.71, d128 3.06-3.10 against 3.14, d128 causal 1.60-1.62 against 1.62, d128/dv64 2.38
# against 2.55, d64/dv128 2.38 against 2.65. The backward's S and dP there, against the FMA
# chain (dK/dV + Delta ms): d64 4.56 against 5.12, causal 2.24 against 2.57; d128 8.69 against
# 9.60, causal 4.43 against 4.82; d64/dv128 6.36 against 7.13.
MMA_ARCHES = frozenset({ArchSku.sm90})
_INT32 = 4


def kernel_names() -> list[str]:
    """Every kernel in native/flash_f32.cu."""
    names = ["flash_f32_bwd_delta"]
    for d, dv in HEAD_DIMS:
        names += [f"flash_f32_{kind}_d{d}_dv{dv}"
                  for kind in ("fwd", "fwd_dmma", "bwd_dkdv", "bwd_dkdv_mma")]
    return names + [f"flash_f32_fwd_wide_d{d}_dv{dv}" for d, dv in WIDE_FORWARD_DIMS]


def _int_field(name: str, value: object, low: int, high: int = INT32_MAX) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidProblem(f"{name} must be an int, got {value!r}", field=name)
    if not low <= value <= high:
        raise InvalidProblem(f"{name} must lie in [{low}, {high}], got {value}", field=name)


@dataclass(frozen=True)
class FlashProblem:
    """What to compute, in plain values (the plan system maps its descriptors onto this).

    Dense: q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]; ``max_seqlen_*`` are Sq and
    Skv, and ``total_*`` are B*Sq and B*Skv. Varlen: q [Tq, Hq, D], k [Tkv, Hkv, D],
    v [Tkv, Hkv, Dv] with ``total_*`` = Tq and Tkv, and ``max_seqlen_*`` the longest sequence
    (rows past it are not computed). ``causal`` is None, "top_left" or "bottom_right"; a window
    side of -1 is unbounded, and a window without causal is top-left aligned.

    Raises:
        InvalidProblem: (a ValueError) naming the first field that makes no sense.
    """

    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    max_seqlen_q: int
    max_seqlen_kv: int
    total_q: int
    total_kv: int
    varlen: bool
    scale: float
    causal: str | None
    window_left: int = -1
    window_right: int = -1

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "head_dim", "head_dim_v"):
            _int_field(name, getattr(self, name), 1)
        for name in ("max_seqlen_q", "max_seqlen_kv", "total_q", "total_kv"):
            _int_field(name, getattr(self, name), 0)
        for name in ("window_left", "window_right"):
            _int_field(name, getattr(self, name), -1)
        if self.heads_q % self.heads_kv:
            raise InvalidProblem(f"heads_q must be a multiple of heads_kv={self.heads_kv}, got "
                                 f"{self.heads_q}", field="heads_q")
        if not isinstance(self.varlen, bool):
            raise InvalidProblem(f"varlen must be a bool, got {self.varlen!r}", field="varlen")
        if (isinstance(self.scale, bool) or not isinstance(self.scale, float | int)
                or not math.isfinite(self.scale)):
            raise InvalidProblem(f"scale must be a finite float, got {self.scale!r}",
                                 field="scale")
        if self.causal not in CAUSAL_MODES:
            raise InvalidProblem(f"causal must be one of {list(CAUSAL_MODES)}, got "
                                 f"{self.causal!r}", field="causal")
        if not self.varlen:
            for side in ("q", "kv"):
                total, longest = getattr(self, f"total_{side}"), getattr(self, f"max_seqlen_{side}")
                if total != self.batch * longest:
                    raise InvalidProblem(
                        f"total_{side} must be batch*max_seqlen_{side} = {self.batch * longest} "
                        f"for a dense problem, got {total}", field=f"total_{side}")

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads_q // self.heads_kv


# The backward's tensors whose strides default to another's.
_GRADIENT_DEFAULTS = {"dout": "out", "dq": "q", "dk": "k", "dv": "v"}


def _stride_triple(name: str, value: object) -> tuple[int, int, int]:
    if (not isinstance(value, tuple | list) or len(value) != 3
            or not all(isinstance(s, int | np.integer) and not isinstance(s, bool)
                       and abs(s) <= INT64_MAX for s in value)):
        raise InvalidArgument(f"strides.{name} must be 3 ints (batch, token, head) in elements, "
                              f"got {value!r}", argument=f"strides.{name}")
    return tuple(int(s) for s in value)


@dataclass(frozen=True)
class FlashStrides:
    """Each tensor's (batch, token, head) strides in elements; the stride along D is 1.

    Element (b, h, i, d) of q is at ``q + (row0(b) + i)*token + h*head + b*batch + d`` with
    row0(b) = cu_seqlens_q[b] for varlen (whose batch stride is then ignored: pass 0) and 0 for
    dense. lse (and the backward's dout, dq, dk, dv) are addressed the same way; dout, dq, dk and
    dv default to the strides of out, q, k and v.

    Raises:
        InvalidArgument: (a ValueError) naming the first entry that is not 3 ints.
    """

    q: tuple[int, int, int]
    k: tuple[int, int, int]
    v: tuple[int, int, int]
    out: tuple[int, int, int]
    lse: tuple[int, int, int]
    dout: tuple[int, int, int] | None = None
    dq: tuple[int, int, int] | None = None
    dk: tuple[int, int, int] | None = None
    dv: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("q", "k", "v", "out", "lse", *_GRADIENT_DEFAULTS):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _stride_triple(name, value))

    def of(self, name: str) -> tuple[int, int, int]:
        """The strides of tensor ``name``, its default's when not given."""
        value = getattr(self, name)
        return getattr(self, _GRADIENT_DEFAULTS[name]) if value is None else value

    @classmethod
    def contiguous(cls, problem: FlashProblem) -> FlashStrides:
        """Contiguous tensors: dense [B, H, S, D] and lse [B, Hq, Sq], or varlen [T, H, D] and
        lse [Hq, Tq]."""
        p = problem

        def rows(heads: int, seq: int, dim: int) -> tuple[int, int, int]:
            if p.varlen:
                return 0, heads * dim, dim
            return heads * seq * dim, dim, seq * dim

        lse = (0, 1, p.total_q) if p.varlen else (p.heads_q * p.max_seqlen_q, 1, p.max_seqlen_q)
        return cls(q=rows(p.heads_q, p.max_seqlen_q, p.head_dim),
                   k=rows(p.heads_kv, p.max_seqlen_kv, p.head_dim),
                   v=rows(p.heads_kv, p.max_seqlen_kv, p.head_dim_v),
                   out=rows(p.heads_q, p.max_seqlen_q, p.head_dim_v), lse=lse)


def supported(problem: FlashProblem) -> str | None:
    """Why the kernels cannot serve this valid problem, in one sentence, or None."""
    p = problem
    if (p.head_dim, p.head_dim_v) not in HEAD_DIMS:
        return (f"head_dim={p.head_dim}, head_dim_v={p.head_dim_v} has no kernel; the "
                f"(head_dim, head_dim_v) pairs built are {list(HEAD_DIMS)}")
    for name in ("heads_q", "batch"):
        if getattr(p, name) > GRID_YZ_MAX:
            return (f"{name}={getattr(p, name)} exceeds the grids' y/z extent {GRID_YZ_MAX} "
                    f"(Delta's one CTA row per head, one CTA row or layer per sequence)")
    if query_blocks(p) > GRID_YZ_MAX:
        return (f"max_seqlen_q={p.max_seqlen_q} makes {query_blocks(p)} blocks of "
                f"{QUERY_BLOCK_ROWS} rows, past the forward grid's z extent {GRID_YZ_MAX}")
    if key_blocks(p) > GRID_YZ_MAX:
        return (f"max_seqlen_kv={p.max_seqlen_kv} makes {key_blocks(p)} blocks of {DKDV_KEYS} "
                f"keys, past the dK/dV grid's z extent {GRID_YZ_MAX}")
    return None


def query_blocks(problem: FlashProblem) -> int:
    """The forward grid's query blocks at their most, those of the DMMA forward's 32 rows (the
    others have 64 or 128): every forward's grid is (heads_q, batch, query blocks), the last
    block first. The limit holds on any GPU, whichever forward it picks."""
    return _blocks(problem.max_seqlen_q, QUERY_BLOCK_ROWS)


def key_blocks(problem: FlashProblem) -> int:
    """The dK/dV kernel's key blocks: its grid is (heads_kv, batch, key blocks)."""
    return _blocks(problem.max_seqlen_kv, DKDV_KEYS)


def _check_supported(problem: FlashProblem) -> None:
    reason = supported(problem)
    if reason is not None:
        raise Unsupported(reason)


def _delta_bytes(problem: FlashProblem) -> int:
    rows = problem.total_q if problem.varlen else problem.batch * problem.max_seqlen_q
    return Workspace.round_up(_FLOAT * problem.heads_q * rows)


def backward_workspace_bytes(problem: FlashProblem) -> int:
    """Bytes of the backward's workspace, each part rounded up to 256: Delta, one f32 per query
    row and head (varlen [Hq, Tq], dense [B, Hq, Sq]), then the dQ turn counters, one int32 per
    sequence, query head and block of DKDV_ROWS rows up to max_seqlen_q."""
    blocks = _blocks(problem.max_seqlen_q, DKDV_ROWS)
    turns = Workspace.round_up(_INT32 * problem.batch * problem.heads_q * blocks)
    return _delta_bytes(problem) + turns


def _delta_strides(problem: FlashProblem) -> tuple[int, int, int]:
    if problem.varlen:
        return 0, 1, problem.total_q
    return problem.heads_q * problem.max_seqlen_q, 1, problem.max_seqlen_q


def _check_pointer(name: str, ptr: object, rows: int) -> int:
    """An f32 (or int32) device address: 4-byte aligned, and not null when it has rows."""
    if isinstance(ptr, bool) or not isinstance(ptr, int | np.integer) or ptr < 0:
        raise InvalidArgument(f"{name} must be a device address (a non-negative int), got "
                              f"{ptr!r}", argument=name)
    if ptr % 4:
        raise InvalidArgument(f"{name} must be 4-byte aligned, got {int(ptr):#x}", argument=name)
    if ptr == 0 and rows > 0:
        raise InvalidArgument(f"{name} must not be null: it has {rows} rows", argument=name)
    return int(ptr)


def _check_target(device: object, stream: object) -> None:
    for name, value in (("device", device), ("stream", stream)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise InvalidArgument(f"{name} must be a non-negative int, got {value!r}",
                                  argument=name)


def _offsets(problem: FlashProblem, cu_q: object, cu_kv: object) -> tuple[int, int]:
    """cu_seqlens_q and cu_seqlens_kv: int32 [B + 1] device arrays for varlen, 0 for dense."""
    pointers = []
    for name, ptr in (("cu_seqlens_q", cu_q), ("cu_seqlens_kv", cu_kv)):
        if problem.varlen:
            pointers.append(_check_pointer(name, ptr, problem.batch + 1))
        elif ptr != 0:
            raise InvalidArgument(f"{name} must be 0 for a dense problem, got {ptr!r}",
                                  argument=name)
        else:
            pointers.append(0)
    return pointers[0], pointers[1]


def _rows(problem: FlashProblem, name: str) -> int:
    """Rows of tensor ``name`` (per head), for the null-pointer check."""
    return problem.total_kv if name in ("k", "v", "dk", "dv") else problem.total_q


def _tensors(problem: FlashProblem, strides: FlashStrides, pointers: dict[str, object]
             ) -> tuple[dict[str, tuple], bool]:
    """Each tensor's packed (pointer, batch, token, head) arguments, and whether every row
    start of the D-wide tensors is 16-byte aligned (the kernels' vector copies)."""
    if not isinstance(strides, FlashStrides):
        raise InvalidArgument(f"strides must be a FlashStrides, got {type(strides).__name__}",
                              argument="strides")
    packed, vec = {}, True
    for name, ptr in pointers.items():
        address = _check_pointer(name, ptr, _rows(problem, name))
        triple = strides.of(name)
        packed[name] = (np.uint64(address), *(np.int64(s) for s in triple))
        if name != "lse":
            vec = vec and address % 16 == 0 and all(s % 4 == 0 for s in triple)
    return packed, vec


def _problem_args(problem: FlashProblem, cu_q: int, cu_kv: int, vec: bool) -> tuple:
    """The FLASH_PROBLEM_PARAMS list of native/flash_f32.cu, in order."""
    p = problem
    return (np.uint64(cu_q), np.uint64(cu_kv), np.int32(p.group), np.int32(p.max_seqlen_q),
            np.int32(p.max_seqlen_kv), np.int64(p.total_q), np.int64(p.total_kv),
            np.float32(p.scale), np.int32(CAUSAL_MODES[p.causal]), np.int32(p.window_left),
            np.int32(p.window_right), np.int32(vec))


def _kernel(name: str, device: int, shared_bytes: int):
    return kernel_with_shared(SOURCE, name, device, shared_bytes)


def _shared_per_block(device: int) -> int:
    """The most dynamic shared memory a block on ``device`` may opt in to."""
    return SHARED_PER_BLOCK[device_arch(device)]


def _forward_kind(problem: FlashProblem, device: int) -> str:
    """The forward kernel ``device`` runs ``problem`` with, by its name's part after flash_f32_:
    on MMA_ARCHES "fwd_dmma" (both products on the FP64 tensor cores), elsewhere "fwd_wide"
    where the pair has a wide kernel, else "fwd". Each only where ``device`` gives a block its
    shared memory."""
    dims = (problem.head_dim, problem.head_dim_v)
    have = _shared_per_block(device)
    if device_arch(device) in MMA_ARCHES and have >= _dmma_forward_shared(*dims):
        return "fwd_dmma"
    if dims in WIDE_FORWARD_DIMS and have >= _forward_shared(*dims, wide=True):
        return "fwd_wide"
    return "fwd"


def _forward_launch(kind: str, d: int, dv: int) -> tuple[int, int, int]:
    """(query rows a block, threads a block, dynamic shared bytes) of forward ``kind``."""
    if kind == "fwd_dmma":
        return DMMA_ROWS, DMMA_THREADS, _dmma_forward_shared(d, dv)
    if kind == "fwd_wide":
        return WIDE_FORWARD_ROWS, WIDE_FORWARD_THREADS, _forward_shared(d, dv, wide=True)
    return FORWARD_ROWS, FORWARD_THREADS, _forward_shared(d, dv)


def _blocks(length: int, rows: int) -> int:
    return -(-length // rows)


def _suffix(problem: FlashProblem) -> str:
    return f"d{problem.head_dim}_dv{problem.head_dim_v}"


def forward_call(problem: FlashProblem, device: int, q: int, k: int, v: int, out: int, lse: int,
                 cu_q: int, cu_kv: int, strides: FlashStrides, stream: int
                 ) -> Callable[[], None]:
    """The forward ``out = softmax(scale q k^T, masked) v`` and ``lse`` (natural log, -inf and
    out = 0 on rows without keys), as a call that only launches on ``stream``.

    Args:
        problem: what to compute.
        device: the CUDA ordinal the pointers live on.
        q, k, v, out, lse: f32 device addresses; lse is [B, Hq, Sq] (dense) or [Hq, Tq] (varlen)
            as its strides say.
        cu_q, cu_kv: int32 [B + 1] device addresses of cu_seqlens for varlen, 0 for dense.
        strides: every tensor's (batch, token, head) strides in elements.
        stream: the raw CUDA stream handle to launch on.

    Raises:
        InvalidArgument: a pointer, the offsets or the strides do not fit the problem.
        Unsupported: ``supported(problem)`` is not None.
    """
    _check_supported(problem)
    _check_target(device, stream)
    cu_q, cu_kv = _offsets(problem, cu_q, cu_kv)
    tensors, vec = _tensors(problem, strides, dict(q=q, k=k, v=v, out=out, lse=lse))
    args = (*tensors["q"], *tensors["k"], *tensors["v"], *tensors["out"], *tensors["lse"],
            *_problem_args(problem, cu_q, cu_kv, vec))
    kind = _forward_kind(problem, device)
    rows, threads, shared = _forward_launch(kind, problem.head_dim, problem.head_dim_v)
    grid = (problem.heads_q, problem.batch, _blocks(problem.max_seqlen_q, rows))
    if grid[2] == 0:
        return lambda: None
    kernel = _kernel(f"flash_f32_{kind}_{_suffix(problem)}", device, shared)

    def run_forward() -> None:
        launch(kernel, grid, (threads,), args, stream, device, shared)

    return run_forward


def backward_call(problem: FlashProblem, device: int, q: int, k: int, v: int, out: int,
                  dout: int, lse: int, dq: int, dk: int, dv: int, cu_q: int, cu_kv: int,
                  workspace_ptr: int, strides: FlashStrides, stream: int) -> Callable[[], None]:
    """The backward of ``forward_call``: dq, dk and dv (every row of every sequence written,
    zeros included), bitwise the same on every run, as a call that only launches.

    Two kernels run in order on ``stream``: Delta = rowsum(dout * out) into the workspace
    (``backward_workspace_bytes(problem)`` at ``workspace_ptr``), which also zeroes dq and the
    turn counters after Delta, then dK/dV (one CTA per key block and kv head, looping over the
    group's query heads), which adds each query block's share of dQ in key-block order.

    Args:
        q, k, v, out, dout, lse: the forward's inputs and results and the output's gradient.
        dq, dk, dv: f32 device addresses of the gradients, laid out as their strides say.
        workspace_ptr: device address of the Delta workspace.
        Other arguments: as ``forward_call``.

    Raises:
        InvalidArgument: a pointer, the offsets or the strides do not fit the problem.
        Unsupported: ``supported(problem)`` is not None.
    """
    _check_supported(problem)
    _check_target(device, stream)
    cu_q, cu_kv = _offsets(problem, cu_q, cu_kv)
    workspace_ptr = _check_pointer("workspace_ptr", workspace_ptr,
                                   backward_workspace_bytes(problem) // _FLOAT)
    tensors, vec = _tensors(problem, strides, dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse,
                                                   dq=dq, dk=dk, dv=dv))
    t = tensors
    delta = (np.uint64(workspace_ptr), *(np.int64(s) for s in _delta_strides(problem)))
    turns = np.uint64(workspace_ptr + _delta_bytes(problem))
    common = _problem_args(problem, cu_q, cu_kv, vec)
    inputs = (*t["q"], *t["k"], *t["v"], *t["dout"], *t["lse"], *delta)
    d, dv_dim, suffix = problem.head_dim, problem.head_dim_v, _suffix(problem)
    q_blocks = _blocks(problem.max_seqlen_q, DELTA_ROWS)
    kv_blocks = key_blocks(problem)
    steps = []  # (kernel, grid, block, args, shared bytes), in launch order
    if q_blocks:
        steps.append((_kernel("flash_f32_bwd_delta", device, 0),
                      (q_blocks, problem.heads_q, problem.batch), (DELTA_THREADS,),
                      (*t["out"], *t["dout"], *delta, *t["dq"], turns, *common, np.int32(d),
                       np.int32(dv_dim)), 0))
    if kv_blocks:
        shared = _dkdv_shared(d, dv_dim)
        kind = "bwd_dkdv_mma" if device_arch(device) in MMA_ARCHES else "bwd_dkdv"
        steps.append((_kernel(f"flash_f32_{kind}_{suffix}", device, shared),
                      (problem.heads_kv, problem.batch, kv_blocks), (DKDV_THREADS,),
                      (*inputs, *t["dq"], *t["dk"], *t["dv"], turns, *common), shared))

    def run_backward() -> None:
        for kernel, grid, block, args, shared in steps:
            launch(kernel, grid, block, args, stream, device, shared)

    return run_backward
