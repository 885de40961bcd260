"""What ``opfacade verify``, the bench and the GPU tests allocate and feed the sdpa ops: each op's
arguments as ``TensorSpec``s (in the contract's layouts), the standard problems, and the inputs
random values cannot be (valid sequence lengths, Philox seeds, a backward's saved tensors).

The sdpa contract (``contracts/sdpa.py``) references these from its ``OpContract``s and is
imported by this module's functions when they run, not at import: the contract imports this
module, and every layout fact they use stays in the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._internal.contract import TensorSpec
from ..errors import InvalidProblem
from ..types import ElementKind
from .attention_masks import large_backward_scales, large_forward_scales

if TYPE_CHECKING:
    from .sdpa import SdpaBackwardDescriptor, SdpaDescriptor

__all__ = ["SAMPLES", "backward_large", "backward_samples", "backward_signature",
           "forward_large", "forward_samples", "forward_signature", "verification_inputs"]

# ----------------------------------------------------------------------------- arguments


def _layout_spec(desc: SdpaDescriptor | SdpaBackwardDescriptor, shape: tuple[int, ...],
                 role: str = "in") -> TensorSpec:
    """A [B, H, S, D] argument stored in the descriptor's layout (BSHD memory, say)."""
    from .sdpa import dense_strides

    return TensorSpec(shape, desc.element, role, dense_strides(desc.layout, *shape))


def _input_spec(desc: SdpaDescriptor | SdpaBackwardDescriptor, name: str) -> TensorSpec:
    """q, k or v: dense in the layout, or with the descriptor's ``qkv_strides``."""
    return TensorSpec(getattr(desc, f"{name}_shape"), desc.element, "in",
                      desc.input_strides(name))


def _stats_spec(desc: SdpaDescriptor | SdpaBackwardDescriptor, role: str) -> TensorSpec:
    from .sdpa import stats_strides

    return TensorSpec(desc.stats_shape, desc.stats_element, role, stats_strides(desc))


def forward_signature(desc: SdpaDescriptor) -> dict[str, TensorSpec]:
    signature = {
        "q": _input_spec(desc, "q"),
        "k": _input_spec(desc, "k"),
        "v": _input_spec(desc, "v"),
        "out": _layout_spec(desc, desc.o_shape, "out"),
    }
    if desc.save_stats:
        signature["stats"] = _stats_spec(desc, "out")
    return {**signature, **_extra_signature(desc)}


def _extra_signature(desc: SdpaDescriptor | SdpaBackwardDescriptor) -> dict[str, TensorSpec]:
    extra = {}
    if desc.bias is not None:
        extra["bias"] = TensorSpec(desc.bias_shape, desc.element)
    if desc.padding:
        extra["seq_len_q"] = TensorSpec((desc.batch,), ElementKind.i32)
        extra["seq_len_kv"] = TensorSpec((desc.batch,), ElementKind.i32)
    if desc.dropout_p > 0.0:
        extra["dropout_seed"] = TensorSpec((1,), ElementKind.i64)
        extra["dropout_offset"] = TensorSpec((1,), ElementKind.i64)
    return extra


def backward_signature(desc: SdpaBackwardDescriptor) -> dict[str, TensorSpec]:
    signature = {
        "q": _input_spec(desc, "q"),
        "k": _input_spec(desc, "k"),
        "v": _input_spec(desc, "v"),
        "out": _layout_spec(desc, desc.o_shape),
        "grad_out": _layout_spec(desc, desc.o_shape),
        "stats": _stats_spec(desc, "in"),
        "grad_q": _layout_spec(desc, desc.q_shape, "out"),
        "grad_k": _layout_spec(desc, desc.k_shape, "out"),
        "grad_v": _layout_spec(desc, desc.v_shape, "out"),
    }
    extra = _extra_signature(desc)
    if "bias" in extra:
        signature["bias"] = extra.pop("bias")
    if desc.need_bias_grad:
        signature["grad_bias"] = TensorSpec(desc.bias_shape, desc.element, "out")
    return {**signature, **extra}


# ----------------------------------------------------------------------------- problems

# Verify-ready problems (no padding or dropout: those need lengths and cuDNN's mask, which the
# GPU tests supply). Odd lengths exercise the kernels' tails; each feature appears at least once.
SAMPLES = (
    dict(batch=2, heads_q=4, heads_kv=4, seq_q=128, seq_kv=128, head_dim=64),
    dict(batch=2, heads_q=4, heads_kv=4, seq_q=200, seq_kv=300, head_dim=128, causal="top_left"),
    dict(batch=2, heads_q=4, heads_kv=2, seq_q=130, seq_kv=300, head_dim=64,
         causal="bottom_right", layout="bshd"),
    dict(batch=2, heads_q=4, heads_kv=1, seq_q=256, seq_kv=256, head_dim=64,
         window=(64, 0)),
    dict(batch=1, heads_q=4, heads_kv=4, seq_q=160, seq_kv=224, head_dim=64,
         window=(48, 16), layout="sbhd"),
    dict(batch=2, heads_q=8, heads_kv=2, seq_q=192, seq_kv=192, head_dim=128, head_dim_v=64,
         bias="1hqk"),
    dict(batch=2, heads_q=6, heads_kv=3, seq_q=128, seq_kv=128, head_dim=64, alibi=True,
         causal="top_left", scale=0.1),
    # q, k, v sliced from one packed [B, S, Hq + 2 Hkv, D] projection: each read in place,
    # with the other two's columns between its rows.
    dict(batch=2, heads_q=4, heads_kv=2, seq_q=160, seq_kv=160, head_dim=64, causal="top_left",
         layout="bshd", qkv_strides={name: (160 * 512, 64, 512, 1) for name in "qkv"}),
)


def forward_samples(element: ElementKind) -> list[SdpaDescriptor]:
    from .sdpa import SdpaDescriptor

    return [SdpaDescriptor(**shape, element=element, save_stats=True) for shape in SAMPLES]


def backward_samples(element: ElementKind) -> list[SdpaBackwardDescriptor]:
    from .sdpa import SdpaBackwardDescriptor

    return [SdpaBackwardDescriptor(**shape, element=element, need_bias_grad="bias" in shape)
            for shape in SAMPLES]


# ----------------------------------------------------------------------------- inputs


def verification_inputs(desc: SdpaDescriptor | SdpaBackwardDescriptor,
                        inputs: dict[str, np.ndarray], rng: np.random.Generator
                        ) -> dict[str, np.ndarray]:
    """Makes random inputs (float64, already rounded) consistent where the op needs it.

    Sequence lengths become valid int32 lengths (seq_len_q <= seq_len_kv under a bottom-right
    diagonal or a left window bound, so that no row is empty), dropout seed/offset become int64
    values, and for the backward ``out`` and ``stats`` become the reference forward's, rounded
    to their elements: the backward reads them as the forward left them.
    """
    from .sdpa import SdpaBackwardDescriptor

    result = dict(inputs)
    if desc.padding:
        len_kv = rng.integers(1, desc.seq_kv + 1, size=desc.batch)
        banded = desc.alignment == "bottom_right" or desc.left_bound is not None
        high = np.minimum(desc.seq_q, len_kv) if banded else np.full(desc.batch, desc.seq_q)
        len_q = np.array([rng.integers(1, h + 1) for h in high])
        result["seq_len_q"] = len_q.astype(np.int32)
        result["seq_len_kv"] = len_kv.astype(np.int32)
    if desc.dropout_p > 0.0:
        result["dropout_seed"] = rng.integers(1, 1 << 40, size=1, dtype=np.int64)
        result["dropout_offset"] = rng.integers(0, 1 << 20, size=1, dtype=np.int64)
    if isinstance(desc, SdpaBackwardDescriptor):
        result.update(_saved_by_the_forward(desc, result))
    return result


def _saved_by_the_forward(desc: SdpaBackwardDescriptor, inputs: dict[str, np.ndarray]
                          ) -> dict[str, np.ndarray]:
    """``out`` and ``stats`` as the reference forward leaves them, rounded to their elements."""
    if desc.dropout_p > 0.0:
        raise InvalidProblem("a dropout backward is checked with cuDNN's dumped mask",
                             field="dropout_p")
    from .._backends.reference.sdpa import sdpa_forward  # the oracle's forward
    from ..testing import _from_bits, _to_bits
    from .sdpa import reference_options

    out, lse = sdpa_forward(inputs["q"], inputs["k"], inputs["v"], bias=inputs.get("bias"),
                            seq_len_q=inputs.get("seq_len_q"),
                            seq_len_kv=inputs.get("seq_len_kv"), **reference_options(desc))
    lse = np.where(np.isfinite(lse), lse, 0.0)  # padded rows' stats are unspecified
    return {"out": _from_bits(_to_bits(out, desc.element), desc.element),
            "stats": lse[..., None].astype(np.float32).astype(np.float64)}


def forward_large(desc: SdpaDescriptor) -> dict[str, float]:
    return large_forward_scales(desc)


def backward_large(desc: SdpaBackwardDescriptor) -> dict[str, float]:
    return large_backward_scales(desc, desc.seq_q, desc.seq_kv)
