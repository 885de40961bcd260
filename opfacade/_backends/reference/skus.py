"""The float64 reference as host SKUs, one table per family: the oracle behind the tests and
`opfacade verify`.

Selection never offers them for a GPU target (reason ``reference_is_oracle``); they are chosen
only for ``device='cpu'``, with NumPy arrays, for debugging and for checking the GPU SKUs. The
math lives beside this module (``alibi.py``, ``linear.py``, ``sdpa.py``), free of any opfacade
type, and is tested against independent formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from ..._internal.contract import BoundArgs, Descriptor, OpContract
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import as_numpy
from ...contracts import (
    alibi,
    decode_attention,
    kv_append,
    kv_cache,
    linear,
    sdpa,
    varlen_attention,
)
from ...types import BackendKind, ElementKind, MathPrecision, PrecisionGuarantee
from . import alibi as alibi_math
from . import decode as decode_math
from . import linear as linear_math
from . import sdpa as sdpa_math
from . import varlen as varlen_math

__all__ = ["ALIBI", "DECODE_ATTENTION", "KV_APPEND", "LINEAR", "SDPA", "VARLEN_ATTENTION",
           "ReferenceSku"]

D = TypeVar("D", bound=Descriptor)

REFERENCE_GUARANTEE = PrecisionGuarantee(
    math_precision=MathPrecision.f64,
    accumulator=ElementKind.f64,
    deterministic=True,
    bit_stable=True,
    max_rel_error=1e-14,
    capture_safe=False,  # runs on the host
)

# compute(descriptor, arrays by argument name) -> results by output argument name, in float64.
# A magnitude reference has the same form: each result over absolute values (PrecisionGuarantee).
Compute = Callable[[D, dict[str, np.ndarray]], dict[str, np.ndarray]]
# underflow(descriptor, arrays, unit=...) -> the underflow allowance of each output: what
# rounding the GPU kernels' element-typed intermediates into subnormals of spacing ``unit`` can
# lose. A Compute taking the keyword ``unit``.
Underflow = Callable[..., dict[str, np.ndarray]]


class ReferenceSku(SkuImpl[D], Generic[D]):
    """Runs ``compute`` in float64 and rounds once into the caller's output arrays.

    ``magnitude`` gives the scale each GPU SKU's error bound is stated against; an output it
    leaves out (a bit-mask) is held to its own size. ``underflow``, for ops whose GPU kernels
    round an intermediate to the element type, gives what that can lose in the subnormal range
    (catalog/PRECISION.md).
    """

    def __init__(self, op: OpContract[D], compute: Compute, magnitude: Compute,
                 description: str, underflow: Underflow | None = None):
        self.compute = compute
        self.magnitude = magnitude
        self.underflow = underflow
        self.sku = op.sku(BackendKind.reference, ElementKind.f64, guarantee=REFERENCE_GUARANTEE,
                          layout="any", arch=None,
                          description=description + " Float64 on the host; output rounded once "
                                                    "to its type.")

    def prepared(self, desc: D, args: BoundArgs, workspace: Workspace, stream: int | None):
        arrays = {name: as_numpy(view) for name, view in args.present().items()}
        outputs = {name: arrays[name] for name in args.outputs if name in arrays}

        def compute_into_outputs() -> None:
            # Fresh compact copies: NumPy sums a strided array in its memory order, and BLAS
            # takes other paths for unaligned data, so computing on the caller's arrays would
            # make the bits depend on their layout and address; bit_stable promises they depend
            # on the values alone.
            compact = {name: array if name in outputs else np.array(array, order="C")
                       for name, array in arrays.items()}
            for name, value in self.compute(desc, compact).items():
                np.copyto(outputs[name], value, casting="unsafe")

        return compute_into_outputs


# -- alibi ----------------------------------------------------------------------------------------

def _alibi_forward(desc: alibi.AlibiForwardDescriptor, arrays: dict) -> dict:
    return {"output": alibi_math.alibi_forward(arrays["input"], arrays["slopes"])}


def _alibi_backward(desc: alibi.AlibiBackwardDescriptor, arrays: dict) -> dict:
    d_in, d_slopes = alibi_math.alibi_backward(
        arrays["grad_output"], need_input_grad=desc.need_input_grad,
        need_slope_grad=desc.need_slope_grad)
    results = {"grad_input": d_in, "grad_slopes": d_slopes}
    return {name: value for name, value in results.items() if value is not None}


def _alibi_forward_magnitude(desc: alibi.AlibiForwardDescriptor, arrays: dict) -> dict:
    result = "input" if desc.in_place else "output"  # where the signature puts the result
    return {result: alibi_math.alibi_forward_magnitude(arrays["input"], arrays["slopes"])}


def _alibi_backward_magnitude(desc: alibi.AlibiBackwardDescriptor, arrays: dict) -> dict:
    d_in, d_slopes = alibi_math.alibi_backward_magnitude(
        arrays["grad_output"], need_input_grad=desc.need_input_grad,
        need_slope_grad=desc.need_slope_grad)
    results = {"grad_input": d_in, "grad_slopes": d_slopes}
    return {name: value for name, value in results.items() if value is not None}


ALIBI = {
    alibi.ALIBI_FORWARD.name: (ReferenceSku(alibi.ALIBI_FORWARD, _alibi_forward,
                                            _alibi_forward_magnitude,
                                            "Y = A + slope[h]*(j - i)."),),
    alibi.ALIBI_BACKWARD.name: (ReferenceSku(alibi.ALIBI_BACKWARD, _alibi_backward,
                                             _alibi_backward_magnitude,
                                             "dA = dY; dslope[h] = sum dY*(j - i)."),),
}


# -- linear ---------------------------------------------------------------------------------------

def _linear_forward_with(forward: Callable, *, masks: bool) -> Compute:
    """The forward op's compute over ``forward`` (the results, or their magnitude references,
    where a ReLU bit-mask aux has none: ``masks=False`` leaves it out)."""

    def compute(desc: linear.LinearDescriptor, arrays: dict) -> dict:
        out, pre = forward(arrays["x"], arrays["weight"], weight_layout=desc.weight_layout,
                           bias=arrays.get("bias"), activation=desc.activation,
                           residual=arrays.get("residual"))
        results = {"out": out}
        if desc.save_aux and (masks or not desc.aux_layout.mask):
            results["aux"] = desc.aux_layout.encode(pre)
        return results

    return compute


def _linear_backward_with(backward: Callable) -> Compute:
    """The backward op's compute over ``backward`` (the gradients or their magnitudes)."""

    def compute(desc: linear.LinearBackwardDescriptor, arrays: dict) -> dict:
        grad_out = arrays["grad_out"]
        aux = desc.aux_layout  # the ReLU mask's signs stand in for the pre-activation
        pre = np.zeros(grad_out.shape) if aux is None else aux.decode(arrays["aux"], desc.n)
        grads = backward(grad_out, arrays["x"], arrays["weight"], pre,
                         weight_layout=desc.weight_layout, activation=desc.activation,
                         need_bias_grad=desc.need_bias_grad)
        results = {"grad_x": grads["dx"], "grad_weight": grads["dw"], "grad_bias": grads["dbias"],
                   "grad_pre": grads["d_pre"]}
        return {name: value for name, value in results.items() if name in arrays}

    return compute


def _linear_backward_underflow(desc: linear.LinearBackwardDescriptor, arrays: dict,
                               unit: float) -> dict:
    grads = linear_math.linear_backward_underflow(
        arrays["grad_out"], arrays["x"], arrays["weight"], unit=unit,
        weight_layout=desc.weight_layout, need_bias_grad=desc.need_bias_grad)
    results = {"grad_x": grads["dx"], "grad_weight": grads["dw"], "grad_bias": grads["dbias"]}
    return {name: value for name, value in results.items() if name in arrays}


_linear_forward = _linear_forward_with(linear_math.linear_forward, masks=True)
_linear_backward = _linear_backward_with(linear_math.linear_backward)


LINEAR = {
    linear.LINEAR_FORWARD.name: (ReferenceSku(
        linear.LINEAR_FORWARD, _linear_forward,
        _linear_forward_with(linear_math.linear_forward_magnitude, masks=False),
        "act(x @ W + bias + residual), and the aux."),),
    linear.LINEAR_BACKWARD.name: (ReferenceSku(
        linear.LINEAR_BACKWARD, _linear_backward,
        _linear_backward_with(linear_math.linear_backward_magnitude),
        "d_pre = grad_out * act'(pre); dbias, dx = d_pre W^T, dW = x^T d_pre.",
        underflow=_linear_backward_underflow),),
}


# -- sdpa -----------------------------------------------------------------------------------------

def _lengths(arrays: dict) -> dict:
    return {"seq_len_q": arrays.get("seq_len_q"), "seq_len_kv": arrays.get("seq_len_kv")}


def _sdpa_forward_with(forward: Callable) -> Compute:
    """The forward op's compute over ``forward``: the results, their magnitude references or
    their underflow allowances (keywords such as ``unit`` pass through)."""

    def compute(desc: sdpa.SdpaDescriptor, arrays: dict, **extra) -> dict:
        out, lse = forward(arrays["q"], arrays["k"], arrays["v"], bias=arrays.get("bias"),
                           **_lengths(arrays), **sdpa.reference_options(desc), **extra)
        results = {"out": out}
        if desc.save_stats:
            results["stats"] = lse[..., None]  # the [B, Hq, Sq, 1] layout contract
        return results

    return compute


def _sdpa_backward_with(backward: Callable) -> Compute:
    """The backward op's compute over ``backward`` (the gradients or their twins)."""

    def compute(desc: sdpa.SdpaBackwardDescriptor, arrays: dict, **extra) -> dict:
        grads = backward(arrays["q"], arrays["k"], arrays["v"], arrays["grad_out"],
                         bias=arrays.get("bias"), need_bias_grad=desc.need_bias_grad,
                         **_lengths(arrays), **sdpa.reference_options(desc), **extra)
        results = {"grad_q": grads["dq"], "grad_k": grads["dk"], "grad_v": grads["dv"]}
        if desc.need_bias_grad:
            results["grad_bias"] = grads["dbias"]
        return results

    return compute


_sdpa_forward = _sdpa_forward_with(sdpa_math.sdpa_forward)
_sdpa_backward = _sdpa_backward_with(sdpa_math.sdpa_backward)


class _SdpaReference(ReferenceSku):
    """The float64 oracle; it draws no dropout mask, so it cannot serve dropout on its own."""

    def unfit(self, desc) -> Unfit | None:
        if desc.dropout_p > 0.0:
            return Unfit(ReasonCode.feature_unsupported,
                         "the reference has no Philox generator; dropout is checked against it "
                         "with the mask cuDNN dumps (reference.sdpa_forward(dropout_keep=...))")
        return None


SDPA = {
    sdpa.SDPA_FORWARD.name: (_SdpaReference(
        sdpa.SDPA_FORWARD, _sdpa_forward,
        _sdpa_forward_with(sdpa_math.sdpa_forward_magnitude),
        "softmax(scale*q.k + bias + alibi, masked).v and its log-sum-exp.",
        underflow=_sdpa_forward_with(sdpa_math.sdpa_forward_underflow)),),
    sdpa.SDPA_BACKWARD.name: (_SdpaReference(
        sdpa.SDPA_BACKWARD, _sdpa_backward,
        _sdpa_backward_with(sdpa_math.sdpa_backward_magnitude),
        "Analytic dq, dk, dv (and dbias), recomputing the probabilities.",
        underflow=_sdpa_backward_with(sdpa_math.sdpa_backward_underflow)),),
}


# -- varlen_attention ----------------------------------------------------------------------------

def _packed_inputs(arrays: dict) -> tuple:
    return (arrays["q"], arrays["k"], arrays["v"])


def _offsets(arrays: dict) -> tuple:
    return (arrays["cu_seqlens_q"], arrays["cu_seqlens_kv"])


def _checked(compute: Callable) -> Callable:
    """``compute`` after the offsets' values are checked (the host reads them anyway): a bad
    one is InvalidArgument naming it and its first bad index."""

    def checked(desc, arrays: dict, **extra) -> dict:
        varlen_attention.check_offsets(desc, *_offsets(arrays), arrays["q"].shape[0],
                                       arrays["k"].shape[0])
        return compute(desc, arrays, **extra)

    return checked


def _varlen_forward_with(forward: Callable) -> Compute:
    """The forward op's compute over ``forward`` (the results or their twins), lse in the
    contract's [Hq, Tq] layout."""

    def compute(desc: varlen_attention.VarlenAttentionDescriptor, arrays: dict, **extra) -> dict:
        out, lse = forward(*_packed_inputs(arrays), *_offsets(arrays),
                           **varlen_attention.reference_options(desc), **extra)
        return {"out": out, **({"lse": lse.T} if desc.save_lse else {})}

    return _checked(compute)


def _varlen_backward_with(backward: Callable) -> Compute:
    """The backward op's compute over ``backward`` (the gradients or their twins)."""

    def compute(desc: varlen_attention.VarlenAttentionBackwardDescriptor, arrays: dict,
                **extra) -> dict:
        grads = backward(*_packed_inputs(arrays), arrays["grad_out"], *_offsets(arrays),
                         **varlen_attention.reference_options(desc), **extra)
        return dict(zip(("grad_q", "grad_k", "grad_v"), grads, strict=True))

    return _checked(compute)


# Which offsets own each output's rows, and the axis its tokens run along.
_OWNERS = {"out": ("cu_seqlens_q", 0), "lse": ("cu_seqlens_q", 1),
           "grad_q": ("cu_seqlens_q", 0), "grad_k": ("cu_seqlens_kv", 0),
           "grad_v": ("cu_seqlens_kv", 0)}


def _keeping_unowned_rows(compute: Compute) -> Compute:
    """``compute`` whose results keep, in rows past the last offset (tokens no sequence owns),
    what the caller's output buffers held."""

    def keeping(desc, arrays: dict) -> dict:
        results = compute(desc, arrays)
        for name, value in results.items():
            offsets, axis = _OWNERS[name]
            owned = np.arange(value.shape[axis]) < int(arrays[offsets][-1])
            shape = [1] * value.ndim
            shape[axis] = -1
            results[name] = np.where(owned.reshape(shape), value, arrays[name])
        return results

    return keeping


class _VarlenReference(ReferenceSku):
    """The float64 oracle reads cu_seqlens on the host, so it checks their values with the
    arguments (can_implement says what run would), and again when a prepared call runs."""

    def check_args(self, desc, args: BoundArgs) -> None:
        varlen_attention.check_offsets(desc, as_numpy(args["cu_seqlens_q"]),
                                       as_numpy(args["cu_seqlens_kv"]), args["q"].shape[0],
                                       args["k"].shape[0])


VARLEN_ATTENTION = {
    varlen_attention.VARLEN_ATTENTION_FORWARD.name: (_VarlenReference(
        varlen_attention.VARLEN_ATTENTION_FORWARD,
        _keeping_unowned_rows(_varlen_forward_with(varlen_math.varlen_forward)),
        _varlen_forward_with(varlen_math.varlen_forward_magnitude),
        "Each packed sequence's softmax(scale*q.k, masked).v and log-sum-exp.",
        underflow=_varlen_forward_with(varlen_math.varlen_forward_underflow)),),
    varlen_attention.VARLEN_ATTENTION_BACKWARD.name: (_VarlenReference(
        varlen_attention.VARLEN_ATTENTION_BACKWARD,
        _keeping_unowned_rows(_varlen_backward_with(varlen_math.varlen_backward)),
        _varlen_backward_with(varlen_math.varlen_backward_magnitude),
        "Analytic dq, dk, dv of each packed sequence, recomputing its probabilities.",
        underflow=_varlen_backward_with(varlen_math.varlen_backward_underflow)),),
}


# -- decode_attention and kv_append ---------------------------------------------------------------

def _decode_with(forward: Callable) -> Compute:
    """The decode step's compute over ``forward`` (sdpa_forward or its magnitude twin)."""

    def compute(desc: decode_attention.DecodeAttentionDescriptor, arrays: dict) -> dict:
        window = None if desc.window is None else desc.window.left
        out, lse = decode_math.decode_attention(
            arrays["q"], arrays["k_cache"], arrays["v_cache"], arrays["seq_lens"],
            kv_layout=desc.kv_layout, page_table=arrays.get("page_table"),
            scale=desc.softmax_scale, window_left=window, forward=forward)
        return {"out": out, "lse": lse} if desc.save_lse else {"out": out}

    return compute


def _kv_append(desc: kv_append.KvAppendDescriptor, arrays: dict) -> dict:
    k_cache, v_cache = decode_math.kv_append(
        arrays["k_new"], arrays["v_new"], arrays["k_cache"], arrays["v_cache"],
        arrays["seq_lens"], kv_layout=desc.kv_layout, page_table=arrays.get("page_table"))
    return {"k_cache": k_cache, "v_cache": v_cache}


def _kv_append_magnitude(desc: kv_append.KvAppendDescriptor, arrays: dict) -> dict:
    return {name: np.abs(value) for name, value in _kv_append(desc, arrays).items()}


class _TensorCacheReference(ReferenceSku):
    """The float64 oracle reads caches as host arrays: per-sequence device addresses
    ("pointers") are beyond it; tests check that form against its contiguous twin. It reads
    seq_lens and page tables on the host, so it checks them with the arguments, by checked
    mode's rules."""

    def check_args(self, desc, args: BoundArgs) -> None:
        table = args["page_table"]
        kv_cache.check_lengths(desc, as_numpy(args["seq_lens"]),
                               None if table is None else as_numpy(table),
                               args["k_cache"].shape[0])

    def unfit(self, desc) -> Unfit | None:
        if desc.cache == "pointers":
            return Unfit(ReasonCode.feature_unsupported,
                         'cache="pointers" holds device addresses, which the host oracle '
                         "cannot read")
        return None


DECODE_ATTENTION = {decode_attention.DECODE_ATTENTION.name: (_TensorCacheReference(
    decode_attention.DECODE_ATTENTION, _decode_with(sdpa_math.sdpa_forward),
    _decode_with(sdpa_math.sdpa_forward_magnitude),
    "Each sequence's new tokens' softmax(scale*q.k, causal, windowed).v over its cache, and "
    "log-sum-exp."),)}
KV_APPEND = {kv_append.KV_APPEND.name: (_TensorCacheReference(
    kv_append.KV_APPEND, _kv_append, _kv_append_magnitude,
    "The caches with each sequence's new tokens written at their positions."),)}
