"""SDPA plans and functional forms, over the sdpa contract (``opfacade/contracts/sdpa.py``).

    desc = SdpaDescriptor(batch=2, heads_q=32, heads_kv=8, seq_q=4096, seq_kv=4096,
                          head_dim=128, element="bf16", causal="top_left", save_stats=True)
    pair = SdpaForwardPlan.select_for_training(desc, PlanPreference(deterministic=True))
    pair.forward.run(SdpaArgs(q, k, v, out, stats), stream=s)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._internal import operands
from .._internal.guarded import Allocation, GuardedCalls, Selected, laid_out_as
from .._internal.memory import torch_empty
from .._internal.tensors import PLAIN_TORCH_TYPES, TensorView, wrap
from .._internal.view import TORCH_DTYPES
from ..contracts.sdpa import (
    SDPA_BACKWARD,
    SDPA_FORWARD,
    QkvStrides,
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    SlidingWindow,
    dense_in,
    dense_strides,
    output_layout,
)
from ..errors import InvalidArgument, LayoutMismatch, ShapeMismatch
from ..plan import plan_class
from ..types import ElementKind

__all__ = [
    "DropoutDraw",
    "DropoutState",
    "SlidingWindow",
    "SdpaDescriptor",
    "SdpaBackwardDescriptor",
    "SdpaArgs",
    "SdpaBackwardArgs",
    "SdpaForwardPlan",
    "SdpaBackwardPlan",
    "sdpa",
    "sdpa_backward",
    "torch_forward",
]

SdpaForwardPlan = plan_class(SDPA_FORWARD.name)
SdpaBackwardPlan = plan_class(SDPA_BACKWARD.name)


@dataclass(frozen=True)
class DropoutState:
    """A dropout generator on the device, as torch's CUDA generator is: a Philox ``seed`` and a
    running ``offset``, int64 [1] device tensors.

    Each forward given it (``sdpa(..., dropout=state)``) draws from the current offset and
    advances it by what the call consumes (the descriptor's ``dropout_offset_stride``), on the
    device, in stream order: no host synchronisation, and a captured CUDA graph draws a fresh
    mask on every replay. The forward returns the ``DropoutDraw`` it used, which its backward
    must be given: the state itself has moved on by then.

        state = DropoutState.create(seed=1234, like=q)
        out, stats, draw = sdpa(q, k, v, dropout_p=0.1, dropout=state, return_stats=True)
        dq, dk, dv = sdpa_backward(q, k, v, out, d_out, stats, dropout_p=0.1, dropout=draw)
    """

    seed: Any
    offset: Any

    @classmethod
    def create(cls, seed: int, like: Any, offset: int = 0) -> DropoutState:
        """A state on ``like``'s device, in its framework (torch, else CuPy; NumPy on the host).
        Copies the two values from the host once (synchronously)."""
        view = wrap(like, "like")
        values = (np.array([seed], np.int64), np.array([offset], np.int64))
        if view.device is None:
            return cls(*values)
        if view.package == "torch":
            import torch

            device = f"cuda:{view.device}"
            return cls(*(torch.tensor(v, dtype=torch.int64, device=device) for v in values))
        import cupy

        with cupy.cuda.Device(view.device):
            return cls(*(cupy.asarray(v) for v in values))


@dataclass(frozen=True)
class DropoutDraw:
    """The seed and offset one forward used (int64 [1] device tensors): its backward's."""

    seed: Any
    offset: Any


def _layouts(qv: TensorView, kv: TensorView, vv: TensorView) -> tuple[str, QkvStrides | None]:
    """The descriptor's layout and qkv_strides for these inputs: their common dense layout
    (qkv_strides None), else the layout q's strides follow (out is allocated in it) with the
    three views' own strides: q, k, v sliced from one packed QKV projection are read in
    place, never copied."""
    views = {"q": qv, "k": kv, "v": vv}
    for name, view in views.items():
        if view.ndim != 4:
            raise ShapeMismatch(f"{name} must be 4-D [batch, heads, seq, dim], got shape "
                                f"{view.shape}", argument=name)
    layout = output_layout(qv.shape, qv.strides)
    if all(dense_in(layout, view.shape, view.strides) for view in views.values()):
        return layout, None
    if qv.device is None:
        return layout, None  # the host reference reads any strides
    for name, view in views.items():
        if view.shape[3] > 1 and view.strides[3] != 1 or min(view.strides) < 0:
            raise LayoutMismatch(f"{name} must have non-negative strides and a unit dim stride "
                                 f"to be read in place, got strides {view.strides}",
                                 argument=name)
    strides = QkvStrides(**{name: (*view.strides[:3], 1) for name, view in views.items()})
    return layout, strides


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


def _problem(qv: TensorView, kv: TensorView, vv: TensorView, bias: Any, options: tuple) -> dict:
    """The descriptor fields of a call (its arrays wrapped; ``options`` as ``_facts`` takes
    them)."""
    causal, window, scale, alibi, dropout_p, padding = options
    layout, qkv_strides = _layouts(qv, kv, vv)
    batch, heads_q, seq_q, head_dim = qv.shape
    return dict(batch=batch, heads_q=heads_q, heads_kv=kv.shape[1], seq_q=seq_q,
                seq_kv=kv.shape[2], head_dim=head_dim, head_dim_v=vv.shape[3],
                element=qv.element, layout=layout, qkv_strides=qkv_strides, scale=scale,
                causal=causal, window=window, bias=_bias_spec(bias, qv, kv), alibi=alibi,
                dropout_p=dropout_p, padding=padding)


def _facts(q: Any, k: Any, v: Any, bias: Any, options: tuple) -> tuple:
    """Everything ``_problem`` builds a descriptor from, for Plan.cached_for: the arrays' facts
    (operands.facts: read without wrapping a plain torch tensor), the bias's shape, and
    ``options`` = (causal, window, scale, alibi, dropout_p, padding) as given. (One tuple, not
    keywords: every functional call makes it, and keywords cost more to pass on.)"""
    bias_shape = None if bias is None else operands.facts(bias, "bias")[0]
    return (operands.facts(q, "q"), operands.facts(k, "k"), operands.facts(v, "v"), bias_shape,
            options)


def _wrapped(q: Any, k: Any, v: Any) -> tuple[TensorView, TensorView, TensorView]:
    """q, k, v wrapped: only on a plan-cache miss, to build the descriptor."""
    return wrap(q, "q"), wrap(k, "k"), wrap(v, "v")


def _allocate(like: Any, like_facts: tuple, shape: tuple[int, ...], layout: str, stream: Any,
              element: ElementKind) -> Any:
    """A new array of logical ``shape`` stored dense in ``layout`` order, beside ``like``."""
    return operands.allocate(like, like_facts, shape, element, stream,
                             dense_strides(layout, *shape))


def _dropout_tensors(dropout: Any, dropout_p: float, dropout_seed: Any, dropout_offset: Any,
                     forward: bool) -> tuple[Any, Any]:
    """(seed, offset) from a DropoutState/DropoutDraw, refusing a mix with the raw tensors."""
    if dropout_seed is not None or dropout_offset is not None:
        raise InvalidArgument("dropout must be None when dropout_seed or dropout_offset is given "
                              "(pass one or the other)", argument="dropout")
    if dropout_p == 0.0:
        raise InvalidArgument("dropout must be None unless dropout_p > 0", argument="dropout")
    wanted = DropoutState if forward else DropoutDraw
    if not isinstance(dropout, wanted):
        why = ("" if forward or not isinstance(dropout, DropoutState) else
               ": the state has moved past the forward's offset; pass the DropoutDraw the "
               "forward returned")
        raise InvalidArgument(f"dropout must be a {wanted.__name__}, got "
                              f"{type(dropout).__name__}{why}", argument="dropout")
    return dropout.seed, dropout.offset


def _forward_plan(q: Any, k: Any, v: Any, bias: Any, options: tuple, return_stats: bool
                  ) -> tuple[SdpaForwardPlan, tuple]:
    """The cached forward plan of a call (``options`` as ``_facts`` takes them), and q's facts."""
    facts = _facts(q, k, v, bias, options)
    q_facts = facts[0]
    plan = SdpaForwardPlan.cached_for(
        (facts, return_stats),
        lambda: SdpaDescriptor(**_problem(*_wrapped(q, k, v), bias, options),
                               save_stats=return_stats),
        device=operands.device_of(q_facts))
    return plan, q_facts


def _backward_plan(q: Any, k: Any, v: Any, bias: Any, options: tuple, need_bias_grad: bool,
                   deterministic: bool) -> tuple[SdpaBackwardPlan, tuple]:
    """The cached backward plan of a call (``options`` as ``_facts`` takes them), and q's
    facts."""
    facts = _facts(q, k, v, bias, options)
    q_facts = facts[0]
    plan = SdpaBackwardPlan.cached_for(
        (facts, need_bias_grad, deterministic),
        lambda: SdpaBackwardDescriptor(**_problem(*_wrapped(q, k, v), bias, options),
                                       need_bias_grad=need_bias_grad),
        {"deterministic": deterministic}, device=operands.device_of(q_facts))
    return plan, q_facts


# sdpa's common calls of plain torch tensors (no bias, window, ALiBi, dropout or padding; out
# and the stream left to the call), by tensor guard: _internal/guarded.py. The backward's
# likewise, the gradients left to the call.
_TORCH_CALLS = GuardedCalls()
_TORCH_BACKWARDS = GuardedCalls()


def torch_forward(q: Any, k: Any, v: Any, causal: bool | str | None, scale: float | None,
                  return_stats: bool, refuse: Callable[[Any, Any, Any], Any] | None = None
                  ) -> tuple[Any, Any]:
    """``(out, stats or None)`` of ``sdpa(q, k, v, causal=..., scale=..., return_stats=...)``
    for plain torch tensors (``_internal/operands.PLAIN_TORCH_TYPES``), the plan of a repeat call
    found by a guard check of q, k, v. ``refuse(q, k, v)``, when given, runs before a call that
    misses selects (opfacade.torch's ops: their device check)."""
    # refuse among the options: a functional call's entry (none) never serves an op's call,
    # which must refuse what the functional form takes (host tensors: the reference).
    options = (causal, scale, return_stats, refuse)
    selected = _TORCH_CALLS.find((q, k, v), options)
    if selected is None:
        if refuse is not None:
            refuse(q, k, v)
        plan = _forward_plan(q, k, v, None, (causal, None, scale, False, 0.0, False),
                             return_stats)[0]
        desc = plan.descriptor
        stats = ((desc.stats_shape, TORCH_DTYPES[desc.stats_element]) if return_stats
                 else None)
        # out allocated like q where it has q's shape and strides: q is then dense too.
        like_q = laid_out_as(q, desc.o_shape, desc.o_strides)
        selected = Selected(plan, desc.o_shape, desc.o_strides, q.dtype, q.device, stats, like_q)
        _TORCH_CALLS.remember((q, k, v), options, selected)
    out = selected.empty(q)
    if selected.extra is None:
        selected.plan.run(SdpaArgs(q, k, v, out))
        return out, None
    stats = torch_empty(sys.modules["torch"], *selected.extra, selected.device)
    selected.plan.run(SdpaArgs(q, k, v, out, stats))
    return out, stats


def torch_backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, stats: Any,
                   causal: bool | str | None, scale: float | None, deterministic: bool,
                   refuse: Callable[..., Any] | None = None) -> tuple[Any, Any, Any]:
    """``(grad_q, grad_k, grad_v)`` of ``sdpa_backward(q, k, v, out, grad_out, stats,
    causal=..., scale=..., deterministic=...)`` for plain torch tensors, the plan of a repeat call
    found by a guard check of the six tensors, and each gradient allocated like its input where
    the two are laid out alike (torch.empty_like parses no arguments). The full path read the
    three tensors' facts, looked the plan up by them and allocated through operands.allocate:
    19 us a call on a development host with a plan whose run() does nothing, 14 of them the
    three allocations. ``refuse(q, k, v, out, grad_out)``, when given, runs before a call that
    misses selects (opfacade.torch's ops: their device check)."""
    tensors = (q, k, v, out, grad_out, stats)
    options = (causal, scale, deterministic, refuse)  # refuse: as torch_forward's
    selected = _TORCH_BACKWARDS.find(tensors, options)
    if selected is None:
        if refuse is not None:
            refuse(q, k, v, out, grad_out)
        plan = _backward_plan(q, k, v, None, (causal, None, scale, False, 0.0, False), False,
                              deterministic)[0]
        desc = plan.descriptor
        grads = tuple(Allocation.of(shape, dense_strides(desc.layout, *shape), like)
                      for shape, like in ((desc.q_shape, q), (desc.k_shape, k), (desc.v_shape, v)))
        selected = Selected(plan, desc.q_shape, grads[0].strides, q.dtype, q.device, grads)
        _TORCH_BACKWARDS.remember(tensors, options, selected)
    dtype, device = selected.dtype, selected.device
    grads = tuple(grad.empty(like, dtype, device)
                  for grad, like in zip(selected.extra, (q, k, v), strict=True))
    selected.plan.run(SdpaBackwardArgs(q, k, v, out, grad_out, stats, *grads))
    return grads


def sdpa(q: Any, k: Any, v: Any, *, causal: bool | str | None = None,
              window: tuple[int | None, int | None] | None = None, scale: float | None = None,
              bias: Any = None, alibi: bool = False, dropout_p: float = 0.0,
              dropout_seed: Any = None, dropout_offset: Any = None, seq_len_q: Any = None,
              seq_len_kv: Any = None, return_stats: bool = False, out: Any = None,
              stream: Any = None, dropout: DropoutState | None = None) -> Any:
    """Functional form of SdpaForwardPlan: returns ``out`` (allocated when None), or
    ``(out, stats)`` when ``return_stats``; with ``dropout``, the call's ``DropoutDraw`` last.

    The descriptor comes from the tensors (layout from q's strides, bias shape from bias);
    ``causal`` is True/"top_left" or "bottom_right"; the other arguments are those of
    SdpaDescriptor and SdpaArgs. ``dropout``: a DropoutState to draw from and advance (instead
    of ``dropout_seed``/``dropout_offset``, which are only read). Uses the process-wide plan
    cache.
    """
    if (type(q) in PLAIN_TORCH_TYPES and type(k) in PLAIN_TORCH_TYPES
            and type(v) in PLAIN_TORCH_TYPES and bias is None and window is None and not alibi
            and dropout_p == 0.0 and dropout is None and dropout_seed is None
            and dropout_offset is None and seq_len_q is None and seq_len_kv is None
            and out is None and stream is None):
        out, stats = torch_forward(q, k, v, causal, scale, return_stats)
        return (out, stats) if return_stats else out
    counter = draw = None
    if dropout is not None:
        dropout_seed, counter = _dropout_tensors(dropout, dropout_p, dropout_seed,
                                                 dropout_offset, forward=True)
    options = (causal, window, scale, alibi, dropout_p, seq_len_q is not None)
    plan, q_facts = _forward_plan(q, k, v, bias, options, return_stats)
    desc = plan.descriptor
    if out is None:
        out = operands.allocate(q, q_facts, desc.o_shape, desc.element, stream, desc.o_strides)
    stats = (operands.allocate(q, q_facts, desc.stats_shape, desc.stats_element, stream)
             if return_stats else None)
    if counter is not None:
        dropout_offset = operands.allocate(q, q_facts, (1,), ElementKind.i64, stream)
        draw = DropoutDraw(dropout_seed, dropout_offset)
    plan.run(SdpaArgs(q, k, v, out, stats, bias, seq_len_q, seq_len_kv, dropout_seed,
                           dropout_offset, counter), stream=stream)
    results = (out, stats) if return_stats else (out,)
    if draw is not None:
        results = (*results, draw)
    return results if len(results) > 1 else out


def sdpa_backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, stats: Any, *,
                       causal: bool | str | None = None,
                       window: tuple[int | None, int | None] | None = None,
                       scale: float | None = None, bias: Any = None,
                       need_bias_grad: bool = False, alibi: bool = False,
                       dropout_p: float = 0.0, dropout_seed: Any = None,
                       dropout_offset: Any = None, seq_len_q: Any = None,
                       seq_len_kv: Any = None, deterministic: bool = False,
                       stream: Any = None, dropout: DropoutDraw | None = None) -> tuple:
    """Functional form of SdpaBackwardPlan: returns ``(grad_q, grad_k, grad_v)``, plus
    ``grad_bias`` when ``need_bias_grad``. ``deterministic`` selects cuDNN's deterministic
    algorithm (PlanPreference(deterministic=True)); the options must be the forward's, and
    ``dropout`` the DropoutDraw its forward returned (read, never advanced)."""
    if dropout is not None:
        dropout_seed, dropout_offset = _dropout_tensors(dropout, dropout_p, dropout_seed,
                                                        dropout_offset, forward=False)
    options = (causal, window, scale, alibi, dropout_p, seq_len_q is not None)
    plan, q_facts = _backward_plan(q, k, v, bias, options, need_bias_grad, deterministic)
    desc = plan.descriptor
    grads = [_allocate(q, q_facts, shape, desc.layout, stream, desc.element)
             for shape in (desc.q_shape, desc.k_shape, desc.v_shape)]
    grad_bias = (_allocate(q, q_facts, desc.bias_shape, "bhsd", stream, desc.element)
                 if need_bias_grad else None)
    plan.run(SdpaBackwardArgs(q, k, v, out, grad_out, stats, *grads, bias, grad_bias,
                                   seq_len_q, seq_len_kv, dropout_seed, dropout_offset),
             stream=stream)
    return (*grads, grad_bias) if need_bias_grad else tuple(grads)
