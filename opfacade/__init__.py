"""opfacade: select-then-run fused GPU ops over cuDNN, cuBLASLt and bespoke NVRTC kernels.

Each op family has a Descriptor (the problem), Args (the tensors), and a Plan (the chosen kernel
SKU with its precision guarantee). torch, JAX and CuPy are imported only when their objects are
handed over; importing opfacade needs no GPU.
"""

__version__ = "0.1.0"

from . import errors
from ._internal.sku import Descriptor, ReasonCode, Workspace
from .alibi import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiBackwardPlan,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    AlibiForwardPlan,
    alibi_backward,
    alibi_forward,
)
from .attention import (
    AttentionArgs,
    AttentionBackwardArgs,
    AttentionBackwardDescriptor,
    AttentionBackwardPlan,
    AttentionDescriptor,
    AttentionPlan,
    SlidingWindow,
    attention,
    attention_backward,
)
from .errors import (
    BackendUnavailable,
    BufferTooSmall,
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
from .gemm import (
    LinearArgs,
    LinearBackwardArgs,
    LinearBackwardDescriptor,
    LinearBackwardPlan,
    LinearDescriptor,
    LinearForwardPlan,
    linear,
    linear_backward,
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
    "AttentionDescriptor",
    "AttentionBackwardDescriptor",
    "AttentionArgs",
    "AttentionBackwardArgs",
    "AttentionPlan",
    "AttentionBackwardPlan",
    "SlidingWindow",
    "attention",
    "attention_backward",
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
]
