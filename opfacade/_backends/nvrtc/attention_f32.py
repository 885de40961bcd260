"""True-f32 attention SKUs over the bespoke flash kernels (``flash_f32.py``,
``native/flash_f32.cu``): dense SDPA forward and backward (``sdpa_*.nvrtc.f32``) and packed
varlen attention forward and backward (``varlen_attention_*.nvrtc.f32``).

f32 inputs and f32 FMA math on CUDA cores, no TF32 (on sm_90 the forward's Q K^T and P V and the
backward's S = Q K^T and dP = dO V^T go further: f64 products and sums on the FP64 tensor cores,
each sum rounded once to f32): what cuDNN 9.19 does not offer (it refuses an f32 backward, and runs
the f32 forward at ~18 TFLOP/s on an H100). The backward sums in an order fixed by the problem alone
(dQ in key-block order, each key block's CTA waiting its turn to add): deterministic and bit-stable.
Nothing is read on the host at run time (varlen offsets stay on the device and are clamped by the
kernels), so every call may be captured in a CUDA graph.
"""

from __future__ import annotations

from ..._internal.contract import BoundArgs, OpContract
from ..._internal.limits import GRID_YZ_MAX, INT32_MAX, INT64_MAX, Limit, check, workspace_limit
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.sdpa import (
    SDPA_BACKWARD,
    SDPA_FORWARD,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
)
from ...contracts.varlen_attention import (
    VARLEN_ATTENTION_BACKWARD,
    VARLEN_ATTENTION_FORWARD,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from ...errors import InvalidProblem
from ...types import ArchSku, BackendKind, ElementKind, KernelSku, MathPrecision, PrecisionGuarantee
from . import flash_f32 as flash
from .launch import available
from .varlen_checks import checked

__all__ = ["SDPA_SKUS", "VARLEN_SKUS"]

# ||out - ref|| <= bound ||mag|| + ||ufl|| (catalog/PRECISION.md). Products and sums of D and of the
# keys in f32 (or in f64, rounded once, on sm_90's FP64 tensor cores), and exp/log in libdevice's
# full precision: a few f32 roundings of the magnitude, widened by softmax's conditioning where
# scores are large. Measured worst on an H100 over every sample and distribution (2026-11-23):
# forward 2.7e-7, backward 1.8e-6 (both on the "large" inputs); with sm_90's f64 products
# (2026-11-27) forward 8.5e-8, backward 5.0e-7 (varlen 8.0e-7). The bounds keep ~10-20x of room
# for longer sequences and other GPUs.
FORWARD_BOUND = 5e-6
BACKWARD_BOUND = 2e-5
ARCH = ArchSku.sm80  # cp.async and up to 108 KiB of shared memory per block (flash_f32.py)

DenseDesc = SdpaDescriptor | SdpaBackwardDescriptor
VarlenDesc = VarlenAttentionDescriptor | VarlenAttentionBackwardDescriptor


# The kernels take each tensor's batch, token and head strides: dense layouts and views into a
# packed QKV alike.
_ANY_STRIDES = "[B,H,S,D] any element strides, d-contiguous; stats [B,Hq,Sq,1] f32"


def _sku(op: OpContract, layout: str, description: str, bound: float) -> KernelSku:
    return op.sku(
        BackendKind.nvrtc, ElementKind.f32, layout=layout, arch=ARCH, description=description,
        guarantee=PrecisionGuarantee(math_precision=MathPrecision.f32,
                                     accumulator=ElementKind.f32, deterministic=True,
                                     bit_stable=True, max_rel_error=bound, capture_safe=True))


def _window(desc: DenseDesc | VarlenDesc) -> tuple[int, int]:
    """The kernels' (left, right) window sides, -1 for unbounded."""
    if desc.window is None:
        return -1, -1
    left, right = desc.window.left, desc.window.right
    return (-1 if left is None else left), (-1 if right is None else right)


def _mask_unfit(desc: DenseDesc | VarlenDesc) -> Unfit | None:
    """The kernels align a window with the causal mask, or top-left without one."""
    if desc.causal is None and desc.alignment == "bottom_right":
        return Unfit(ReasonCode.feature_unsupported,
                     "a bottom-right window without a causal mask: the f32 kernels align a "
                     "window with the causal mask, else top-left")
    return None


def _largest_rows(p: flash.FlashProblem) -> int:
    return max(p.total_q, p.total_kv)


def _largest_elements(p: flash.FlashProblem) -> int:
    return max(p.total_q * p.heads_q * max(p.head_dim, p.head_dim_v),
               p.total_kv * p.heads_kv * max(p.head_dim, p.head_dim_v))


# What the kernels can index, on the problem at the plan's capacity (flash_f32.py's docstring).
LIMITS: tuple[Limit[flash.FlashProblem], ...] = (
    Limit("heads", "heads_q", "heads", "the Delta grid's y extent (one CTA row per head)",
          GRID_YZ_MAX, lambda p: p.heads_q, "flash_f32.py: Delta grid (blocks, heads_q, batch)"),
    Limit("batch", "batch", "sequences", "the grids' y and z extents (one CTA row or layer per "
          "sequence)", GRID_YZ_MAX, lambda p: p.batch,
          "flash_f32.py: grids (heads_q, batch, blocks) and (blocks, heads_q, batch)"),
    Limit("query blocks", f"ceil(max_seqlen_q/{flash.QUERY_BLOCK_ROWS})",
          f"blocks of {flash.QUERY_BLOCK_ROWS} rows",
          "the forward grid's z extent (one CTA layer per query block)", GRID_YZ_MAX,
          flash.query_blocks, "flash_f32.py: forward grid (heads_q, batch, query blocks)"),
    Limit("key blocks", f"ceil(max_seqlen_kv/{flash.DKDV_KEYS})",
          f"blocks of {flash.DKDV_KEYS} keys",
          "the dK/dV grid's z extent (one CTA layer per key block)", GRID_YZ_MAX,
          flash.key_blocks, "flash_f32.py: dK/dV grid (heads_kv, batch, key blocks)"),
    Limit("rows", "batch*max_seqlen (tokens)", "rows", "the kernels' int row index",
          INT32_MAX, _largest_rows, "native/flash_f32.cu: `int` rows, lengths and offsets"),
    Limit("elements", "tokens*heads*head_dim", "elements of a tensor",
          "the kernels' int64 element offsets", INT64_MAX, _largest_elements,
          "native/flash_f32.cu: i64 strides times int rows"),
    workspace_limit(flash.backward_workspace_bytes, "flash_f32.backward_workspace_bytes",
                    "the backward's Delta (one f32 per query row and head) and dQ turn "
                    f"counters (one int32 per sequence, head and {flash.DKDV_ROWS}-row query "
                    "block)"),
)


def _triple(view: TensorView, batch: int, token: int, head: int) -> tuple[int, int, int]:
    return (view.strides[batch] if batch >= 0 else 0, view.strides[token], view.strides[head])


def _shared_unfit(desc: DenseDesc | VarlenDesc, arch: ArchSku | None) -> Unfit | None:
    """The kernels' shared-memory tiles against what one block of ``arch`` may have."""
    if arch is None:
        return None
    need = flash.shared_bytes(desc.head_dim, desc.dim_v)
    have = flash.SHARED_PER_BLOCK[arch]
    if need > have:
        return Unfit(ReasonCode.shape_unsupported,
                     f"head_dim={desc.head_dim}, head_dim_v={desc.dim_v} needs {need} bytes of "
                     f"shared memory per block, more than {arch.value}'s {have}")
    return None


class _FlashSku(SkuImpl):
    """What the four SKUs share: the element, availability, element-aligned tensors (the
    kernels copy 16 bytes at a time where every pointer and stride allows)."""

    sku: KernelSku
    limits = LIMITS

    def unavailable(self) -> str | None:
        return available()

    def unfit_on(self, desc: DenseDesc | VarlenDesc, target) -> Unfit | None:
        return self.unfit(desc) or _shared_unfit(desc, None if target is None else target.arch)

    def _unfit_common(self, desc: DenseDesc | VarlenDesc) -> Unfit | None:
        if desc.element is not ElementKind.f32:
            return Unfit(ReasonCode.element_unsupported,
                         f"serves f32 (true f32 math), problem is {desc.element}")
        mask = _mask_unfit(desc)
        if mask is not None:
            return mask
        try:
            capacity = self._capacity(desc)
        except InvalidProblem as error:  # an extent past what the kernels' ints can index
            return Unfit(ReasonCode.shape_unsupported, str(error))
        reason = flash.supported(capacity)
        if reason is not None:
            return Unfit(ReasonCode.shape_unsupported, reason)
        return check(self.limits, capacity)

    def check_args(self, desc, args: BoundArgs) -> None:
        for name, view in args.present().items():
            expect_aligned(view, name, view.element.itemsize)


# -- dense SDPA ------------------------------------------------------------------------------------

def _dense_problem(desc: DenseDesc) -> flash.FlashProblem:
    left, right = _window(desc)
    return flash.FlashProblem(
        batch=desc.batch, heads_q=desc.heads_q, heads_kv=desc.heads_kv,
        head_dim=desc.head_dim, head_dim_v=desc.dim_v, max_seqlen_q=desc.seq_q,
        max_seqlen_kv=desc.seq_kv, total_q=desc.batch * desc.seq_q,
        total_kv=desc.batch * desc.seq_kv, varlen=False, scale=desc.softmax_scale,
        causal=desc.causal, window_left=left, window_right=right)


def _dense_unfit(desc: DenseDesc) -> Unfit | None:
    for flag, what in ((desc.bias is not None, "a bias"), (desc.alibi, "ALiBi"),
                       (desc.dropout_p > 0.0, "dropout"), (desc.padding, "padding")):
        if flag:
            return Unfit(ReasonCode.feature_unsupported,
                         f"{what}: the f32 kernels serve the causal mask and windows only")
    return None


def _dense_strides(args: BoundArgs, names: dict[str, str]) -> flash.FlashStrides:
    """[B, H, S, D] views: (batch, token, head) strides = dims (0, 2, 1); stats [B, H, S, 1]."""
    triples = {key: _triple(args[name], 0, 2, 1) for key, name in names.items()}
    return flash.FlashStrides(**triples)


class SdpaForwardF32(_FlashSku, SkuImpl[SdpaDescriptor]):
    def __init__(self):
        self.sku = _sku(SDPA_FORWARD, _ANY_STRIDES,
                        "Flash-style forward in true f32, no TF32: online softmax over 64-key "
                        "blocks; on sm_90 Q K^T and P V are f64 products and sums on the FP64 "
                        "tensor cores (each rounded once to f32), elsewhere CUDA-core FMA (128-"
                        "key blocks at d 128 on GPUs that give a block 198 KiB of shared memory)"
                        "; so the bits depend on the GPU, each reproducible; causal and windows; "
                        "GQA.", FORWARD_BOUND)

    _capacity = staticmethod(_dense_problem)

    def unfit(self, desc: SdpaDescriptor) -> Unfit | None:
        return _dense_unfit(desc) or self._unfit_common(desc)

    def workspace_size(self, desc: SdpaDescriptor) -> int:
        # Without save_stats the kernel's log-sum-exp goes to the workspace.
        return 0 if desc.save_stats else Workspace.round_up(4 * desc.batch * desc.heads_q
                                                            * desc.seq_q)

    def prepared(self, desc: SdpaDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        problem = _dense_problem(desc)
        stats = args["stats"]
        if stats is not None:
            lse_ptr, lse_strides = stats.ptr, _triple(stats, 0, 2, 1)
        else:
            lse_ptr, lse_strides = workspace.ptr, (desc.heads_q * desc.seq_q, 1, desc.seq_q)
        strides = flash.FlashStrides(
            **{name: _triple(args[name], 0, 2, 1) for name in ("q", "k", "v", "out")},
            lse=lse_strides)
        return flash.forward_call(problem, args["q"].device, args["q"].ptr,
                                  args["k"].ptr, args["v"].ptr, args["out"].ptr,
                                  lse_ptr, 0, 0, strides, stream)


class SdpaBackwardF32(_FlashSku, SkuImpl[SdpaBackwardDescriptor]):
    def __init__(self):
        self.sku = _sku(SDPA_BACKWARD, _ANY_STRIDES,
                        "Deterministic flash-style backward in true f32: Delta, then dK/dV per "
                        "key block (the GQA group's heads in order), adding dQ in key-block "
                        "order, one key block at a time; on sm_90 the recomputed S and dP are "
                        "f64 sums on the FP64 tensor cores, rounded once.", BACKWARD_BOUND)

    _capacity = staticmethod(_dense_problem)

    def unfit(self, desc: SdpaBackwardDescriptor) -> Unfit | None:
        return _dense_unfit(desc) or self._unfit_common(desc)

    def workspace_size(self, desc: SdpaBackwardDescriptor) -> int:
        return flash.backward_workspace_bytes(_dense_problem(desc))

    def prepared(self, desc: SdpaBackwardDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        names = dict(q="q", k="k", v="v", out="out", lse="stats", dout="grad_out", dq="grad_q",
                     dk="grad_k", dv="grad_v")
        return flash.backward_call(
            _dense_problem(desc), args["q"].device,
            *(args[names[key]].ptr for key in ("q", "k", "v", "out", "dout", "lse", "dq",
                                                    "dk", "dv")),
            0, 0, workspace.ptr, _dense_strides(args, names), stream)


# -- varlen ----------------------------------------------------------------------------------------

def _varlen_problem(desc: VarlenDesc, sequences: int, tokens_q: int,
                    tokens_kv: int) -> flash.FlashProblem:
    left, right = _window(desc)
    return flash.FlashProblem(
        batch=sequences, heads_q=desc.heads_q, heads_kv=desc.heads_kv, head_dim=desc.head_dim,
        head_dim_v=desc.dim_v, max_seqlen_q=desc.max_seqlen_q, max_seqlen_kv=desc.max_seqlen_kv,
        total_q=tokens_q, total_kv=tokens_kv, varlen=True, scale=desc.softmax_scale,
        causal=desc.causal, window_left=left, window_right=right)


def _varlen_capacity(desc: VarlenDesc) -> flash.FlashProblem:
    return _varlen_problem(desc, desc.batch, desc.max_tokens_q, desc.max_tokens_kv)


def _call_problem(desc: VarlenDesc, args: BoundArgs) -> flash.FlashProblem:
    """This call's problem: its sequence count and token counts, within the capacities."""
    return _varlen_problem(desc, args["cu_seqlens_q"].shape[0] - 1, args["q"].shape[0],
                           args["k"].shape[0])


def _packed_strides(args: BoundArgs, names: dict[str, str], lse_tokens: int
                    ) -> flash.FlashStrides:
    """[T, H, D] views: (batch, token, head) strides = (0, dim 0, dim 1); lse [Hq, Tq]."""
    triples = {key: _triple(args[name], -1, 0, 1) for key, name in names.items()}
    return flash.FlashStrides(**triples, lse=(0, 1, lse_tokens))


class VarlenForwardF32(_FlashSku, SkuImpl[VarlenAttentionDescriptor]):
    def __init__(self):
        self.sku = _sku(VARLEN_ATTENTION_FORWARD,
                        "packed [T,H,D], token and head strides free, d-contiguous; lse [Hq,Tq]",
                        "Flash-style forward in true f32 over packed sequences (offsets read "
                        "and clamped on the device); causal top-left/bottom-right, windows, GQA; "
                        "key blocks and products as sdpa_forward.nvrtc.f32's.",
                        FORWARD_BOUND)

    _capacity = staticmethod(_varlen_capacity)

    def unfit(self, desc: VarlenAttentionDescriptor) -> Unfit | None:
        return self._unfit_common(desc)

    def workspace_size(self, desc: VarlenAttentionDescriptor) -> int:
        # Without save_lse the log-sum-exp goes to the workspace, sized for the most tokens.
        return 0 if desc.save_lse else Workspace.round_up(4 * desc.heads_q * desc.max_tokens_q)

    def prepared(self, desc: VarlenAttentionDescriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None):
        problem = _call_problem(desc, args)
        lse = args["lse"]
        lse_ptr = lse.ptr if lse is not None else workspace.ptr
        strides = _packed_strides(args, dict(q="q", k="k", v="v", out="out"), problem.total_q)
        call = flash.forward_call(problem, args["q"].device, args["q"].ptr,
                                  args["k"].ptr, args["v"].ptr, args["out"].ptr,
                                  lse_ptr, args["cu_seqlens_q"].ptr,
                                  args["cu_seqlens_kv"].ptr, strides, stream)
        return checked(desc, args, stream, call) if desc.checked else call


class VarlenBackwardF32(_FlashSku, SkuImpl[VarlenAttentionBackwardDescriptor]):
    def __init__(self):
        self.sku = _sku(VARLEN_ATTENTION_BACKWARD,
                        "packed [T,H,D], token and head strides free, d-contiguous; lse [Hq,Tq]",
                        "Deterministic flash-style backward in true f32 over packed sequences: "
                        "Delta, dK/dV per key block adding dQ in key-block order, one key block "
                        "at a time; products as sdpa_backward.nvrtc.f32's.",
                        BACKWARD_BOUND)

    _capacity = staticmethod(_varlen_capacity)

    def unfit(self, desc: VarlenAttentionBackwardDescriptor) -> Unfit | None:
        return self._unfit_common(desc)

    def workspace_size(self, desc: VarlenAttentionBackwardDescriptor) -> int:
        return flash.backward_workspace_bytes(_varlen_capacity(desc))

    def prepared(self, desc: VarlenAttentionBackwardDescriptor, args: BoundArgs,
                 workspace: Workspace, stream: int | None):
        problem = _call_problem(desc, args)
        names = dict(q="q", k="k", v="v", out="out", dout="grad_out", dq="grad_q", dk="grad_k",
                     dv="grad_v")
        call = flash.backward_call(
            problem, args["q"].device,
            *(args[name].ptr for name in ("q", "k", "v", "out", "grad_out", "lse", "grad_q",
                                               "grad_k", "grad_v")),
            args["cu_seqlens_q"].ptr, args["cu_seqlens_kv"].ptr, workspace.ptr,
            _packed_strides(args, names, problem.total_q), stream)
        return checked(desc, args, stream, call) if desc.checked else call


SDPA_SKUS = {SDPA_FORWARD.name: (SdpaForwardF32(),), SDPA_BACKWARD.name: (SdpaBackwardF32(),)}
VARLEN_SKUS = {VARLEN_ATTENTION_FORWARD.name: (VarlenForwardF32(),),
               VARLEN_ATTENTION_BACKWARD.name: (VarlenBackwardF32(),)}
