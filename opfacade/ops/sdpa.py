"""SDPA plans and functional forms, over the sdpa contract (``opfacade/contracts/sdpa.py``).

    desc = SdpaDescriptor(batch=2, heads_q=32, heads_kv=8, seq_q=4096, seq_kv=4096,
                          head_dim=128, element="bf16", causal="top_left", save_stats=True)
    pair = SdpaForwardPlan.select_for_training(desc, PlanPreference(deterministic=True))
    pair.forward.run(SdpaArgs(q, k, v, out, stats), stream=s)
"""

from __future__ import annotations

from typing import Any

from .._internal.memory import OutputAllocator
from .._internal.tensors import TensorView, wrap
from ..contracts.sdpa import (
    LAYOUTS,
    MEMORY_ORDER,
    SDPA_BACKWARD,
    SDPA_FORWARD,
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    SlidingWindow,
    layout_of,
)
from ..errors import LayoutMismatch, ShapeMismatch
from ..plan import plan_class
from ..types import ElementKind, PlanPreference

__all__ = [
    "SlidingWindow",
    "SdpaDescriptor",
    "SdpaBackwardDescriptor",
    "SdpaArgs",
    "SdpaBackwardArgs",
    "SdpaForwardPlan",
    "SdpaBackwardPlan",
    "sdpa",
    "sdpa_backward",
]

SdpaForwardPlan = plan_class(SDPA_FORWARD.name)
SdpaBackwardPlan = plan_class(SDPA_BACKWARD.name)


def _infer_layout(view: TensorView, name: str) -> str:
    """The dense layout ``view`` is stored in (the contract's ``layout_of``)."""
    if view.ndim != 4:
        raise ShapeMismatch(f"{name} must be 4-D [batch, heads, seq, dim], got shape "
                            f"{view.shape}", argument=name)
    layout = layout_of(view.shape, view.strides)
    if layout is not None:
        return layout
    if view.device is None:
        return "bhsd"  # the host reference reads any strides
    raise LayoutMismatch(f"{name} must be a dense {'/'.join(LAYOUTS)} tensor, got strides "
                         f"{view.strides} for shape {view.shape}", argument=name)


def _bias_spec(bias: Any, q: TensorView, k: TensorView) -> str | None:
    if bias is None:
        return None
    view = wrap(bias, "bias")
    batch, heads, seq_q, seq_kv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    shape = view.shape
    if (len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, heads)
            or shape[2:] != (seq_q, seq_kv)):
        raise ShapeMismatch(f"bias must have shape ({batch} or 1, {heads} or 1, {seq_q}, "
                            f"{seq_kv}) to broadcast over the scores, got {shape}",
                            argument="bias")
    return ("b" if shape[0] == batch and batch > 1 else "1") + (
        "h" if shape[1] == heads and heads > 1 else "1") + "qk"


def _problem(q: Any, k: Any, v: Any, *, causal, window, scale, bias, alibi, dropout_p,
             seq_len_q) -> tuple[dict, TensorView]:
    qv, kv, vv = wrap(q, "q"), wrap(k, "k"), wrap(v, "v")
    layout = _infer_layout(qv, "q")
    _infer_layout(kv, "k")
    _infer_layout(vv, "v")
    batch, heads_q, seq_q, head_dim = qv.shape
    fields = dict(batch=batch, heads_q=heads_q, heads_kv=kv.shape[1], seq_q=seq_q,
                  seq_kv=kv.shape[2], head_dim=head_dim, head_dim_v=vv.shape[3],
                  element=qv.element, layout=layout, scale=scale, causal=causal, window=window,
                  bias=_bias_spec(bias, qv, kv), alibi=alibi, dropout_p=dropout_p,
                  padding=seq_len_q is not None)
    return fields, qv


def _allocate(shape: tuple[int, ...], layout: str, like: TensorView, stream: Any,
              element: ElementKind | None = None) -> Any:
    """A new array of logical ``shape`` stored in ``layout`` order, from like's framework."""
    allocate = OutputAllocator(like, stream)
    order = MEMORY_ORDER[layout]
    memory = allocate(tuple(shape[i] for i in order), element or like.element)
    inverse = tuple(order.index(i) for i in range(4))
    if inverse == (0, 1, 2, 3):
        return memory
    return memory.permute(*inverse) if allocate.owner == "torch" else memory.transpose(inverse)


def _device_of(view: TensorView) -> int | str:
    return "cpu" if view.device is None else view.device


def sdpa(q: Any, k: Any, v: Any, *, causal: bool | str | None = None,
              window: tuple[int | None, int | None] | None = None, scale: float | None = None,
              bias: Any = None, alibi: bool = False, dropout_p: float = 0.0,
              dropout_seed: Any = None, dropout_offset: Any = None, seq_len_q: Any = None,
              seq_len_kv: Any = None, return_stats: bool = False, out: Any = None,
              stream: Any = None) -> Any:
    """Functional form of SdpaForwardPlan: returns ``out`` (allocated when None), or
    ``(out, stats)`` when ``return_stats``.

    The descriptor comes from the tensors (layout from q's strides, bias shape from bias);
    ``causal`` is True/"top_left" or "bottom_right"; the other arguments are those of
    SdpaDescriptor and SdpaArgs. Uses the process-wide plan cache.
    """
    fields, qv = _problem(q, k, v, causal=causal, window=window, scale=scale, bias=bias,
                          alibi=alibi, dropout_p=dropout_p, seq_len_q=seq_len_q)
    desc = SdpaDescriptor(**fields, save_stats=return_stats)
    plan = SdpaForwardPlan.cached(desc, device=_device_of(qv))
    if out is None:
        out = _allocate(desc.o_shape, desc.layout, qv, stream)
    stats = (_allocate(desc.stats_shape, "bhsd", qv, stream, desc.stats_element)
             if return_stats else None)
    plan.run(SdpaArgs(q, k, v, out, stats, bias, seq_len_q, seq_len_kv, dropout_seed,
                           dropout_offset), stream=stream)
    return (out, stats) if return_stats else out


def sdpa_backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, stats: Any, *,
                       causal: bool | str | None = None,
                       window: tuple[int | None, int | None] | None = None,
                       scale: float | None = None, bias: Any = None,
                       need_bias_grad: bool = False, alibi: bool = False,
                       dropout_p: float = 0.0, dropout_seed: Any = None,
                       dropout_offset: Any = None, seq_len_q: Any = None,
                       seq_len_kv: Any = None, deterministic: bool = False,
                       stream: Any = None) -> tuple:
    """Functional form of SdpaBackwardPlan: returns ``(grad_q, grad_k, grad_v)``, plus
    ``grad_bias`` when ``need_bias_grad``. ``deterministic`` selects cuDNN's deterministic
    algorithm (PlanPreference(deterministic=True)); the options must be the forward's."""
    fields, qv = _problem(q, k, v, causal=causal, window=window, scale=scale, bias=bias,
                          alibi=alibi, dropout_p=dropout_p, seq_len_q=seq_len_q)
    desc = SdpaBackwardDescriptor(**fields, need_bias_grad=need_bias_grad)
    plan = SdpaBackwardPlan.cached(desc, PlanPreference(deterministic=deterministic),
                                        device=_device_of(qv))
    grads = [_allocate(shape, desc.layout, qv, stream)
             for shape in (desc.q_shape, desc.k_shape, desc.v_shape)]
    grad_bias = _allocate(desc.bias_shape, "bhsd", qv, stream) if need_bias_grad else None
    plan.run(SdpaBackwardArgs(q, k, v, out, grad_out, stats, *grads, bias, grad_bias,
                                   seq_len_q, seq_len_kv, dropout_seed, dropout_offset),
             stream=stream)
    return (*grads, grad_bias) if need_bias_grad else tuple(grads)
