"""What the functional forms read from their array arguments on every call, the cheap way.

A functional form finds its plan by the facts of its arrays (``Plan.cached_for``) and allocates
its outputs beside them. For a plain torch tensor those facts are four attribute reads; wrapping
it (``wrap``: a validated TensorView) costs several times more, and the plan's run() validates
the tensors anyway (its memo's guard, or the full checks). So the functional forms read
``facts`` here and wrap only on a plan-cache miss, when they build the descriptor.

The facts of a plain torch tensor are (shape, strides, dtype, device index, -1 on the host); of
anything else, wrapped, (shape, strides, element, device, package): the two never compare
equal, so a torch call and a CuPy call never share a cache entry. Only torch.Tensor and
nn.Parameter take the cheap way (``wrap`` enrols them when it first meets them): subclasses (fake,
functional, distributed tensors) answer attribute reads differently, and are wrapped every time.
"""

from __future__ import annotations

import sys
from typing import Any

from ..types import ElementKind
from .memory import OutputAllocator, torch_empty
from .tensors import PLAIN_TORCH_TYPES, c_strides, wrap
from .view import TORCH_DTYPES

__all__ = ["allocate", "device_of", "facts", "is_plain_torch"]


def facts(obj: Any, name: str) -> tuple:
    """The array's shape, strides, element type and device, hashable (see the module doc).

    Raises:
        What ``wrap`` raises, for an argument that is not a plain torch tensor.
    """
    if type(obj) in PLAIN_TORCH_TYPES:
        return (obj.shape, obj.stride(), obj.dtype, obj.get_device())
    view = wrap(obj, name)
    return (view.shape, view.strides, view.element, view.device, view.package)


def is_plain_torch(array_facts: tuple) -> bool:
    return len(array_facts) == 4


def device_of(array_facts: tuple) -> int | str:
    """The plan-cache device of an array with these facts: its CUDA ordinal, or "cpu"."""
    device = array_facts[3]
    return "cpu" if device is None or device < 0 else device


def allocate(like: Any, like_facts: tuple, shape: tuple[int, ...], element: ElementKind,
             stream: Any, strides: tuple[int, ...] | None = None, zeroed: bool = False) -> Any:
    """An uninitialised output of ``shape`` (element ``strides``, C order by default) beside
    ``like``: from torch's caching allocator on the current stream when ``like`` is a plain
    torch tensor and no stream is named (nothing to resolve or switch), else through
    OutputAllocator (the stream's pool of like's framework). ``zeroed``: filled with zeros in
    that stream's order instead."""
    if stream is None and is_plain_torch(like_facts):
        torch = sys.modules["torch"]  # like is a torch tensor: torch is imported
        # C order (strides None): no strides to compute on this per-call path.
        return torch_empty(torch, shape, TORCH_DTYPES[element], like.device, strides,
                           zeroed=zeroed)

    view = wrap(like, "like")
    output = OutputAllocator(view, stream)
    if strides is None or tuple(strides) == c_strides(shape):
        return output(shape, element, zeroed)
    # Another dense order: allocate in memory order, then index it as asked.
    order = sorted(range(len(shape)), key=lambda axis: -strides[axis])
    memory = output(tuple(shape[axis] for axis in order), element, zeroed)
    inverse = tuple(order.index(axis) for axis in range(len(shape)))
    return memory.permute(*inverse) if output.owner == "torch" else memory.transpose(inverse)
