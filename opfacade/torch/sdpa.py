"""The sdpa family as torch ops, and ``sdpa``, a drop-in for F.scaled_dot_product_attention:

- ``opfacade::sdpa`` and ``sdpa_backward``: every case (a mask as bias, dropout);
- ``opfacade::sdpa_train`` and ``sdpa_train_backward``: the common case (no mask, no dropout),
  what the drop-in calls with grad and so what a graph compiled for training calls: six
  arguments cross the dispatcher where sdpa's eleven do, and the stats are always saved;
- ``opfacade::sdpa_inference``: the common case without grad, out alone.

    out = sdpa(q, k, v, is_causal=True, enable_gqa=True)   # q [B, Hq, S, D], k/v [B, Hkv, S, D]

Every case F.scaled_dot_product_attention accepts is either served with its semantics or refused
with a typed error saying why; nothing falls back to another implementation. The cuDNN SKUs'
guarantee does not claim capture safety because of ALiBi, whose slopes the frontend copies from
the host on every execute; these ops never pass ALiBi, and tests/test_torch_gpu.py replays them
from CUDA graphs, so they carry no cudagraph_unsafe tag.
"""

from __future__ import annotations

import math

import torch

from .._internal.memory import torch_empty
from ..contracts.sdpa_layouts import output_layout
from ..errors import DTypeMismatch, InvalidArgument, ShapeMismatch
from ..ops import sdpa as functional
from ._common import (
    absent,
    autocast_dtype,
    autocast_inputs,
    cuda_device,
    deterministic_choice,
    device_check,
    element_of,
    empty,
    empty_in_layout,
    on_one_gpu,
    wants_grad,
)
from ._define import define_inference_op, define_op

__all__ = ["sdpa"]

# The Philox seeds a dropout forward draws from torch's generator: below 2**62, as torch's own.
_SEED_BOUND = 1 << 62


def _layout(tensor: torch.Tensor) -> str:
    """The layout out (or the gradients) are allocated in for this q: the functional form's."""
    return output_layout(tuple(tensor.shape), tuple(tensor.stride()))


def _causal(causal: bool) -> str | None:
    return "top_left" if causal else None  # torch's is_causal is top-left aligned


def _sdpa_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
               causal: bool, scale: float | None, dropout_p: float,
               dropout_seed: torch.Tensor | None, dropout_offset: torch.Tensor | None,
               save_stats: bool, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # deterministic is the backward's choice (cuDNN's forward is deterministic either way);
    # it is in the forward's schema so that autograd hands it to the backward.
    # out is the functional form's: dense in output_layout(q), as the fake kernel allocates it
    # (opcheck compares the two); letting it allocate saves reading q's layout twice.
    if bias is None and dropout_p == 0.0 and dropout_seed is None and dropout_offset is None:
        out, stats = _common_forward("sdpa", q, k, v, causal, scale, save_stats)
        return out, absent(q) if stats is None else stats
    on_one_gpu(q, k, v, optional=bias) or cuda_device("sdpa", q=q, k=k, v=v, bias=bias)
    result = functional.sdpa(q, k, v, causal=_causal(causal), scale=scale, bias=bias,
                             dropout_p=dropout_p, dropout_seed=dropout_seed,
                             dropout_offset=dropout_offset, return_stats=save_stats)
    return result if save_stats else (result, absent(q))


def _common_forward(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    scale: float | None, save_stats: bool
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """out (and the stats when ``save_stats``, else None) of sdpa without bias or dropout, the
    plan found on a repeat call by a guard check (functional.torch_forward); a call that misses
    is checked for plain tensors on one GPU first."""
    return functional.torch_forward(q, k, v, _causal(causal), scale, save_stats, _ON_GPU[op])


# Each op's device check for a call that misses, naming the op in its errors.
_ON_GPU = {**{op: device_check(op, "q", "k", "v")
              for op in ("sdpa", "sdpa_train", "sdpa_inference")},
           **{op: device_check(op, "q", "k", "v", "out", "grad_out")
              for op in ("sdpa_backward", "sdpa_train_backward")}}


def _fake_forward(op: str, q, k, v, bias, save_stats: bool):
    """The fake (out, stats) of a forward op (``absent`` stats unless ``save_stats``)."""
    device = cuda_device(op, q=q, k=k, v=v, bias=bias)
    element = element_of(q, "q")
    out = empty_in_layout((*q.shape[:3], v.shape[3]), _layout(q), element, device)
    stats = empty((*q.shape[:3], 1), element.accumulator, device) if save_stats else absent(q)
    return out, stats


def _fake_grads(q, k, v, device) -> list:
    """The fake grad_q, grad_k, grad_v of a backward op: in q's output layout, as the real ones
    (functional.torch_backward and sdpa_backward allocate them dense in the plan's layout)."""
    element, layout = element_of(q, "q"), _layout(q)
    return [empty_in_layout(t.shape, layout, element, device) for t in (q, k, v)]


def _sdpa_fake(q, k, v, bias, causal, scale, dropout_p, dropout_seed, dropout_offset,
               save_stats, deterministic):
    return _fake_forward("sdpa", q, k, v, bias, save_stats)


def _sdpa_backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        grad_out: torch.Tensor, stats: torch.Tensor, bias: torch.Tensor | None,
                        need_bias_grad: bool, causal: bool, scale: float | None,
                        dropout_p: float, dropout_seed: torch.Tensor | None,
                        dropout_offset: torch.Tensor | None, deterministic: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if bias is None and dropout_p == 0.0 and dropout_seed is None and dropout_offset is None:
        grads = functional.torch_backward(q, k, v, out, grad_out, stats, _causal(causal), scale,
                                          deterministic, _ON_GPU["sdpa_backward"])
        return (*grads, absent(q, q.dtype))
    on_one_gpu(q, k, v, out, grad_out, optional=bias) or cuda_device(
        "sdpa_backward", q=q, k=k, v=v, out=out, grad_out=grad_out, bias=bias)
    grads = functional.sdpa_backward(q, k, v, out, grad_out, stats, causal=_causal(causal),
                                     scale=scale, bias=bias, need_bias_grad=need_bias_grad,
                                     dropout_p=dropout_p, dropout_seed=dropout_seed,
                                     dropout_offset=dropout_offset, deterministic=deterministic)
    return grads if need_bias_grad else (*grads, absent(q, q.dtype))


def _sdpa_backward_fake(q, k, v, out, grad_out, stats, bias, need_bias_grad, causal, scale,
                        dropout_p, dropout_seed, dropout_offset, deterministic):
    device = cuda_device("sdpa_backward", q=q, k=k, v=v, out=out, grad_out=grad_out, bias=bias)
    grads = _fake_grads(q, k, v, device)
    grad_bias = (empty(bias.shape, element_of(q, "q"), device) if need_bias_grad
                 else absent(q, q.dtype))
    return (*grads, grad_bias)


_sdpa_backward = define_op("sdpa_backward", _sdpa_backward_impl, _sdpa_backward_fake)


def _in_layout_of(out: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """grad_out in out's strides: cuDNN reads dO in O's layout (torch's own SDPA backwards make
    the same copy)."""
    if grad_out.stride() == out.stride():
        return grad_out
    return torch_empty(torch, out.shape, out.dtype, out.device, out.stride()).copy_(grad_out)


def _save_for_backward(ctx, inputs, output) -> None:
    q, k, v, bias, causal, scale, dropout_p, seed, offset, _save_stats, deterministic = inputs
    ctx.options = (causal, scale, dropout_p, deterministic)
    ctx.save_for_backward(q, k, v, bias, seed, offset, *output)


def _backward(ctx, grad_out, _grad_stats):
    q, k, v, bias, seed, offset, out, stats = ctx.saved_tensors
    causal, scale, dropout_p, deterministic = ctx.options
    if grad_out is None:  # out was not used
        return (None,) * 11
    need_bias_grad = bias is not None and ctx.needs_input_grad[3]
    grad_out = _in_layout_of(out, grad_out)
    grad_q, grad_k, grad_v, grad_bias = _sdpa_backward(
        q, k, v, out, grad_out, stats, bias, need_bias_grad, causal, scale, dropout_p, seed,
        offset, deterministic)
    return (grad_q, grad_k, grad_v, grad_bias if need_bias_grad else None,
            None, None, None, None, None, None, None)


_sdpa = define_op("sdpa", _sdpa_impl, _sdpa_fake, setup_context=_save_for_backward,
                  backward=_backward, autocast=True)


# -- the common case's training ops: what the drop-in calls with grad ----------------------------

def _sdpa_train_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                     scale: float | None, deterministic: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    # deterministic is the backward's choice, in the schema so that autograd hands it on (as
    # sdpa's). (Development CPU, plans whose run() does nothing: this op through the dispatcher
    # 16.5-17.3 us a call against sdpa's 18.1-19.1 with the same stats; docs/PERF-NOTES.md.)
    return _common_forward("sdpa_train", q, k, v, causal, scale, True)


def _sdpa_train_fake(q, k, v, causal, scale, deterministic):
    return _fake_forward("sdpa_train", q, k, v, None, True)


def _sdpa_train_backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              out: torch.Tensor, grad_out: torch.Tensor, stats: torch.Tensor,
                              causal: bool, scale: float | None, deterministic: bool
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return functional.torch_backward(q, k, v, out, grad_out, stats, _causal(causal), scale,
                                     deterministic, _ON_GPU["sdpa_train_backward"])


def _sdpa_train_backward_fake(q, k, v, out, grad_out, stats, causal, scale, deterministic):
    device = cuda_device("sdpa_train_backward", q=q, k=k, v=v, out=out, grad_out=grad_out)
    return tuple(_fake_grads(q, k, v, device))


_sdpa_train_backward = define_op("sdpa_train_backward", _sdpa_train_backward_impl,
                                 _sdpa_train_backward_fake)


def _save_for_train_backward(ctx, inputs, output) -> None:
    q, k, v, causal, scale, deterministic = inputs
    ctx.options = (causal, scale, deterministic)
    ctx.save_for_backward(q, k, v, *output)


def _train_backward(ctx, grad_out, _grad_stats):
    if grad_out is None:  # out was not used
        return (None,) * 6
    q, k, v, out, stats = ctx.saved_tensors
    grad_out = _in_layout_of(out, grad_out)
    grad_q, grad_k, grad_v = _sdpa_train_backward(q, k, v, out, grad_out, stats, *ctx.options)
    return grad_q, grad_k, grad_v, None, None, None


_sdpa_train = define_op("sdpa_train", _sdpa_train_impl, _sdpa_train_fake,
                        setup_context=_save_for_train_backward, backward=_train_backward,
                        autocast=True)


# -- the inference op: what a graph compiled under no_grad calls ---------------------------------

def _sdpa_inference_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                         scale: float | None) -> torch.Tensor:
    # sdpa's common case (no mask, no dropout) with out alone: five arguments and one output
    # cross the dispatcher where sdpa's eleven and two do.
    return _common_forward("sdpa_inference", q, k, v, causal, scale, False)[0]


def _sdpa_inference_fake(q, k, v, causal, scale):
    device = cuda_device("sdpa_inference", q=q, k=k, v=v)
    return empty_in_layout((*q.shape[:3], v.shape[3]), _layout(q), element_of(q, "q"), device)


_sdpa_inference = define_inference_op("sdpa_inference", _sdpa_inference_impl,
                                      _sdpa_inference_fake, training_op="sdpa_train",
                                      autocast=True)


def _refuse_ranks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    for tensor, name in ((query, "query"), (key, "key"), (value, "value")):
        if tensor.ndim != 4:
            raise ShapeMismatch(f"sdpa: {name} must be [B, H, S, D] or [H, S, D], got shape "
                                f"{tuple(tensor.shape)}", argument=name)


def _bias_from_mask(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor
                    ) -> torch.Tensor | None:
    """torch's attn_mask as the additive [B|1, H|1, Sq, Skv] bias the contract takes: a boolean
    mask (True attends) becomes 0/-inf in q's dtype; a float mask must be in q's dtype, as torch
    requires; broadcast extents are materialised only over the two sequence axes."""
    if mask is None:
        return None
    batch, heads, seq_q = q.shape[:3]
    seq_kv = k.shape[2]
    if mask.ndim > 4:
        raise ShapeMismatch(f"sdpa: attn_mask must have at most 4 dims, got shape "
                            f"{tuple(mask.shape)}", argument="attn_mask")
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=mask.device).masked_fill(
            mask.logical_not(), -math.inf)
    elif mask.dtype != q.dtype:
        raise DTypeMismatch(f"sdpa: attn_mask must be bool or of q's dtype {q.dtype}, got "
                            f"{mask.dtype}", argument="attn_mask")
    mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    lead = tuple(mask.shape[:2])
    if (lead[0] not in (1, batch) or lead[1] not in (1, heads)
            or mask.shape[2] not in (1, seq_q) or mask.shape[3] not in (1, seq_kv)):
        raise ShapeMismatch(f"sdpa: attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                            f"({batch}, {heads}, {seq_q}, {seq_kv})", argument="attn_mask")
    return mask.expand(*lead, seq_q, seq_kv).contiguous()


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
         scale: float | None = None, enable_gqa: bool = False, *,
         deterministic: bool | None = None) -> torch.Tensor:
    """F.scaled_dot_product_attention's signature and semantics, through opfacade's SDPA SKUs.

    query [B, Hq, L, E] (or [Hq, L, E]), key/value [B, Hkv, S, E/Ev], stored densely in the
    bhsd, bshd or sbhd order or as views into one packed QKV projection (read in place, no
    copy; cuDNN needs 16-byte strides); attn_mask bool (True attends) or additive in query's dtype,
    broadcastable to [B, Hq, L, S]; is_causal is top-left aligned, as torch's. Dropout draws its
    Philox seed from torch's generator, so torch.manual_seed reproduces it (the mask itself is
    cuDNN's, not torch's). ``deterministic`` (keyword-only, None: follow
    torch.are_deterministic_algorithms_enabled()) picks a deterministic backward.
    Differentiable in query, key, value and a float attn_mask. Under torch.autocast("cuda")
    query, key, value and a float attn_mask are cast to its dtype first, as torch's are.
    """
    cast = autocast_dtype()
    if cast is not None:
        query, key, value, attn_mask = autocast_inputs(cast, query, key, value, attn_mask)
    # The common call (plain CUDA tensors, 4-D, no mask, no dropout) first, with the fewest
    # reads: every one costs host time that torch's C++ call does not pay. Anything else, and
    # every error, takes the general route below. (The tensors first: until they are known to
    # be tensors on the GPU, an argument that is not what torch takes reaches only the typed
    # checks of the general route.)
    if (on_one_gpu(query, key, value) and attn_mask is None and dropout_p == 0.0
            and query.ndim == 4 and key.ndim == 4 and value.ndim == 4
            and (enable_gqa or query.size(1) == key.size(1))):
        if ((query.requires_grad or key.requires_grad or value.requires_grad)
                and torch.is_grad_enabled()):
            return _sdpa_train.with_grad(query, key, value, is_causal, scale,
                                         deterministic_choice(deterministic))[0]
        if torch.compiler.is_compiling():
            # Tracing must see an op; torch.compile guards grad mode and requires_grad, so a
            # graph compiled for inference calls the inference op (no stats) and one compiled
            # for training the op above.
            return _sdpa_inference(query, key, value, is_causal, scale)
        # Eager inference: the inference op's kernel, without the dispatcher's crossing.
        return _sdpa_inference_impl(query, key, value, is_causal, scale)
    return _sdpa_general(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                         deterministic)


def _sdpa_general(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
                  scale: float | None, enable_gqa: bool, deterministic: bool | None
                  ) -> torch.Tensor:
    """sdpa's every other case: unbatched inputs, a mask, dropout, and the typed errors."""
    cuda_device("sdpa", query=query, key=key, value=value, attn_mask=attn_mask)
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        _refuse_ranks(query, key, value)
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ShapeMismatch(f"sdpa: query has {query.shape[1]} heads and key {key.shape[1]}; "
                            f"pass enable_gqa=True for grouped-query attention", argument="key")
    if is_causal and attn_mask is not None:
        raise InvalidArgument("sdpa: pass attn_mask or is_causal, not both (as torch requires)",
                              argument="attn_mask")
    if not 0.0 <= dropout_p < 1.0:
        raise InvalidArgument(f"sdpa: dropout_p must be in [0, 1), got {dropout_p}",
                              argument="dropout_p")
    bias = _bias_from_mask(attn_mask, query, key)
    seed = offset = None
    if dropout_p > 0.0:
        seed = torch.randint(_SEED_BOUND, (1,), dtype=torch.int64, device=query.device)
        offset = torch.zeros(1, dtype=torch.int64, device=query.device)
    arguments = (query, key, value, bias, is_causal, scale, float(dropout_p), seed, offset)
    grad = wants_grad(query, key, value, bias)
    if grad or torch.compiler.is_compiling():
        out, _ = _sdpa(*arguments, grad, deterministic_choice(deterministic))
    else:  # eager inference: the op's kernel without the dispatcher's Python round trip
        out = functional.sdpa(query, key, value, causal=_causal(is_causal), scale=scale,
                              bias=bias, dropout_p=float(dropout_p), dropout_seed=seed,
                              dropout_offset=offset)
    return out.squeeze(0) if unbatched else out
