"""opfacade: select-then-run fused GPU ops over cuDNN, cuBLASLt and bespoke NVRTC kernels.

Each op family has a Descriptor (the problem), Args (the tensors), and a Plan (the chosen kernel
SKU with its precision guarantee). torch, JAX and CuPy are imported only when their objects are
handed over; importing opfacade needs no GPU.
"""

__version__ = "0.1.0"

from . import errors
from ._internal.contract import Descriptor
from ._internal.sku import ReasonCode, Workspace
from .caches import clear_caches
from .errors import (
    BackendUnavailable,
    BufferTooSmall,
    CompileError,
    DeviceMismatch,
    DTypeMismatch,
    InvalidArgument,
    InvalidProblem,
    LaunchFailed,
    LayoutMismatch,
    NoKernelSku,
    OpFacadeError,
    PlanFreed,
    ShapeMismatch,
    Unsupported,
)
from .ops.alibi import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiBackwardPlan,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    AlibiForwardPlan,
    alibi_backward,
    alibi_forward,
)
from .ops.decode_attention import (
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
    DecodeAttentionPlan,
    decode_attention,
)
from .ops.kv_append import KvAppendArgs, KvAppendDescriptor, KvAppendPlan, kv_append
from .ops.linear import (
    LinearArgs,
    LinearBackwardArgs,
    LinearBackwardDescriptor,
    LinearBackwardPlan,
    LinearDescriptor,
    LinearForwardPlan,
    linear,
    linear_backward,
)
from .ops.sdpa import (
    DropoutDraw,
    DropoutState,
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaBackwardPlan,
    SdpaDescriptor,
    SdpaForwardPlan,
    SlidingWindow,
    sdpa,
    sdpa_backward,
)
from .ops.varlen_attention import (
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionBackwardPlan,
    VarlenAttentionDescriptor,
    VarlenAttentionForwardPlan,
    varlen_attention,
    varlen_attention_backward,
)
from .plan import ExplainReport, Plan, Target, TrainingPair, Verdict
from .types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
)

__all__ = [
    "__version__",
    "errors",
    "Descriptor",
    "ReasonCode",
    "Workspace",
    "clear_caches",
    "Plan",
    "ExplainReport",
    "Target",
    "Verdict",
    "ArchSku",
    "BackendKind",
    "ElementKind",
    "KernelSku",
    "MathPrecision",
    "OpCategory",
    "PlanPreference",
    "PrecisionGuarantee",
    "AlibiForwardDescriptor",
    "AlibiBackwardDescriptor",
    "AlibiForwardArgs",
    "AlibiBackwardArgs",
    "AlibiForwardPlan",
    "AlibiBackwardPlan",
    "alibi_forward",
    "alibi_backward",
    "SdpaDescriptor",
    "SdpaBackwardDescriptor",
    "SdpaArgs",
    "SdpaBackwardArgs",
    "SdpaForwardPlan",
    "SdpaBackwardPlan",
    "SlidingWindow",
    "DropoutState",
    "DropoutDraw",
    "sdpa",
    "sdpa_backward",
    "VarlenAttentionDescriptor",
    "VarlenAttentionBackwardDescriptor",
    "VarlenAttentionArgs",
    "VarlenAttentionBackwardArgs",
    "VarlenAttentionForwardPlan",
    "VarlenAttentionBackwardPlan",
    "varlen_attention",
    "varlen_attention_backward",
    "DecodeAttentionDescriptor",
    "DecodeAttentionArgs",
    "DecodeAttentionPlan",
    "decode_attention",
    "KvAppendDescriptor",
    "KvAppendArgs",
    "KvAppendPlan",
    "kv_append",
    "LinearDescriptor",
    "LinearBackwardDescriptor",
    "LinearArgs",
    "LinearBackwardArgs",
    "LinearForwardPlan",
    "LinearBackwardPlan",
    "linear",
    "linear_backward",
    "TrainingPair",
    "OpFacadeError",
    "InvalidProblem",
    "InvalidArgument",
    "ShapeMismatch",
    "DTypeMismatch",
    "LayoutMismatch",
    "DeviceMismatch",
    "BufferTooSmall",
    "Unsupported",
    "NoKernelSku",
    "BackendUnavailable",
    "LaunchFailed",
    "PlanFreed",
    "CompileError",
]

# The sdpa family's names before it had one name (0.1.0); importing them warns.
_RENAMED = {
    "attention": "sdpa",
    "attention_backward": "sdpa_backward",
    "AttentionDescriptor": "SdpaDescriptor",
    "AttentionBackwardDescriptor": "SdpaBackwardDescriptor",
    "AttentionArgs": "SdpaArgs",
    "AttentionBackwardArgs": "SdpaBackwardArgs",
    "AttentionPlan": "SdpaForwardPlan",
    "AttentionBackwardPlan": "SdpaBackwardPlan",
}


def __getattr__(name: str):
    new = _RENAMED.get(name)
    if new is None:
        raise AttributeError(f"module 'opfacade' has no attribute {name!r}")
    import warnings

    warnings.warn(f"opfacade.{name} is now opfacade.{new}", DeprecationWarning, stacklevel=2)
    return globals()[new]
