"""Linear plans and functional forms, over the linear contract (``opfacade/contracts/linear.py``).

    desc = LinearDescriptor(m=4096, n=4096, k=1024, element="bf16", activation="gelu_tanh")
    plan = LinearForwardPlan.select(desc)
    plan.algorithm                     # the cuBLASLt algorithm the heuristic chose
    plan.run(LinearArgs(x, w, bias, out=y), stream=s)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from .._internal import operands
from .._internal.guarded import Allocation, GuardedCalls, Selected
from .._internal.memory import torch_empty
from .._internal.tensors import PLAIN_TORCH_TYPES, TensorView, c_strides, wrap
from .._internal.view import TORCH_DTYPES
from ..contracts.linear import (
    LINEAR_BACKWARD,
    LINEAR_FORWARD,
    LinearArgs,
    LinearBackwardArgs,
    LinearBackwardDescriptor,
    LinearDescriptor,
)
from ..contracts.linear_activations import ACTIVATIONS, AuxLayout
from ..errors import InvalidArgument, ShapeMismatch
from ..plan import Plan, plan_class
from ..types import ElementKind

__all__ = [
    "LinearDescriptor",
    "LinearBackwardDescriptor",
    "LinearArgs",
    "LinearBackwardArgs",
    "LinearForwardPlan",
    "LinearBackwardPlan",
    "linear",
    "linear_backward",
    "torch_forward",
]

LinearForwardPlan = plan_class(LINEAR_FORWARD.name)
LinearBackwardPlan = plan_class(LINEAR_BACKWARD.name)


def _algorithm(plan: Plan):
    """The cuBLASLt algorithm this plan runs with contiguous tensors on its device (the current
    GPU for a plan selected by arch): an AlgoInfo for the forward, {step: AlgoInfo} for the
    backward; None for the host reference or without a GPU. Selecting by arch, it is chosen on
    first use."""
    impl = plan._live_impl()
    if not hasattr(impl, "algorithm") or plan.target.is_host:
        return None
    return impl.algorithm(plan.descriptor, plan.target.device)


LinearForwardPlan.algorithm = property(_algorithm)
LinearBackwardPlan.algorithm = property(_algorithm)


# -- functional forms ---------------------------------------------------------------------------

def _problem(x: TensorView, w: TensorView, weight_layout: str) -> dict:
    if x.ndim not in (2, 3):
        raise InvalidArgument(f"x must be [M, K] or [batch, M, K], got shape {x.shape}",
                              argument="x")
    if w.ndim not in (2, 3) or (w.ndim == 3 and x.ndim != 3):
        raise InvalidArgument(f"weight must be 2-D, or 3-D for a batched x, got shape {w.shape}",
                              argument="weight")
    if weight_layout not in ("kn", "nk"):
        raise InvalidArgument(f"weight_layout must be 'kn' or 'nk', got {weight_layout!r}",
                              argument="weight_layout")
    k_w, n = w.shape[-2:] if weight_layout == "kn" else w.shape[-1:-3:-1]
    if k_w != x.shape[-1]:
        raise ShapeMismatch(f"weight {w.shape} in the '{weight_layout}' layout has K={k_w}; x "
                            f"{x.shape} has K={x.shape[-1]}", argument="weight")
    if w.ndim == 3 and w.shape[0] != x.shape[0]:
        raise ShapeMismatch(f"weight has batch {w.shape[0]}; x has batch {x.shape[0]}",
                            argument="weight")
    return dict(m=x.shape[-2], n=n, k=x.shape[-1], batch=x.shape[0] if x.ndim == 3 else None,
                weight_layout=weight_layout, weight_batched=w.ndim == 3,
                element=x.element)


def _aux_allocation(layout: AuxLayout, lead: tuple, m: int, n: int
                    ) -> tuple[tuple, int | None]:
    """What an aux whose rows cuBLASLt accepts is allocated as: the shape with its rows padded
    to cuBLASLt's stride, and the view's last extent where they are padded (else None)."""
    columns, stride = layout.columns(n), layout.row_stride(n)
    return (*lead, m, stride), None if stride == columns else columns


def aux_buffer(layout: AuxLayout, element: ElementKind, lead: tuple, m: int, n: int,
               allocate: Callable[[tuple, ElementKind, bool], Any]) -> Any:
    """An aux whose rows cuBLASLt accepts: allocated with padded rows, returned as a view. Takes
    extents rather than a descriptor so that torch's fake kernels (symbolic sizes) share it.
    ``allocate(shape, element, zeroed)``: a ReLU bit-mask is asked for zeroed (see _TorchAux)."""
    shape, columns = _aux_allocation(layout, lead, m, n)
    buffer = allocate(shape, layout.element(element), layout.mask)
    return buffer if columns is None else buffer[..., :columns]


def _forward_plan(x: Any, weight: Any, x_facts: tuple, weight_layout: str, tf32: bool,
                  activation: str, has_bias: bool, has_residual: bool, save_aux: bool,
                  deterministic: bool) -> LinearForwardPlan:
    # The descriptor reads the shapes and the element (strides are run()'s to check).
    facts = (x_facts[0], x_facts[2], operands.facts(weight, "weight")[0], weight_layout, tf32,
             activation, not has_bias, not has_residual, save_aux, deterministic)
    return LinearForwardPlan.cached_for(
        facts, lambda: LinearDescriptor(**_problem(wrap(x, "x"), wrap(weight, "weight"),
                                                   weight_layout),
                                        tf32=tf32, activation=activation, bias=has_bias,
                                        residual=has_residual, save_aux=save_aux),
        {"deterministic": deterministic}, device=operands.device_of(x_facts))


def _backward_plan(x: Any, weight: Any, x_facts: tuple, weight_layout: str, tf32: bool,
                   activation: str, need_input_grad: bool, need_weight_grad: bool,
                   need_bias_grad: bool, deterministic: bool) -> LinearBackwardPlan:
    facts = (x_facts[0], x_facts[2], operands.facts(weight, "weight")[0], weight_layout, tf32,
             activation, need_input_grad, need_weight_grad, need_bias_grad, deterministic)
    return LinearBackwardPlan.cached_for(
        facts, lambda: LinearBackwardDescriptor(
            **_problem(wrap(x, "x"), wrap(weight, "weight"), weight_layout), tf32=tf32,
            activation=activation, need_input_grad=need_input_grad,
            need_weight_grad=need_weight_grad, need_bias_grad=need_bias_grad),
        {"deterministic": deterministic}, device=operands.device_of(x_facts))


# linear's calls of plain torch tensors (the "nk" weight, no residual or TF32; out, aux and the
# stream left to the call), by tensor guard: _internal/guarded.py. The backward's likewise, the
# gradients left to the call.
_TORCH_CALLS = GuardedCalls()
_TORCH_BACKWARDS = GuardedCalls()


class _TorchAux(NamedTuple):
    """How a guarded call allocates the aux it saves into (aux_buffer's allocation, read once):
    the allocation's shape and torch dtype, the view's last extent where the rows are padded
    (else None), and whether it is zeroed. A ReLU bit-mask's last byte holds bits past N that
    cuBLASLt leaves as it found them, so a mask starts zeroed: the aux is then the same bits on
    every run."""

    shape: tuple[int, ...]
    dtype: Any
    columns: int | None
    zeros: bool

    @classmethod
    def of(cls, desc: LinearDescriptor) -> _TorchAux:
        layout = desc.aux_layout
        shape, columns = _aux_allocation(layout, desc.lead, desc.m, desc.n)
        return cls(shape, TORCH_DTYPES[layout.element(desc.element)], columns, layout.mask)

    def new(self, device: Any) -> Any:
        buffer = torch_empty(sys.modules["torch"], self.shape, self.dtype, device,
                             zeroed=self.zeros)
        return buffer if self.columns is None else buffer[..., :self.columns]


def _has_aux(activation: str) -> bool:
    """Whether the activation saves an aux for its backward (an unknown one does not: the
    descriptor refuses it)."""
    return activation in ACTIVATIONS and ACTIVATIONS[activation].aux is not None


def torch_forward(x: Any, weight: Any, bias: Any, activation: str, deterministic: bool,
                  save_aux: bool = False, refuse: Callable[[Any, Any, Any], Any] | None = None
                  ) -> tuple[Any, Any]:
    """``(out, aux)`` of ``linear(x, weight, bias, activation=..., deterministic=...)`` for plain
    torch tensors (``_internal/operands.PLAIN_TORCH_TYPES``), the plan of a repeat call found by
    a guard check of x, weight (and bias). ``save_aux``: the activation's aux is allocated and
    saved into (aux None without it, or where the activation saves none). ``refuse(x, weight,
    bias)``, when given, runs before a call that misses selects (opfacade.torch's ops: their
    device check)."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    # refuse among the options: a functional call's entry (none) never serves an op's call,
    # which must refuse what the functional form takes (host tensors: the reference). Whether
    # there is a bias is the tensors' count, which the memo compares itself.
    options = (activation, deterministic, save_aux, refuse)
    selected = _TORCH_CALLS.find(tensors, options)
    if selected is None:
        if refuse is not None:
            refuse(x, weight, bias)
        saves = save_aux and _has_aux(activation)
        plan = _forward_plan(x, weight, operands.facts(x, "x"), "nk", False, activation,
                             bias is not None, False, saves, deterministic)
        desc = plan.descriptor
        selected = Selected(plan, desc.out_shape, c_strides(desc.out_shape), x.dtype, x.device,
                            _TorchAux.of(desc) if saves else None)
        _TORCH_CALLS.remember(tensors, options, selected)
    out = selected.empty()
    aux = None if selected.extra is None else selected.extra.new(selected.device)
    selected.plan.run(LinearArgs(x, weight, bias, None, out, aux))
    return out, aux


def torch_backward(grad_out: Any, x: Any, weight: Any, aux: Any, activation: str,
                   need_input_grad: bool, need_weight_grad: bool, need_bias_grad: bool,
                   deterministic: bool, refuse: Callable[..., Any] | None = None
                   ) -> tuple[Any, Any, Any]:
    """``linear_backward(grad_out, x, weight, aux, activation=..., need_*=...,
    deterministic=...)`` for plain torch tensors, the plan of a repeat call found by a guard
    check of its tensors, and grad_x and grad_weight allocated like x and weight where those are
    dense (torch.empty_like parses no arguments; the full path's operands.allocate took 5.7 us a
    gradient on a development host, torch.empty 2.2). ``refuse(grad_out, x, weight, aux)``,
    when given, runs before a call that misses selects (opfacade.torch's ops: their device
    check)."""
    tensors = (grad_out, x, weight) if aux is None else (grad_out, x, weight, aux)
    options = (activation, need_input_grad, need_weight_grad, need_bias_grad, deterministic,
               refuse)  # refuse: as torch_forward's
    selected = _TORCH_BACKWARDS.find(tensors, options)
    if selected is None:
        if refuse is not None:
            refuse(grad_out, x, weight, aux)
        plan = _backward_plan(x, weight, operands.facts(x, "x"), "nk", False, activation,
                              need_input_grad, need_weight_grad, need_bias_grad, deterministic)
        desc = plan.descriptor
        grads = tuple(Allocation.of(shape, c_strides(shape), like) if wanted else None
                      for wanted, shape, like in ((need_input_grad, desc.x_shape, x),
                                                  (need_weight_grad, desc.weight_shape, weight),
                                                  (need_bias_grad, (desc.n,), None)))
        selected = Selected(plan, desc.x_shape, c_strides(desc.x_shape), x.dtype, x.device,
                            grads)
        _TORCH_BACKWARDS.remember(tensors, options, selected)
    dtype, device = selected.dtype, selected.device
    grads = tuple(None if grad is None else grad.empty(like, dtype, device)
                  for grad, like in zip(selected.extra, (x, weight, None), strict=True))
    selected.plan.run(LinearBackwardArgs(grad_out, x, weight, aux, *grads))
    return grads


def linear(x: Any, weight: Any, bias: Any = None, *, activation: str = "none",
           residual: Any = None, weight_layout: str = "nk", tf32: bool = False,
           save_aux: bool = False, out: Any = None, aux: Any = None, stream: Any = None,
           deterministic: bool = False) -> Any:
    """Functional LinearForwardPlan: ``out``, or ``(out, aux)`` when ``save_aux``.

    Same semantics as torch's ``F.linear`` with the default "nk" weight; uses the process-wide
    plan cache and allocates what is not given (``out``, and with ``save_aux`` the ``aux`` to save
    into). Arguments are LinearDescriptor's and LinearArgs';
    ``deterministic`` selects under PlanPreference(deterministic=True).
    """
    if (type(x) in PLAIN_TORCH_TYPES and type(weight) in PLAIN_TORCH_TYPES
            and (bias is None or type(bias) in PLAIN_TORCH_TYPES) and residual is None
            and weight_layout == "nk" and not tf32 and (not save_aux or _has_aux(activation))
            and out is None and aux is None and stream is None):
        # The aux too, where asked: a ReLU mask zeroed there (_TorchAux), so its bits repeat,
        # as aux_buffer's are below.
        result = torch_forward(x, weight, bias, activation, deterministic, save_aux)
        return result if save_aux else result[0]
    x_facts = operands.facts(x, "x")
    plan = _forward_plan(x, weight, x_facts, weight_layout, tf32, activation, bias is not None,
                         residual is not None, save_aux, deterministic)
    desc = plan.descriptor

    def allocate(shape: tuple[int, ...], element: ElementKind, zeroed: bool = False) -> Any:
        return operands.allocate(x, x_facts, shape, element, stream, zeroed=zeroed)

    out = allocate(desc.out_shape, desc.element) if out is None else out
    if save_aux and aux is None:
        aux = aux_buffer(desc.aux_layout, desc.element, desc.lead, desc.m, desc.n, allocate)
    plan.run(LinearArgs(x, weight, bias, residual, out, aux), stream=stream)
    return (out, aux) if save_aux else out


def linear_backward(grad_out: Any, x: Any, weight: Any, aux: Any = None, *,
                    activation: str = "none", weight_layout: str = "nk", tf32: bool = False,
                    need_input_grad: bool = True, need_weight_grad: bool = True,
                    need_bias_grad: bool = True, stream: Any = None,
                    deterministic: bool = False) -> tuple[Any, Any, Any]:
    """Functional LinearBackwardPlan: ``(grad_x, grad_weight, grad_bias)``, None where not asked.

    ``aux`` is what ``linear(..., save_aux=True)`` returned; needed unless activation is "none".
    ``deterministic`` selects under PlanPreference(deterministic=True).
    """
    x_facts = operands.facts(x, "x")
    plan = _backward_plan(x, weight, x_facts, weight_layout, tf32, activation, need_input_grad,
                          need_weight_grad, need_bias_grad, deterministic)
    desc = plan.descriptor

    def allocate(shape: tuple[int, ...], wanted: bool) -> Any:
        return operands.allocate(x, x_facts, shape, desc.element, stream) if wanted else None

    grads = (allocate(desc.x_shape, need_input_grad),
             allocate(desc.weight_shape, need_weight_grad),
             allocate((desc.n,), need_bias_grad))
    plan.run(LinearBackwardArgs(grad_out, x, weight, aux, *grads), stream=stream)
    return grads
