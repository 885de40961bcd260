"""What every torch op of opfacade shares: the device and grad checks that give typed errors
where torch would crash or silently fall back, and tensors allocated the way the real kernels
and torch.compile's fake kernels must agree on. (How the ops are registered: _define.py.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .._internal.tensors import plain_torch_types
from .._internal.view import ELEMENT_BY_NAME, TORCH_DTYPES
from ..contracts.sdpa_layouts import dense_strides
from ..errors import DeviceMismatch, DTypeMismatch, InvalidArgument, Unsupported
from ..types import ElementKind

__all__ = ["absent", "autocast_dtype", "autocast_inputs", "cuda_device", "deterministic_choice",
           "device_check", "element_of", "empty", "empty_in_layout", "no_grad_wanted",
           "on_one_gpu", "torch_dtype", "wants_grad"]


class _CudaDevices(dict):
    """torch.device("cuda:i") by ordinal, each made once."""

    def __missing__(self, index: int) -> torch.device:
        self[index] = device = torch.device("cuda", index)
        return device


_CUDA_DEVICES = _CudaDevices()


# The tensor arguments that may be None, by name, in every op of this package: a None passed
# for any other one is an InvalidArgument naming it, not an AttributeError further on.
OPTIONAL_TENSORS = frozenset({"bias", "attn_mask", "aux", "page_table"})


# torch.Tensor and nn.Parameter: the types whose device reads below are exact (subclasses take
# the slow way, which asks isinstance and compares torch.device objects).
_PLAIN_TYPES = plain_torch_types(torch)


def on_one_gpu(*tensors: torch.Tensor, optional: torch.Tensor | None = None) -> bool:
    """Whether every one of ``tensors``, and ``optional`` unless it is None, is a plain tensor
    on one CUDA device: the drop-ins' common case, asked positionally (cuda_device's keywords
    build a dict on every call). When it says False (a None among ``tensors`` too), cuda_device
    names what is off:

        on_one_gpu(x, weight, optional=bias) or cuda_device("linear", x=x, weight=weight, ...)
    """
    index = -1
    for tensor in tensors if optional is None else (*tensors, optional):
        if type(tensor) not in _PLAIN_TYPES or not tensor.is_cuda:
            return False
        found = tensor.get_device()
        if found != index:
            if index >= 0:
                return False
            index = found
    return True


_autocast_enabled = torch.is_autocast_enabled  # (device_type): 0.27 us a call, development CPU


def autocast_dtype() -> torch.dtype | None:
    """The dtype torch.autocast("cuda") casts its lower-precision ops' inputs to (F.linear's and
    F.scaled_dot_product_attention's among them) where it is on; None where it is off. The
    drop-ins of those ops cast as torch does (``autocast_inputs``), so a model that swaps them in
    keeps its mixed precision: float32 master weights with bfloat16 activations meet in the
    autocast dtype, instead of in a DTypeMismatch, and all-float32 inputs run in it too."""
    return torch.get_autocast_dtype("cuda") if _autocast_enabled("cuda") else None


def autocast_inputs(dtype: torch.dtype, *tensors: torch.Tensor | None) -> tuple:
    """``tensors`` as torch.autocast hands them to a lower-precision op: each floating CUDA
    tensor other than float64 in ``dtype`` (a differentiable cast, so gradients reach the
    float32 originals); float64, integer and bool tensors, host tensors, None and anything that
    is not a tensor as they are (the drop-ins' typed checks name what is wrong with those)."""
    return tuple(t if not isinstance(t, torch.Tensor) or not t.is_cuda
                 or not t.is_floating_point() or t.dtype in (dtype, torch.float64)
                 else t.to(dtype) for t in tensors)


def cuda_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """The one CUDA device every given tensor (None skipped where OPTIONAL_TENSORS allows it)
    lives on.

    Raises:
        DeviceMismatch: a tensor on the host or another device, naming it and the first one.
        InvalidArgument: an argument that is not a tensor, or None where one is required.
    """
    # The common case, read the cheap way: plain tensors (parameters among them) on one CUDA
    # device.
    index = -1
    for name, tensor in tensors.items():
        if tensor is None:
            if name in OPTIONAL_TENSORS:
                continue
            break
        if type(tensor) not in _PLAIN_TYPES or not tensor.is_cuda:
            break
        found = tensor.get_device()
        if index < 0:
            index = found
        elif found != index:
            break
    else:
        if index >= 0:
            return _CUDA_DEVICES[index]
    device = first = None  # something is off: find it and say what
    for name, tensor in tensors.items():
        if tensor is None:
            if name in OPTIONAL_TENSORS:
                continue
            raise InvalidArgument(f"{op}: {name} must be a torch.Tensor, got None", argument=name)
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgument(f"{op}: {name} must be a torch.Tensor, got "
                                  f"{type(tensor).__name__}", argument=name)
        if tensor.device.type != "cuda":
            raise DeviceMismatch(f"{op}: {name} must be a CUDA tensor, got one on "
                                 f"{tensor.device} (opfacade's torch ops run on the GPU only)",
                                 argument=name)
        if device is None:
            device, first = tensor.device, name
        elif tensor.device != device:
            raise DeviceMismatch(f"{op}: {name} is on {tensor.device} but {first} is on {device}",
                                 argument=name)
    if device is None:
        raise InvalidArgument(f"{op}: no tensor given", argument="inputs")
    return device


def device_check(op: str, *names: str) -> Callable[..., torch.device]:
    """cuda_device for tensors given positionally, named ``names``: what a guarded call runs when
    it misses (functional.torch_forward's ``refuse``), so its speed does not matter."""
    def check(*tensors: torch.Tensor | None) -> torch.device:
        return cuda_device(op, **dict(zip(names, tensors, strict=True)))
    return check


def element_of(tensor: torch.Tensor, name: str) -> ElementKind:
    """The ElementKind of a tensor's dtype, or DTypeMismatch naming it."""
    element = ELEMENT_BY_NAME.get(str(tensor.dtype).removeprefix("torch."))
    if element is None:
        raise DTypeMismatch(f"{name} has dtype {tensor.dtype}, which opfacade has no element for",
                            argument=name)
    return element


def torch_dtype(element: ElementKind) -> torch.dtype:
    return TORCH_DTYPES[element]


def empty(shape: Sequence[int], element: ElementKind, device: torch.device) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=torch_dtype(element), device=device)


def empty_in_layout(shape: Sequence[int], layout: str, element: ElementKind,
                    device: torch.device) -> torch.Tensor:
    """A tensor of logical [batch, heads, seq, dim] ``shape`` stored in the dense ``layout``
    order (the sdpa contract's ``dense_strides``), so real and fake outputs have the same
    strides. One allocation with strides, not a permuted one: a view costs a torch call."""
    return torch.empty_strided(tuple(shape), dense_strides(layout, *shape),
                               dtype=TORCH_DTYPES[element], device=device)


def absent(like: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What an op returns for an output it was not asked for: a custom op's schema has no
    optional outputs, so an empty tensor stands in, of the same dtype in the real and the fake
    kernel."""
    return like.new_empty(0, dtype=dtype)


def _any_requires_grad_in_python(*args) -> bool:
    for a in args:  # noqa: SIM110 - a loop, not any() over a generator: every eager call asks
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


# torch's C++ check where this torch has it (torch.library's autograd kernels use it); it skips
# what is not a tensor, None among them.
_any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_requires_grad_in_python)


def wants_grad(*args) -> bool:
    """Whether autograd will ask for a gradient of any tensor among ``args`` (anything else,
    None among it, is skipped): grad mode on and one of them requires grad."""
    if not torch.is_grad_enabled():
        return False
    # Dynamo cannot trace the C++ check, and the drop-ins ask before they know they are traced.
    # (torch.compiler.substitute_in_graph could register the loop as its stand-in, but calling
    # it imports torch._dynamo, a second of every import of opfacade.torch.)
    if torch.compiler.is_compiling():
        return _any_requires_grad_in_python(*args)
    return _any_requires_grad(*args)


def no_grad_wanted(op: str, **tensors: torch.Tensor | None) -> None:
    """Raises Unsupported when autograd would ask an op without a backward for a gradient."""
    if not torch.is_grad_enabled():
        return
    for name, tensor in tensors.items():
        if tensor is not None and tensor.requires_grad:
            raise Unsupported(f"{op} has no backward, but {name} requires grad; call it under "
                              f"torch.no_grad() or pass {name}.detach()", argument=name)


def deterministic_choice(deterministic: bool | None) -> bool:
    """Whether a torch op selects deterministic SKUs: as asked, else as torch's own
    torch.use_deterministic_algorithms(True) says. A plain bool, so that torch.compile traces
    the call (a PlanPreference, a pydantic model, would break its graph)."""
    if deterministic is None:
        return torch.are_deterministic_algorithms_enabled()
    return bool(deterministic)
