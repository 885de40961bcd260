"""ALiBi plans and functional forms, over the alibi contract (``opfacade/contracts/alibi.py``).

    desc = AlibiBackwardDescriptor(batch=2, heads=4, query_len=16, key_len=16, element="bf16")
    plan = AlibiBackwardPlan.select(desc)
    plan.run(AlibiBackwardArgs(grad_output=dy, grad_input=da, grad_slopes=ds), stream=s)
"""

from __future__ import annotations

from typing import Any

from .._internal.memory import OutputAllocator
from .._internal.tensors import TensorView, wrap
from ..contracts.alibi import (
    ALIBI_BACKWARD,
    ALIBI_FORWARD,
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
)
from ..errors import InvalidArgument
from ..plan import plan_class

__all__ = [
    "AlibiForwardDescriptor",
    "AlibiBackwardDescriptor",
    "AlibiForwardArgs",
    "AlibiBackwardArgs",
    "AlibiForwardPlan",
    "AlibiBackwardPlan",
    "alibi_forward",
    "alibi_backward",
]

AlibiForwardPlan = plan_class(ALIBI_FORWARD.name)
AlibiBackwardPlan = plan_class(ALIBI_BACKWARD.name)


def _descriptor_shape(view: TensorView, name: str) -> dict:
    if view.ndim != 4:
        raise InvalidArgument(f"{name} must be 4-D [batch, heads, query_len, key_len], got "
                              f"shape {view.shape}", argument=name)
    batch, heads, query_len, key_len = view.shape
    return dict(batch=batch, heads=heads, query_len=query_len, key_len=key_len,
                element=view.element)


def alibi_forward(input: Any, slopes: Any, *, out: Any = None, in_place: bool = False,
                  stream: Any = None) -> Any:
    """Functional form of AlibiForwardPlan: returns ``out`` (allocated when None) or ``input``.

    Uses the process-wide plan cache; arguments are those of AlibiForwardArgs and Plan.run.
    """
    view = wrap(input, "input")
    desc = AlibiForwardDescriptor(**_descriptor_shape(view, "input"), in_place=in_place)
    plan = AlibiForwardPlan.cached(desc, device="cpu" if view.device is None else view.device)
    if not in_place and out is None:
        out = OutputAllocator(view, stream)(view.shape, view.element)
    plan.run(AlibiForwardArgs(input, slopes, None if in_place else out), stream=stream)
    return input if in_place else out


def alibi_backward(grad_output: Any, *, need_input_grad: bool = True,
                   need_slope_grad: bool = True, stream: Any = None) -> tuple[Any, Any]:
    """Functional form of AlibiBackwardPlan: returns (grad_input, grad_slopes), None if skipped."""
    view = wrap(grad_output, "grad_output")
    desc = AlibiBackwardDescriptor(**_descriptor_shape(view, "grad_output"),
                                   need_input_grad=need_input_grad,
                                   need_slope_grad=need_slope_grad)
    plan = AlibiBackwardPlan.cached(desc, device="cpu" if view.device is None else view.device)
    allocate = OutputAllocator(view, stream)
    d_in = allocate(view.shape, view.element) if need_input_grad else None
    d_slopes = allocate((desc.heads,), desc.slope_element) if need_slope_grad else None
    plan.run(AlibiBackwardArgs(grad_output, d_in, d_slopes), stream=stream)
    return d_in, d_slopes
