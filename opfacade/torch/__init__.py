"""opfacade for torch: a torch.library custom op for every op family, with fake kernels for
torch.compile and autograd from the families' training pairs, plus drop-ins.

Imported only on request (``import opfacade.torch``); the rest of opfacade never imports torch
unless handed torch tensors.

    import opfacade.torch as oft
    y = oft.Linear(1024, 4096, activation="gelu_tanh", device="cuda")(x)
    o = oft.sdpa(q, k, v, is_causal=True, enable_gqa=True)  # F.scaled_dot_product_attention's
    torch.ops.opfacade.sdpa                                 # the ops, under torch.compile too

The ops (namespace ``opfacade``), one module per family:

    linear            linear, linear_backward,          Linear, linear
                      linear_inference
    sdpa              sdpa, sdpa_backward,              sdpa
                      sdpa_train, sdpa_train_backward,
                      sdpa_inference
    varlen_attention  varlen_attention, ..._backward    varlen_attention
    alibi             alibi, alibi_backward             alibi
    decode_attention  decode_attention (no backward)    decode_attention
    kv_append         kv_append (mutates the caches)    kv_append

The ``*_inference`` ops serve calls that want no gradient (a graph compiled under no_grad calls
them): out alone, fewer arguments, no autograd kernel, and a repeat call's plan found by torch's
tensor guard (``_internal/guarded.py``); a call that wants a gradient is refused (Unsupported).
``sdpa_train`` is sdpa's common case (no mask, no dropout) with its backward, which the drop-in
calls with grad; ``sdpa`` serves a mask and dropout too.

Every op runs on CUDA tensors only (a host tensor is a DeviceMismatch); plans come from the
process-wide plan cache, one per device, so the same code runs on each rank of
torch.distributed. ``deterministic=None`` arguments follow
torch.are_deterministic_algorithms_enabled().
"""

from __future__ import annotations

from .alibi import alibi
from .decode_attention import decode_attention
from .kv_append import kv_append
from .linear import Linear, linear
from .sdpa import sdpa
from .varlen_attention import varlen_attention

__all__ = ["Linear", "alibi", "decode_attention", "kv_append", "linear", "sdpa",
           "varlen_attention"]
