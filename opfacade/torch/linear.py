"""The linear family as torch ops: ``opfacade::linear`` and ``opfacade::linear_backward``, the
autograd between them, the ``linear`` function and the ``Linear`` module (nn.Linear's state_dict
with a fused activation).

    layer = Linear(1024, 4096, activation="gelu_tanh", device="cuda", dtype=torch.bfloat16)
    layer.load_state_dict(torch_linear.state_dict())
    y = layer(x)                      # x [..., 1024]; autograd through cuBLASLt's epilogues
"""

from __future__ import annotations

import math

import torch

from ..contracts.linear_activations import ACTIVATIONS
from ..errors import InvalidProblem
from ..ops import linear as functional
from ._common import (
    absent,
    autocast_dtype,
    autocast_inputs,
    cuda_device,
    deterministic_choice,
    device_check,
    element_of,
    empty,
    on_one_gpu,
    torch_dtype,
    wants_grad,
)
from ._define import define_inference_op, define_op

__all__ = ["Linear", "linear"]


def _fake_aux(x: torch.Tensor, weight: torch.Tensor, activation: str) -> torch.Tensor:
    """The aux the fake kernel returns: the real kernel's (functional.torch_forward), as
    aux_buffer lays it out for symbolic sizes."""
    if activation not in ACTIVATIONS:
        raise InvalidProblem(f"activation must be one of {sorted(ACTIVATIONS)}, got "
                             f"{activation!r}", field="activation")
    layout = ACTIVATIONS[activation].aux
    if layout is None:
        return absent(x, torch.uint8)

    def allocate(shape, kind, zeroed):  # a fake tensor holds no bytes to zero
        return torch.empty(shape, dtype=torch_dtype(kind), device=x.device)

    return functional.aux_buffer(layout, element_of(x, "x"), (), x.shape[0], weight.shape[0],
                                 allocate)


def _linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 activation: str, save_aux: bool, deterministic: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    out, aux = _forward("linear", x, weight, bias, activation, deterministic, save_aux)
    return out, absent(x, torch.uint8) if aux is None else aux


def _forward(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             activation: str, deterministic: bool, save_aux: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out, aux or None)`` of the functional form's plan (the aux allocated and saved into
    with ``save_aux``, where the activation has one), found on a repeat call by a guard check
    (functional.torch_forward); a call that misses is checked for plain tensors on one GPU
    first."""
    return functional.torch_forward(x, weight, bias, activation, deterministic, save_aux,
                                    _ON_GPU[op])


# Each op's device check for a call that misses, naming the op in its errors.
_ON_GPU = {**{op: device_check(op, "x", "weight", "bias") for op in ("linear", "linear_inference")},
           "linear_backward": device_check("linear_backward", "grad_out", "x", "weight", "aux")}


def _linear_fake(x, weight, bias, activation, save_aux, deterministic):
    device = cuda_device("linear", x=x, weight=weight, bias=bias)
    out = empty((x.shape[0], weight.shape[0]), element_of(x, "x"), device)
    return out, _fake_aux(x, weight, activation) if save_aux else absent(x, torch.uint8)


def _linear_backward_impl(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          aux: torch.Tensor | None, activation: str, need_input_grad: bool,
                          need_weight_grad: bool, need_bias_grad: bool, deterministic: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = functional.torch_backward(grad_out, x, weight, aux, activation, need_input_grad,
                                      need_weight_grad, need_bias_grad, deterministic,
                                      _ON_GPU["linear_backward"])
    return tuple(absent(x, torch.uint8) if grad is None else grad for grad in grads)


def _linear_backward_fake(grad_out, x, weight, aux, activation, need_input_grad,
                          need_weight_grad, need_bias_grad, deterministic):
    device = cuda_device("linear_backward", grad_out=grad_out, x=x, weight=weight, aux=aux)
    element = element_of(x, "x")
    wanted = ((need_input_grad, x.shape), (need_weight_grad, weight.shape),
              (need_bias_grad, (weight.shape[0],)))
    return tuple(empty(shape, element, device) if need else absent(x, torch.uint8)
                 for need, shape in wanted)


_linear_backward = define_op("linear_backward", _linear_backward_impl, _linear_backward_fake)


def _save_for_backward(ctx, inputs, output) -> None:
    x, weight, bias, activation, _save_aux, deterministic = inputs
    ctx.activation, ctx.deterministic, ctx.has_bias = activation, deterministic, bias is not None
    aux = output[1] if activation != "none" else None
    ctx.save_for_backward(x, weight, aux)


def _backward(ctx, grad_out, _grad_aux):
    x, weight, aux = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if grad_out is None or not (need_x or need_w or (need_b and ctx.has_bias)):
        return None, None, None, None, None, None
    grad_x, grad_w, grad_b = _linear_backward(
        grad_out.contiguous(), x, weight, aux, ctx.activation, need_x, need_w,
        need_b and ctx.has_bias, ctx.deterministic)
    return (grad_x if need_x else None, grad_w if need_w else None,
            grad_b if need_b and ctx.has_bias else None, None, None, None)


_linear = define_op("linear", _linear_impl, _linear_fake, setup_context=_save_for_backward,
                    backward=_backward, autocast=True)


# -- the inference op: what a graph compiled under no_grad calls ---------------------------------

def _linear_inference_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           activation: str, deterministic: bool) -> torch.Tensor:
    # linear with out alone (no aux): one output crosses the dispatcher where linear's two do.
    return _forward("linear_inference", x, weight, bias, activation, deterministic, False)[0]


def _linear_inference_fake(x, weight, bias, activation, deterministic):
    device = cuda_device("linear_inference", x=x, weight=weight, bias=bias)
    return empty((x.shape[0], weight.shape[0]), element_of(x, "x"), device)


_linear_inference = define_inference_op("linear_inference", _linear_inference_impl,
                                        _linear_inference_fake, training_op="linear",
                                        autocast=True)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           activation: str = "none", deterministic: bool | None = None) -> torch.Tensor:
    """``act(F.linear(x, weight, bias))`` through cuBLASLt: x [..., K], weight [N, K] (nn.Linear's
    layout), bias [N]; the activation is fused into the GEMM's epilogue where cuBLASLt has one
    (see contracts/linear.py). ``deterministic`` None follows
    torch.are_deterministic_algorithms_enabled(). Differentiable in x, weight and bias. Under
    torch.autocast("cuda") the three are cast to its dtype first, as F.linear's are."""
    cast = autocast_dtype()
    if cast is not None:
        x, weight, bias = autocast_inputs(cast, x, weight, bias)
    on_one_gpu(x, weight, optional=bias) or cuda_device("linear", x=x, weight=weight, bias=bias)
    flat = x.ndim == 2
    rows = x if flat else x.reshape(-1, x.shape[-1])  # a view for the usual contiguous x
    deterministic = deterministic_choice(deterministic)
    if wants_grad(x, weight, bias):
        # The activation's aux (a write of N values a row) is saved for the backward.
        # (on_one_gpu has found the tensors plain: with_grad skips __call__'s own checks.)
        out, _ = _linear.with_grad(rows, weight, bias, activation, activation != "none",
                                   deterministic)
    elif torch.compiler.is_compiling():
        # Tracing must see an op; torch.compile guards grad mode and requires_grad, so a graph
        # compiled for inference calls the inference op (no aux) and one compiled for training
        # the op above.
        out = _linear_inference(rows, weight, bias, activation, deterministic)
    else:  # eager inference: the inference op's kernel, without the dispatcher's crossing
        out = _linear_inference_impl(rows, weight, bias, activation, deterministic)
    return out if flat else out.reshape(*x.shape[:-1], weight.shape[0])


class Linear(torch.nn.Module):
    """nn.Linear through opfacade, with an optional fused activation. Its parameters are named
    and shaped as nn.Linear's (weight [out, in], bias [out]), so either loads the other's
    state_dict; initialised as nn.Linear initialises."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 activation: str = "none", deterministic: bool | None = None,
                 device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.activation, self.deterministic = activation, deterministic
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.register_parameter(
            "bias", torch.nn.Parameter(torch.empty(out_features, **factory)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's own initialisation, so a drop-in starts from the same distribution.
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_torch(cls, module: torch.nn.Linear, *, activation: str = "none",
                   deterministic: bool | None = None) -> Linear:
        """A Linear holding a copy of ``module``'s parameters, on its device and dtype."""
        layer = cls(module.in_features, module.out_features, module.bias is not None,
                    activation=activation, deterministic=deterministic,
                    device=module.weight.device, dtype=module.weight.dtype)
        layer.load_state_dict(module.state_dict())
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, activation=self.activation,
                      deterministic=self.deterministic)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}")
