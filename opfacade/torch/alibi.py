"""The alibi family as torch ops: ``opfacade::alibi`` adds ``slope[h] * (j - i)`` to [B, H, Q, K]
scores, ``opfacade::alibi_backward`` gives the scores' and the slopes' gradients, and ``alibi``
is differentiable in both."""

from __future__ import annotations

import torch

from ..ops import alibi as functional
from ._common import absent, cuda_device, element_of, empty
from ._define import define_op

__all__ = ["alibi"]


def _alibi_impl(scores: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    cuda_device("alibi", scores=scores, slopes=slopes)
    return functional.alibi_forward(scores, slopes)


def _alibi_fake(scores, slopes):
    device = cuda_device("alibi", scores=scores, slopes=slopes)
    return empty(scores.shape, element_of(scores, "scores"), device)


def _alibi_backward_impl(grad_output: torch.Tensor, need_input_grad: bool,
                         need_slope_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    cuda_device("alibi_backward", grad_output=grad_output)
    grad_scores, grad_slopes = functional.alibi_backward(
        grad_output, need_input_grad=need_input_grad, need_slope_grad=need_slope_grad)
    return (absent(grad_output, grad_output.dtype) if grad_scores is None else grad_scores,
            absent(grad_output, grad_output.dtype) if grad_slopes is None else grad_slopes)


def _alibi_backward_fake(grad_output, need_input_grad, need_slope_grad):
    device = cuda_device("alibi_backward", grad_output=grad_output)
    element = element_of(grad_output, "grad_output")
    return (empty(grad_output.shape, element, device) if need_input_grad
            else absent(grad_output, grad_output.dtype),
            empty((grad_output.shape[1],), element.accumulator, device) if need_slope_grad
            else absent(grad_output, grad_output.dtype))


_alibi_backward = define_op("alibi_backward", _alibi_backward_impl, _alibi_backward_fake)


def _backward(ctx, grad_output):
    need_scores, need_slopes = ctx.needs_input_grad[:2]
    if grad_output is None or not (need_scores or need_slopes):
        return None, None
    grad_scores, grad_slopes = _alibi_backward(
        grad_output.contiguous(), need_scores, need_slopes)
    return grad_scores if need_scores else None, grad_slopes if need_slopes else None


_alibi = define_op("alibi", _alibi_impl, _alibi_fake, backward=_backward)


def alibi(scores: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """``scores[b, h, i, j] + slopes[h] * (j - i)`` for contiguous [B, H, Q, K] scores; slopes
    [H] in f32 (f64 for f64 scores). Differentiable in both."""
    cuda_device("alibi", scores=scores, slopes=slopes)
    return _alibi(scores, slopes)
