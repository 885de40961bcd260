"""float64 NumPy oracle; never offered as a GPU SKU.

Every reference here computes in float64 whatever the inputs' dtype, so that a kernel's error can
be measured against it. Each is tested against an independent formula (explicit loops, central
finite differences) in ``tests/test_reference_*.py``.
"""

from .alibi import alibi_backward, alibi_distance, alibi_forward
from .decode import decode_attention, decode_forward, gather_kv, kv_append
from .linear import (
    ACTIVATIONS,
    WEIGHT_LAYOUTS,
    activation,
    activation_grad,
    linear_backward,
    linear_forward,
)
from .sdpa import CAUSAL_MODES, sdpa_backward, sdpa_forward, sdpa_mask
from .varlen import (
    varlen_backward,
    varlen_backward_magnitude,
    varlen_backward_underflow,
    varlen_forward,
    varlen_forward_magnitude,
    varlen_forward_underflow,
)

__all__ = [
    "ACTIVATIONS",
    "CAUSAL_MODES",
    "WEIGHT_LAYOUTS",
    "activation",
    "activation_grad",
    "alibi_backward",
    "alibi_distance",
    "alibi_forward",
    "decode_attention",
    "decode_forward",
    "gather_kv",
    "kv_append",
    "linear_backward",
    "linear_forward",
    "sdpa_backward",
    "sdpa_forward",
    "sdpa_mask",
    "varlen_backward",
    "varlen_backward_magnitude",
    "varlen_backward_underflow",
    "varlen_forward",
    "varlen_forward_magnitude",
    "varlen_forward_underflow",
]
