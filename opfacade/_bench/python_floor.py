"""The floor under the host rows of eager sdpa training calls (issue 14 §3): torch's own cuDNN
attention ops, the ones F.scaled_dot_product_attention runs for these tensors, inside a Python
``torch.autograd.Function`` and nothing else.

An op whose autograd formula is Python (every torch.library op registered from Python, and so
opfacade's) pays for that Function's layer on the forward and for a Python node in the autograd
engine on the backward. This contestant pays the same with torch's kernels and no opfacade code,
so a row shows what torch's C++ call gains from having no Python in its autograd, beside what
opfacade adds on top of that (scripts/engine_phase_probe.py splits the same calls by phase).
"""

from __future__ import annotations

from collections.abc import Callable

# torch.nn.attention.SDPBackend.CUDNN_ATTENTION: the backend whose ops this wraps.
CUDNN_BACKEND = 3


def sdpa_training_backend(q, k, v) -> int:
    """The SDPBackend F.scaled_dot_product_attention picks for q, k, v when they require grad
    (a training call), as an int (torch.nn.attention.SDPBackend's values)."""
    import torch

    grad = [t.detach().requires_grad_() for t in (q, k, v)]
    return int(torch._fused_sdp_choice(*grad))


def cudnn_sdpa_in_python_function(q, k, v) -> Callable | None:
    """``call(q, k, v) -> out``: F.sdpa(q, k, v) (no mask, no dropout, not causal) through
    torch's cuDNN forward and backward ops in a Python autograd.Function; None where torch would
    not pick its cuDNN backend for these tensors with grad (the contestant would then run
    another kernel than torch's call)."""
    import torch

    if sdpa_training_backend(q, k, v) != CUDNN_BACKEND:
        return None
    aten = torch.ops.aten
    forward_op = aten._scaled_dot_product_cudnn_attention.default
    backward_op = aten._scaled_dot_product_cudnn_attention_backward.default

    class CudnnSdpaInPython(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            # (attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask)
            found = forward_op(q, k, v, None, True, 0.0, False, False)
            out, lse, cum_q, cum_k, max_q, max_k, seed, offset = found[:8]
            ctx.save_for_backward(q, k, v, out, lse, seed, offset, cum_q, cum_k)
            ctx.maxes = (max_q, max_k)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse, seed, offset, cum_q, cum_k = ctx.saved_tensors
            # (..., attn_bias: none, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal)
            return backward_op(grad_out, q, k, v, out, lse, seed, offset, None, cum_q, cum_k,
                               *ctx.maxes, 0.0, False)

    return CudnnSdpaInPython.apply
