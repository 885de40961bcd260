"""What cuDNN's fused SDPA graphs serve, stated as data, so that explain works without a GPU.

Every rule here restates a check of cudnn-frontend's SDPA support surface
(``include/cudnn_frontend/node/sdpa_support_surface.h`` and the backward node) against the
problem, the target architecture and the cuDNN backend version. With a GPU the graph itself is
built and its own verdict is final; these rules only decide what can be said before that, so
they err on the permissive side where cuDNN's behaviour depends on a heuristic we cannot see
(a problem they pass is "viable pending graph support").

Versions are cuDNN's integers: ``major * 10000 + minor * 100 + patch`` (9.19.0 is 91900).
An unknown architecture or version (no GPU, no cuDNN) skips the rules that depend on it.

``SIZE_LIMITS`` are what the graph can index, checked after the rules: cuDNN's tensor
dimensions and strides are int64 (``CUDNN_ATTR_TENSOR_DIMENSIONS``/``_STRIDES`` are
``CUDNN_TYPE_INT64`` in ``cudnn_graph.h``), so each tensor's element count must be an int64;
the padding lengths are int32 tensors and the masks compare int32 indices, which the
descriptor's ``seq_q``/``seq_kv`` < 2**31 already keep in range; and the workspace (the
frontend sizes its dQ accumulator and rowsum buffer as int64 byte counts) stays below 2**48.
The stats ([B, Hq, Sq, 1]) are never larger than q; dO, dQ, dK, dV have q's, k's, v's and
out's shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..._internal import limits as size
from ..._internal.limits import INT64_MAX, Limit
from ..._internal.sku import ReasonCode, Unfit
from ...types import ArchSku, ElementKind

__all__ = [
    "ELEMENTS", "HEAD_DIM_MULTIPLE", "HEAD_DIM_LIMITS", "MIN_BACKEND_VERSION", "RULES",
    "SIZE_LIMITS",
    "Facts", "Context", "check", "format_version", "max_head_dim",
]

ELEMENTS = (ElementKind.f16, ElementKind.bf16)
HEAD_DIM_MULTIPLE = 8
MIN_BACKEND_VERSION = 90000  # cuDNN v9: the graph API this backend is written against


def format_version(version: int) -> str:
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


@dataclass(frozen=True)
class HeadDimRow:
    """From cuDNN ``since`` on, on GPUs of compute-capability major ``majors``, the largest head
    dim (both D and Dv) that ``direction`` serves. The last matching row wins."""

    direction: str
    majors: tuple[int, ...]
    since: int
    max_dim: int


HEAD_DIM_LIMITS: tuple[HeadDimRow, ...] = (
    HeadDimRow("forward", (8, 12), 0, 128),
    HeadDimRow("forward", (8, 12), 91000, 256),
    HeadDimRow("forward", (9,), 0, 256),
    HeadDimRow("forward", (10,), 0, 128),
    HeadDimRow("forward", (10,), 90900, 256),
    HeadDimRow("backward", (8, 12), 0, 128),
    HeadDimRow("backward", (9,), 0, 256),
    HeadDimRow("backward", (10,), 0, 128),
)
# Without an architecture, the most any GPU serves: a problem above it is rejected everywhere.
_ANY_ARCH_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Facts:
    """The parts of an SDPA problem the rules read (built by the op layer from its descriptor)."""

    direction: str  # "forward" or "backward"
    element: ElementKind
    batch: int
    heads_q: int
    seq_q: int
    seq_kv: int
    head_dim: int
    head_dim_v: int
    bias: str | None  # "bhqk", "1hqk", "b1qk", "11qk"
    alibi: bool
    dropout: bool
    padding: bool
    right_bound: int | None  # reference convention: keys j <= i + d + right
    left_bound: int | None  # reference convention: keys j >= i + d - left
    bottom_right: bool  # diagonal alignment
    bias_grad: bool = False
    deterministic: bool = False
    heads_kv: int | None = None  # None: heads_q (plain multi-head attention)
    workspace: int | None = None  # the graph's workspace in bytes (an estimate without a GPU)

    @property
    def kv_heads(self) -> int:
        return self.heads_q if self.heads_kv is None else self.heads_kv

    @property
    def causal_like(self) -> bool:
        """cuDNN's 'causal-like masking': a right bound is set (causal is right bound 0)."""
        return self.right_bound is not None

    @property
    def bottom_right_band(self) -> bool:
        """cuDNN's 'bottom-right causal mask': a right bound with bottom-right alignment."""
        return self.causal_like and self.bottom_right

    @property
    def bias_broadcasts(self) -> bool:
        """The bias is shared by several batch entries or heads, so dBias sums over them."""
        return self.bias is not None and (
            (self.bias[0] == "1" and self.batch > 1) or (self.bias[1] == "1" and self.heads_q > 1))


@dataclass(frozen=True)
class Context:
    """Where the graph would run; None when unknown (no GPU, or cuDNN not loadable)."""

    arch: ArchSku | None
    version: int | None


def max_head_dim(direction: str, arch: ArchSku | None, version: int | None) -> int:
    """The largest head dim ``direction`` serves on ``arch`` with cuDNN ``version``."""
    if arch is None:
        return _ANY_ARCH_MAX_HEAD_DIM
    major = arch.compute_capability[0]
    best = None
    for row in HEAD_DIM_LIMITS:
        if row.direction == direction and major in row.majors and (
                version is None or version >= row.since):
            best = row.max_dim
    return _ANY_ARCH_MAX_HEAD_DIM if best is None else best


@dataclass(frozen=True)
class Rule:
    """One limit: when ``rejects`` holds, the SKU is unfit with ``code`` and ``why``."""

    name: str
    code: ReasonCode
    rejects: Callable[[Facts, Context], bool]
    why: Callable[[Facts, Context], str]


def _older(version: int | None, than: int) -> bool:
    return version is not None and version < than


def _major(ctx: Context) -> int | None:
    return None if ctx.arch is None else ctx.arch.compute_capability[0]


def _head_dim_ok(f: Facts, ctx: Context) -> bool:
    limit = max_head_dim(f.direction, ctx.arch, ctx.version)
    if f.head_dim <= limit and f.head_dim_v <= limit:
        return True
    # Blackwell's backward has two extra shapes beside the 128 cap.
    if f.direction == "backward" and _major(ctx) == 10 and not _older(ctx.version, 91100):
        if (f.head_dim, f.head_dim_v) == (192, 128):
            return True
        if (f.head_dim, f.head_dim_v) == (256, 256) and not _older(ctx.version, 92300):
            return True
    return False


def _where(ctx: Context) -> str:
    arch = str(ctx.arch) if ctx.arch is not None else "any GPU"
    version = f"cuDNN {format_version(ctx.version)}" if ctx.version is not None else "cuDNN"
    return f"{arch} with {version}"


RULES: tuple[Rule, ...] = (
    Rule("backend version", ReasonCode.feature_unsupported,
         lambda f, c: _older(c.version, MIN_BACKEND_VERSION),
         lambda f, c: f"needs cuDNN {format_version(MIN_BACKEND_VERSION)} or newer, found "
                      f"{format_version(c.version)}"),
    Rule("known-bad releases", ReasonCode.version_blocked,
         lambda f, c: c.version in (91000, 91001),
         lambda f, c: f"cuDNN {format_version(c.version)} has known SDPA f16/bf16 bugs; "
                      "9.10.2 or newer is needed"),
    Rule("9.14.0 window bug", ReasonCode.version_blocked,
         lambda f, c: (c.version == 91400 and f.seq_kv > 1024 and f.left_bound is not None
                       and not f.causal_like),
         lambda f, c: "cuDNN 9.14.0 miscomputes a non-causal sliding window with seq_kv > 1024; "
                      "9.14.1 or newer is needed"),
    Rule("head dim multiple", ReasonCode.shape_unsupported,
         lambda f, c: f.head_dim % HEAD_DIM_MULTIPLE or f.head_dim_v % HEAD_DIM_MULTIPLE,
         lambda f, c: f"head_dim {f.head_dim} and head_dim_v {f.head_dim_v} must be multiples "
                      f"of {HEAD_DIM_MULTIPLE}"),
    Rule("head dim size", ReasonCode.shape_unsupported,
         lambda f, c: not _head_dim_ok(f, c),
         lambda f, c: f"head_dim {f.head_dim} / head_dim_v {f.head_dim_v} exceed the "
                      f"{max_head_dim(f.direction, c.arch, c.version)} the {f.direction} serves "
                      f"on {_where(c)}"),
    Rule("single token backward", ReasonCode.shape_unsupported,
         lambda f, c: f.direction == "backward" and f.seq_q == 1 and f.seq_kv == 1,
         lambda f, c: "the backward does not serve seq_q = seq_kv = 1"),
    Rule("alibi needs causal", ReasonCode.feature_unsupported,
         lambda f, c: f.alibi and not (f.right_bound == 0 and not f.bottom_right),
         lambda f, c: "ALiBi is served only with a top-left causal mask (right bound 0)"),
    Rule("bottom-right band extras", ReasonCode.feature_unsupported,
         lambda f, c: f.bottom_right_band and (f.bias is not None or f.alibi or f.dropout),
         lambda f, c: "bottom-right alignment of a causal mask or right window bound is served "
                      "without bias, ALiBi and dropout only"),
    Rule("bottom-right band shape", ReasonCode.shape_unsupported,
         lambda f, c: f.bottom_right_band and not f.padding and f.seq_q > f.seq_kv,
         lambda f, c: f"bottom-right alignment needs seq_q <= seq_kv without padding, got "
                      f"{f.seq_q} > {f.seq_kv}"),
    Rule("bottom-right band before 9.6", ReasonCode.feature_unsupported,
         lambda f, c: (f.bottom_right_band and _older(c.version, 90600)
                       and (f.seq_q % 64 or f.seq_kv % 64)),
         lambda f, c: "bottom-right alignment with lengths not multiples of 64 needs cuDNN 9.6.0"),
    Rule("window shape", ReasonCode.shape_unsupported,
         lambda f, c: f.left_bound is not None and not f.padding and f.seq_q > f.seq_kv,
         lambda f, c: f"a left window bound needs seq_q <= seq_kv without padding, got "
                      f"{f.seq_q} > {f.seq_kv}"),
    Rule("window extras before 9.10.2", ReasonCode.feature_unsupported,
         lambda f, c: (f.left_bound is not None and _older(c.version, 91002)
                       and (not f.causal_like or f.dropout or f.bias is not None)),
         lambda f, c: "a left window bound without a right bound, or with dropout or bias, "
                      "needs cuDNN 9.10.2"),
    Rule("dbias before 9.5", ReasonCode.feature_unsupported,
         lambda f, c: (f.bias_grad and _older(c.version, 90500)
                       and (f.padding or f.seq_q % 64 or f.seq_kv % 64)),
         lambda f, c: "dBias with padding or lengths not multiples of 64 needs cuDNN 9.5.0"),
    Rule("deterministic on Blackwell", ReasonCode.feature_unsupported,
         lambda f, c: (f.deterministic and _major(c) == 10
                       and (_older(c.version, 91800) or f.bias_grad or f.dropout or f.alibi)),
         lambda f, c: "the deterministic backward on sm100 needs cuDNN 9.18.0 and serves no "
                      "dBias, dropout or ALiBi"),
    # Ours, not cuDNN's: dBias of a bias shared across batch entries or heads is a sum over them
    # whose order cuDNN does not document as fixed, so the deterministic SKU does not promise it.
    Rule("deterministic broadcast dbias", ReasonCode.feature_unsupported,
         lambda f, c: f.deterministic and f.bias_grad and f.bias_broadcasts,
         lambda f, c: f"dBias of a bias broadcast over batch or heads ({f.bias}) is a reduction "
                      "cuDNN does not promise to order; the deterministic SKU needs bias 'bhqk'"),
)


def _bias_elements(f: Facts) -> int | None:
    if f.bias is None:
        return None
    lead = (f.batch if f.bias[0] == "b" else 1) * (f.heads_q if f.bias[1] == "h" else 1)
    return lead * f.seq_q * f.seq_kv


def _tensor(name: str, quantity: str, extents: Callable[[Facts], tuple[int, ...]]) -> Limit:
    return Limit(f"{name} elements", quantity, f"elements of {name}",
                 "cuDNN's int64 tensor dimensions and strides", INT64_MAX,
                 lambda f: math.prod(extents(f)),
                 "cudnn_graph.h: CUDNN_ATTR_TENSOR_DIMENSIONS and _STRIDES are CUDNN_TYPE_INT64")


SIZE_LIMITS: tuple[Limit[Facts], ...] = (
    _tensor("q", "batch*heads_q*seq_q*head_dim",
            lambda f: (f.batch, f.heads_q, f.seq_q, f.head_dim)),
    _tensor("k", "batch*heads_kv*seq_kv*head_dim",
            lambda f: (f.batch, f.kv_heads, f.seq_kv, f.head_dim)),
    _tensor("v", "batch*heads_kv*seq_kv*head_dim_v",
            lambda f: (f.batch, f.kv_heads, f.seq_kv, f.head_dim_v)),
    _tensor("out", "batch*heads_q*seq_q*head_dim_v",
            lambda f: (f.batch, f.heads_q, f.seq_q, f.head_dim_v)),
    Limit("bias elements", "the bias's batch*heads*seq_q*seq_kv", "elements of bias",
          "cuDNN's int64 tensor dimensions and strides", INT64_MAX, _bias_elements,
          "cudnn_graph.h: CUDNN_ATTR_TENSOR_DIMENSIONS and _STRIDES are CUDNN_TYPE_INT64"),
    size.workspace_limit(lambda f: f.workspace,
                         "cudnn-frontend sizes dQ_accum and softmax_sum as int64 bytes; sdpa.py's "
                         "estimate without a GPU"),
)


def check(facts: Facts, ctx: Context) -> Unfit | None:
    """The first rule that rejects ``facts`` on ``ctx``, then the first size limit they exceed,
    as an Unfit, or None."""
    if facts.element not in ELEMENTS:
        return Unfit(ReasonCode.element_unsupported,
                     f"cuDNN SDPA serves {', '.join(e.value for e in ELEMENTS)}, problem is "
                     f"{facts.element.value}")
    for rule in RULES:
        if rule.rejects(facts, ctx):
            return Unfit(rule.code, rule.why(facts, ctx))
    return size.check(SIZE_LIMITS, facts)
