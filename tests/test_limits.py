"""Each GPU SKU's index-width and size limits: data checked at selection, shown by explain.

Every row of every SKU's limit table is tried at its edge: a problem just inside is viable when
selected for sm90, one just outside is rejected with ``shape_unsupported`` and a reason naming
the quantity, what bounds it and both values. The edges are worked out here from the kernels
(``native/*.cu``) and the library headers, not read back from the tables. Problems no GPU could
run (ALiBi with batch 2**100, attention at 2**31 - 1 per extent) are rejected by every GPU SKU,
and explain over any descriptor up to its own maxima never raises and never asks for a workspace
of 2**48 bytes or more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opfacade import NoKernelSku, Plan
from opfacade._backends.cublaslt import backward as cublaslt_backward
from opfacade._backends.cublaslt import common as cublaslt_common
from opfacade._backends.cublaslt.forward import (
    LinearForwardCublasLt,
    LinearForwardCublasLtActPass,
)
from opfacade._backends.cudnn import limits as cudnn_limits
from opfacade._backends.nvrtc import alibi as nvrtc_alibi
from opfacade._internal.limits import INT32_MAX, INT64_MAX, Limit, number
from opfacade._internal.sku import ReasonCode
from opfacade._registry import all_ops
from opfacade.contracts.alibi import MAX_LENGTH, AlibiBackwardDescriptor, AlibiForwardDescriptor
from opfacade.contracts.linear import ACTIVATIONS, LinearBackwardDescriptor, LinearDescriptor
from opfacade.contracts.sdpa import SdpaBackwardDescriptor, SdpaDescriptor
from opfacade.errors import InvalidProblem
from opfacade.types import BackendKind

# 2**63 - 1 = 7**2 * 73 * 127 * 337 * 92737 * 649657: three int32 factors whose product is
# exactly INT64_MAX, so "just inside" an element limit is the limit itself.
F1, F2, F3 = 7 * 7 * 73 * 127, 337 * 92737, 649657
assert F1 * F2 * F3 == INT64_MAX


@pytest.fixture(autouse=True)
def _select_for_arch_alone(monkeypatch):
    """Selection for an arch without a GPU: with one visible, the linear SKUs would ask
    cuBLASLt's heuristic, whose verdict on these sizes is the library's, not these tables'."""
    monkeypatch.setattr(cublaslt_common, "device_count", lambda: 0)


def _limit(table: tuple[Limit, ...], name: str) -> Limit:
    return next(limit for limit in table if limit.name == name)


ALIBI_FORWARD = nvrtc_alibi.FORWARD_LIMITS
ALIBI_BACKWARD = nvrtc_alibi.BACKWARD_LIMITS
LINEAR_FORWARD = LinearForwardCublasLt.limits
LINEAR_ACT_FORWARD = LinearForwardCublasLtActPass.limits
LINEAR_BACKWARD = cublaslt_backward.LIMITS
SDPA = cudnn_limits.SIZE_LIMITS
TABLES = {"alibi forward": ALIBI_FORWARD, "alibi backward": ALIBI_BACKWARD,
          "linear forward": LINEAR_FORWARD, "linear forward +act": LINEAR_ACT_FORWARD,
          "linear backward": LINEAR_BACKWARD, "cudnn sdpa": SDPA}


@dataclass(frozen=True)
class Edge:
    """``make(inside)`` is just inside ``table``'s limit ``name`` for ``sku``, ``make(outside)``
    just past it."""

    table: str
    name: str
    sku: str
    make: Callable[[int], object]
    inside: int
    outside: int

    @property
    def limit(self) -> Limit:
        return _limit(TABLES[self.table], self.name)

    def __str__(self) -> str:
        return f"{self.sku}:{self.name}"


def _alibi_fwd(element: str = "f16", **kw) -> Callable[[int], AlibiForwardDescriptor]:
    field = next(k for k, v in kw.items() if v is None)
    base = {"batch": 1, "heads": 1, "query_len": 1, "key_len": 1, **kw}
    return lambda value: AlibiForwardDescriptor(**{**base, field: value}, element=element)


def _alibi_bwd(element: str = "f32", **kw) -> Callable[[int], AlibiBackwardDescriptor]:
    field = next(k for k, v in kw.items() if v is None)
    base = {"batch": 1, "heads": 1, "query_len": 1, "key_len": 1, **kw}
    return lambda value: AlibiBackwardDescriptor(**{**base, field: value}, element=element)


def _linear(cls, **kw) -> Callable[[int], object]:
    field = next(k for k, v in kw.items() if v is None)
    base = {"m": 1, "n": 8, "k": 8, "element": "f16", **kw}
    return lambda value: cls(**{**base, field: value})


def _sdpa(cls, **kw) -> Callable[[int], object]:
    field = next(k for k, v in kw.items() if v is None)
    base = {"batch": 1, "heads_q": 1, "heads_kv": 1, "seq_q": 64, "seq_kv": 64,
            "head_dim": 128, "element": "f16", **kw}
    return lambda value: cls(**{**base, field: value})


# A backward block sums 8 rows (one per warp) once a row is 256 KiB or more: f32 rows of 2**23.
_WIDE = 1 << 23
# The forward steps its i64 row by the grid's warps, 16384 blocks * 8 warps = 2**17.
_FORWARD_ROWS = INT64_MAX - (1 << 17) + 1
# The dslope workspace of 65535 heads in f32, one partial per (head, chunk); with one-column rows
# a chunk is 256 KiB / 4 B = 65536 rows, so batch 65536 * c gives c chunks. Rounded up to 256 B,
# it stays below 2**48 while 262140 * c <= 2**48 - 256.
_SLOPE_CHUNKS = (2**48 - 256) // (65535 * 4)
# The sdpa backward's workspace (sm90 estimate): rowsum and the f32 dQ accumulator, (1 + D) * 4
# bytes per query row; with D = 8 and 4096 query rows per batch entry, below 2**48 - 256 while
# batch <= this.
_SDPA_BATCH = (2**48 - 256) // (36 * 4096)
# The linear backward's workspace: a bf16/f16 d_pre of 2**16 columns is 2**17 bytes a row, after
# which the GEMMs' default 32 MiB: below 2**48 while rows <= 2**31 - 2**8 - 1.
_D_PRE_ROWS = 2**31 - 2**8 - 1

EDGES = [
    # ALiBi forward (native/alibi.cu alibi_forward)
    Edge("alibi forward", "heads", "alibi_forward.nvrtc.f16", _alibi_fwd(heads=None),
         INT32_MAX, INT32_MAX + 1),
    Edge("alibi forward", "rows", "alibi_forward.nvrtc.f16", _alibi_fwd(batch=None),
         _FORWARD_ROWS, _FORWARD_ROWS + 1),
    Edge("alibi forward", "elements", "alibi_forward.nvrtc.bf16",
         _alibi_fwd("bf16", batch=None, key_len=7), INT64_MAX // 7, INT64_MAX // 7 + 1),
    # ALiBi backward (alibi_backward_partials on (chunks, heads) blocks, then the finalize)
    Edge("alibi backward", "heads", "alibi_backward.nvrtc.f16",
         _alibi_bwd("f16", heads=None), 65535, 65536),
    Edge("alibi backward", "elements", "alibi_backward.nvrtc.f32",
         _alibi_bwd(batch=None, heads=128, key_len=_WIDE), 2**33 - 1, 2**33),
    Edge("alibi backward", "chunks", "alibi_backward.nvrtc.f32",
         _alibi_bwd(batch=None, key_len=_WIDE, need_slope_grad=False),
         8 * INT32_MAX, 8 * INT32_MAX + 1),
    Edge("alibi backward", "finalize chunks", "alibi_backward.nvrtc.f32",
         _alibi_bwd(batch=None, key_len=_WIDE), 8 * (2**31 - 256), 8 * (2**31 - 256) + 1),
    Edge("alibi backward", "workspace", "alibi_backward.nvrtc.f32",
         _alibi_bwd(batch=None, heads=65535), 65536 * _SLOPE_CHUNKS,
         65536 * (_SLOPE_CHUNKS + 1)),
    # linear forward: cuBLASLt operands
    Edge("linear forward", "x elements", "linear_forward.cublaslt.f16",
         _linear(LinearDescriptor, batch=F1, m=None, k=F3, n=1), F2, F2 + 1),
    Edge("linear forward", "weight elements", "linear_forward.cublaslt.f16.deterministic",
         _linear(LinearDescriptor, batch=F1, weight_batched=True, n=None, k=F3), F2, F2 + 1),
    Edge("linear forward", "out elements", "linear_forward.cublaslt.bf16",
         _linear(LinearDescriptor, element="bf16", batch=F1, m=F2, n=None, k=1), F3, F3 + 1),
    # a saved GELU aux pads one column to 8: 8 * (2**30 - 1) * (2**30 + 1) = 2**63 - 8
    Edge("linear forward", "aux elements", "linear_forward.cublaslt.f16",
         _linear(LinearDescriptor, batch=2**30 - 1, m=None, n=1, k=1, activation="gelu_tanh",
                 save_aux=True), 2**30 + 1, 2**30 + 2),
    # linear forward +act: the NVRTC pass's int column index reaches n rounded up to 16 bytes
    Edge("linear forward +act", "activation columns", "linear_forward.cublaslt+act.f16",
         _linear(LinearDescriptor, n=None, k=1, activation="gelu_erf"), 2**31 - 8, 2**31 - 7),
    Edge("linear forward +act", "activation columns", "linear_forward.cublaslt+act.tf32",
         _linear(LinearDescriptor, element="f32", tf32=True, n=None, k=1, activation="silu"),
         2**31 - 4, 2**31 - 3),
    Edge("linear forward +act", "out elements", "linear_forward.cublaslt+act.f16",
         _linear(LinearDescriptor, batch=F1, m=F2, n=None, k=1, activation="silu"), F3, F3 + 1),
    Edge("linear forward +act", "x elements", "linear_forward.cublaslt+act.bf16",
         _linear(LinearDescriptor, element="bf16", batch=F1, m=None, k=F3, n=1,
                 activation="gelu_erf"), F2, F2 + 1),
    Edge("linear forward +act", "weight elements", "linear_forward.cublaslt+act.f16",
         _linear(LinearDescriptor, batch=F1, weight_batched=True, n=None, k=F3,
                 activation="silu"), F2, F2 + 1),
    Edge("linear forward +act", "aux elements", "linear_forward.cublaslt+act.f16.deterministic",
         _linear(LinearDescriptor, batch=2**30 - 1, m=None, n=1, k=1, activation="gelu_erf",
                 save_aux=True), 2**30 + 1, 2**30 + 2),
    # linear backward
    Edge("linear backward", "grad_out elements", "linear_backward.cublaslt.f16",
         _linear(LinearBackwardDescriptor, batch=F1, m=F2, n=None, k=1, need_weight_grad=False,
                 need_bias_grad=False), F3, F3 + 1),
    Edge("linear backward", "x elements", "linear_backward.cublaslt.f16.deterministic",
         _linear(LinearBackwardDescriptor, batch=F1, m=None, n=1, k=F3, need_weight_grad=False,
                 need_bias_grad=False), F2, F2 + 1),
    Edge("linear backward", "weight elements", "linear_backward.cublaslt.bf16",
         _linear(LinearBackwardDescriptor, element="bf16", batch=F1, weight_batched=True,
                 n=None, k=F3, need_bias_grad=False), F2, F2 + 1),
    # dW of a weight the batch shares is one GEMM over batch*m rows: 7 * 306783378 < 2**31
    Edge("linear backward", "summed rows", "linear_backward.cublaslt.f16",
         _linear(LinearBackwardDescriptor, batch=7, m=None, need_bias_grad=False),
         306783378, 306783379),
    # so is the dbias GEMM, even when each batch entry has its own weight
    Edge("linear backward", "summed rows", "linear_backward.cublaslt.f16.deterministic",
         _linear(LinearBackwardDescriptor, batch=7, m=None, weight_batched=True),
         306783378, 306783379),
    Edge("linear backward", "d_pre columns", "linear_backward.cublaslt.f16",
         _linear(LinearBackwardDescriptor, n=None, activation="gelu_tanh"), 2**31 - 8,
         2**31 - 7),
    Edge("linear backward", "d_pre columns", "linear_backward.cublaslt.f32",
         _linear(LinearBackwardDescriptor, element="f32", n=None, activation="relu",
                 need_bias_grad=False), 2**31 - 4, 2**31 - 3),
    # one column tile gives 2048 chunks, of batch*m / 2048 = m rows rounded up to whole warps
    Edge("linear backward", "rows per chunk", "linear_backward.cublaslt.f16",
         _linear(LinearBackwardDescriptor, batch=2048, weight_batched=True, m=None,
                 activation="gelu_tanh", need_pre_grad=True, need_bias_grad=False),
         2**31 - 8, 2**31 - 7),
    Edge("linear backward", "workspace", "linear_backward.cublaslt.f16",
         _linear(LinearBackwardDescriptor, m=None, n=2**16, activation="gelu_tanh",
                 need_bias_grad=False), _D_PRE_ROWS, _D_PRE_ROWS + 1),
    # cuDNN sdpa: (2**28 - 1) * (2**28 + 1) * 128 = 2**63 - 128
    Edge("cudnn sdpa", "q elements", "sdpa_forward.cudnn.f16",
         _sdpa(SdpaDescriptor, batch=2**28 - 1, seq_q=None), 2**28 + 1, 2**28 + 2),
    Edge("cudnn sdpa", "k elements", "sdpa_backward.cudnn.bf16",
         _sdpa(SdpaBackwardDescriptor, element="bf16", batch=2**28 - 1, seq_q=1, seq_kv=None),
         2**28 + 1, 2**28 + 2),
    Edge("cudnn sdpa", "v elements", "sdpa_forward.cudnn.f16",
         _sdpa(SdpaDescriptor, batch=2**28 - 1, seq_q=1, seq_kv=None, head_dim=8,
               head_dim_v=128), 2**28 + 1, 2**28 + 2),
    Edge("cudnn sdpa", "out elements", "sdpa_forward.cudnn.bf16",
         _sdpa(SdpaDescriptor, element="bf16", batch=2**28 - 1, seq_q=None, seq_kv=1,
               head_dim=8, head_dim_v=128), 2**28 + 1, 2**28 + 2),
    # (2**56 - 1) * 128 = 2**63 - 128 elements of bias
    Edge("cudnn sdpa", "bias elements", "sdpa_forward.cudnn.f16",
         _sdpa(SdpaDescriptor, heads_q=2**28 - 1, seq_q=2**28 + 1, seq_kv=None, head_dim=8,
               bias="bhqk"), 128, 129),
    Edge("cudnn sdpa", "workspace", "sdpa_backward.cudnn.f16",
         _sdpa(SdpaBackwardDescriptor, batch=None, seq_q=4096, head_dim=8), _SDPA_BATCH,
         _SDPA_BATCH + 1),
    # the deterministic backward keeps dP: 2 bytes per (query, key) pair padded to 64, plus
    # rowsum: 2**20 * (2**27 - 64) * 2 + 2**22 fits, a key more rounds up to 2**48 + 2**22
    Edge("cudnn sdpa", "workspace", "sdpa_backward.cudnn.f16.deterministic",
         _sdpa(SdpaBackwardDescriptor, seq_q=2**20, seq_kv=None, head_dim=8), 2**27 - 64,
         2**27 - 63),
]


def _verdict(desc, sku_id: str):
    report = Plan.explain(desc, arch="sm90")
    return next(v for v in report.verdicts if v.sku.id == sku_id)


@pytest.mark.parametrize("edge", EDGES, ids=str)
def test_just_inside_a_limit_is_viable_and_just_outside_is_rejected_naming_it(edge):
    inside = _verdict(edge.make(edge.inside), edge.sku)
    assert inside.viable, inside.detail
    assert inside.workspace_size < 2**48
    outside = _verdict(edge.make(edge.outside), edge.sku)
    limit = edge.limit
    assert outside.code is ReasonCode.shape_unsupported, outside.detail
    assert outside.detail.startswith(f"{limit.quantity} = "), outside.detail
    assert f" {limit.unit} exceeds {limit.bound} (" in outside.detail
    assert outside.workspace_size is None


def test_every_row_of_every_table_is_tried_at_its_edge():
    tried = {(edge.table, edge.name) for edge in EDGES}
    rows = {(table, limit.name) for table, limits in TABLES.items() for limit in limits}
    assert rows - tried == set()


def test_every_nvrtc_and_cublaslt_sku_carries_its_table():
    """(cuDNN's SKUs check the library's SIZE_LIMITS, stated on the graph's facts.)"""
    for op in all_ops():
        for impl in op.skus:
            if impl.sku.backend in (BackendKind.nvrtc, BackendKind.cublaslt):
                assert impl.limits, impl.sku.id


def test_reason_text_names_both_values_readably():
    rows = _limit(ALIBI_FORWARD, "rows")
    assert rows.reason(2**100 * 8 * 128) == ("batch*heads*query_len = 1.3e33 rows exceeds the "
                                             "kernel's int64 row index (9.2e18)")
    heads = _limit(ALIBI_BACKWARD, "heads")
    assert heads.reason(65536) == ("heads = 65536 heads exceeds the grid's y extent (one block "
                                   "row per head) (65535)")
    # Two values that round alike are printed in full.
    elements = _limit(ALIBI_FORWARD, "elements")
    assert elements.reason(INT64_MAX + 1).endswith(f"= {INT64_MAX + 1} elements of each score "
                                                   f"tensor exceeds the kernel's int64 element "
                                                   f"offsets ({INT64_MAX})")
    assert number(10**400) == "1.0e400"  # no float conversion: any int prints


# -- impossible problems --------------------------------------------------------------------


def _gpu_verdicts(report):
    return [v for v in report.verdicts if v.sku.backend is not BackendKind.reference]


def _rejected_everywhere(desc) -> list:
    """Every GPU SKU rejects ``desc`` for sm90; the ones serving its element for its size.
    Selection says so with NoKernelSku, nothing else."""
    report = Plan.explain(desc, arch="sm90")
    gpu = _gpu_verdicts(report)
    assert gpu and not any(v.viable for v in gpu), report.table()
    assert all(v.workspace_size is None for v in gpu)
    own = [v for v in gpu if v.code is not ReasonCode.element_unsupported]
    assert own, report.table()
    with pytest.raises(NoKernelSku):
        Plan.select(desc, arch="sm90")
    return own


@pytest.mark.parametrize("element", ["f64", "f32", "f16", "bf16"])
def test_alibi_with_batch_2_to_the_100_is_rejected_by_every_gpu_sku(element):
    forward = AlibiForwardDescriptor(batch=2**100, heads=8, query_len=128, key_len=128,
                                     element=element)
    (own,) = _rejected_everywhere(forward)
    assert own.code is ReasonCode.shape_unsupported
    assert own.detail == ("batch*heads*query_len = 1.3e33 rows exceeds the kernel's int64 row "
                          "index (9.2e18)")
    backward = AlibiBackwardDescriptor(batch=2**100, heads=8, query_len=128, key_len=128,
                                       element=element)
    (own,) = _rejected_everywhere(backward)
    assert own.code is ReasonCode.shape_unsupported
    assert own.detail.startswith("batch*heads*query_len*key_len = 1.7e35 elements")


@pytest.mark.parametrize("head_dim", [128, INT32_MAX])
@pytest.mark.parametrize("element", ["f16", "bf16"])
@pytest.mark.parametrize("cls", [SdpaDescriptor, SdpaBackwardDescriptor])
def test_sdpa_at_2_to_the_31_minus_1_per_extent_is_rejected_by_every_gpu_sku(cls, element,
                                                                              head_dim):
    desc = cls(batch=INT32_MAX, heads_q=INT32_MAX, heads_kv=INT32_MAX, seq_q=INT32_MAX,
               seq_kv=INT32_MAX, head_dim=head_dim, element=element)
    own = _rejected_everywhere(desc)
    assert {v.code for v in own} == {ReasonCode.shape_unsupported}
    if head_dim == 128:  # the size limits speak (with 2**31 - 1 the head dim rules do first)
        assert all(v.detail.startswith("batch*heads_q*seq_q*head_dim = 1.3e30 elements of q")
                   for v in own), [v.detail for v in own]


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("cls", [LinearDescriptor, LinearBackwardDescriptor])
def test_linear_at_2_to_the_31_minus_1_per_extent_is_rejected_by_every_gpu_sku(cls, activation):
    desc = cls(m=INT32_MAX, n=INT32_MAX, k=INT32_MAX, batch=INT32_MAX, element="bf16",
               activation=activation)
    own = _rejected_everywhere(desc)
    assert {v.code for v in own} <= {ReasonCode.shape_unsupported,
                                     ReasonCode.feature_unsupported}
    assert any(v.code is ReasonCode.shape_unsupported for v in own)


def test_sdpa_backward_whose_tensors_fit_but_whose_workspace_cannot_is_refused():
    """2**51 query rows of 128: q fits an int64, the dQ accumulator (4 bytes per element) no
    device."""
    desc = SdpaBackwardDescriptor(batch=INT32_MAX, heads_q=1, heads_kv=1, seq_q=2**20,
                                  seq_kv=64, head_dim=128, element="bf16")
    own = _rejected_everywhere(desc)
    assert len(own) == 2 and all(v.detail.startswith("the workspace = ") and
                                 "bytes exceeds the 48-bit address space" in v.detail
                                 for v in own), [v.detail for v in own]


# -- explain over every descriptor up to its maxima -----------------------------------------

_ALIBI_UNBOUNDED = 2**100  # batch and heads have no maximum of their own


_EDGES = (1, 8, 64, 65535, 2**16, 2**20, 2**24 - 1, 2**24, 2**31 - 1, 2**32, 2**34, 2**46,
          2**47, 2**62)


def _extent(maximum: int):
    """Small, anywhere, right at the top, and near the edges of the limits."""
    near = st.sampled_from([v for v in _EDGES if v <= maximum]).flatmap(
        lambda v: st.integers(max(1, v - 2), min(maximum, v + 2)))
    return st.one_of(st.integers(1, 64), st.integers(1, maximum),
                     st.integers(max(1, maximum - 64), maximum), near)


def _mostly(value, *others):
    """``value`` three times in four, else one of ``others``."""
    return st.one_of(st.just(value), st.just(value), st.just(value), st.sampled_from(others))


@st.composite
def alibi_descriptors(draw):
    fields = dict(batch=draw(_extent(_ALIBI_UNBOUNDED)), heads=draw(_extent(_ALIBI_UNBOUNDED)),
                  query_len=draw(_extent(MAX_LENGTH - 1)), key_len=draw(_extent(MAX_LENGTH - 1)),
                  element=draw(st.sampled_from(["f64", "f32", "f16", "bf16"])))
    if draw(st.booleans()):
        return AlibiForwardDescriptor(**fields, in_place=draw(st.booleans()))
    d_in, d_slopes = draw(st.sampled_from([(True, True), (True, False), (False, True)]))
    return AlibiBackwardDescriptor(**fields, need_input_grad=d_in, need_slope_grad=d_slopes)


@st.composite
def linear_descriptors(draw):
    activation = draw(st.sampled_from(list(ACTIVATIONS)))
    spec = ACTIVATIONS[activation]
    batch = draw(st.none() | _extent(INT32_MAX))
    element, tf32 = draw(st.sampled_from([("f32", False), ("f32", True), ("f16", False),
                                          ("bf16", False), ("f64", False)]))
    fields = dict(m=draw(_extent(INT32_MAX)), n=draw(_extent(INT32_MAX)),
                  k=draw(_extent(INT32_MAX)), batch=batch,
                  weight_layout=draw(st.sampled_from(["kn", "nk"])),
                  weight_batched=batch is not None and draw(st.booleans()), element=element,
                  tf32=tf32, activation=activation)
    if draw(st.booleans()):
        return LinearDescriptor(**fields, bias=draw(st.booleans()),
                                residual=draw(st.booleans()),
                                save_aux=spec.aux is not None and draw(st.booleans()))
    flags = draw(st.fixed_dictionaries({name: st.booleans() for name in (
        "need_input_grad", "need_weight_grad", "need_bias_grad", "need_pre_grad")}))
    flags["need_pre_grad"] &= spec.d_pre is not None
    assume(any(flags.values()))
    return LinearBackwardDescriptor(**fields, **flags)


@st.composite
def sdpa_descriptors(draw):
    heads_kv = draw(_extent(INT32_MAX))
    group = draw(_extent(INT32_MAX // heads_kv))
    # Mostly what cuDNN serves, so that the size limits are what decides.
    head_dim = draw(st.sampled_from([8, 64, 128, 256, 8, 64, 128, 256]) | _extent(INT32_MAX))
    window = None
    if draw(_mostly(False, True)):
        window = (draw(st.none() | _extent(INT32_MAX)), draw(_extent(INT32_MAX)))
    bias = draw(_mostly(None, "bhqk", "1hqk", "b1qk", "11qk"))
    head_dim_v = draw(_extent(INT32_MAX)) if draw(_mostly(False, True)) else None
    fields = dict(batch=draw(_extent(INT32_MAX)), heads_q=heads_kv * group, heads_kv=heads_kv,
                  seq_q=draw(_extent(INT32_MAX)), seq_kv=draw(_extent(INT32_MAX)),
                  head_dim=head_dim, head_dim_v=head_dim_v,
                  element=draw(st.sampled_from(["f16", "bf16", "f16", "bf16", "f32", "f64"])),
                  layout=draw(st.sampled_from(["bhsd", "bshd", "sbhd"])),
                  causal=draw(st.sampled_from([None, "top_left", "bottom_right"])),
                  window=window, bias=bias, alibi=draw(_mostly(False, True)),
                  dropout_p=draw(st.sampled_from([0.0, 0.1])), padding=draw(st.booleans()))
    try:
        if draw(st.booleans()):
            return SdpaDescriptor(**fields, save_stats=draw(st.booleans()))
        return SdpaBackwardDescriptor(
            **fields, need_bias_grad=bias is not None and draw(st.booleans()))
    except InvalidProblem:
        assume(False)


_PREFERENCES = st.sampled_from([None, {"deterministic": True}, {"objective": "memory"}])


def _explain_and_select(desc, pref) -> None:
    report = Plan.explain(desc, pref, arch="sm90")
    for v in report.verdicts:
        assert v.workspace_size is None or 0 <= v.workspace_size < 2**48, \
            (v.sku.id, v.workspace_size, desc)
    try:
        plan = Plan.select(desc, pref, arch="sm90")
    except NoKernelSku:
        return
    assert plan.workspace_size < 2**48


_PROPERTY = settings(max_examples=200, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@_PROPERTY
@given(desc=alibi_descriptors(), pref=_PREFERENCES)
def test_explain_of_any_alibi_problem_never_raises_nor_asks_2_to_the_48_bytes(desc, pref):
    _explain_and_select(desc, pref)


@_PROPERTY
@given(desc=linear_descriptors(), pref=_PREFERENCES)
def test_explain_of_any_linear_problem_never_raises_nor_asks_2_to_the_48_bytes(desc, pref):
    _explain_and_select(desc, pref)


@_PROPERTY
@given(desc=sdpa_descriptors(), pref=_PREFERENCES)
def test_explain_of_any_sdpa_problem_never_raises_nor_asks_2_to_the_48_bytes(desc, pref):
    _explain_and_select(desc, pref)
