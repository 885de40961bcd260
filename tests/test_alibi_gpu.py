"""ALiBi on a real GPU: every SKU against the float64 reference within its declared bound,
determinism bitwise (fresh workspaces and streams), interop with torch/CuPy/JAX, bad input."""

from __future__ import annotations

import os

import numpy as np
import pytest

from opfacade import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiBackwardPlan,
    AlibiForwardPlan,
    BufferTooSmall,
    DeviceMismatch,
    LayoutMismatch,
    Plan,
    PlanPreference,
    Workspace,
    alibi_backward,
    alibi_forward,
)
from opfacade._backends.nvrtc.alibi import SKUS as ALIBI_SKUS
from opfacade._backends.reference.alibi import alibi_backward as ref_backward
from opfacade._backends.reference.alibi import alibi_forward as ref_forward
from opfacade._internal.tensors import TensorView
from opfacade.testing import relative_error, verify_plan

FORWARD_SKUS, BACKWARD_SKUS = ALIBI_SKUS["alibi_forward"], ALIBI_SKUS["alibi_backward"]

pytestmark = pytest.mark.gpu


def _cases():
    for impl in (*FORWARD_SKUS, *BACKWARD_SKUS):
        op = AlibiForwardPlan.op if impl.sku.op == "alibi_forward" else AlibiBackwardPlan.op
        for desc in op.sample_problems(impl.sku.element):
            yield pytest.param(impl.sku.id, desc, id=f"{impl.sku.id}-{desc.shape}-"
                               f"{'-'.join(str(v) for v in desc.model_dump().values())}")


@pytest.mark.parametrize("sku,desc", list(_cases()))
def test_sku_meets_its_guarantee(sku, desc):
    plan = Plan.select(desc, PlanPreference(sku=sku), device=0)
    result = verify_plan(plan, runs=3)
    assert result.passed, result.summary()
    assert all(err < 1.0 for err in result.rel_errors.values())  # poison never survives


@pytest.mark.parametrize("element", ["f32", "bf16", "f16", "f64"])
def test_dslope_bitwise_repeatable_and_independent_of_alignment(element):
    """Same bits over runs with different workspaces and streams, and whether the 16-byte or
    the element-by-element path loads the rows (bit-stable: order fixed by the shape alone)."""
    import cupy

    desc = AlibiBackwardDescriptor(batch=3, heads=8, query_len=300, key_len=520, element=element,
                                   need_input_grad=False)
    plan = Plan.select(desc, device=0)
    itemsize = desc.element.itemsize
    storage = {"f32": cupy.float32, "f64": cupy.float64, "f16": cupy.float16,
               "bf16": cupy.uint16}[element]
    rng = np.random.default_rng(7)
    n = int(np.prod(desc.shape))
    host = rng.uniform(-1, 1, n + 1).astype(np.float32)
    buf = cupy.asarray(host.astype(np.float16) if element == "f16" else host).astype(storage) \
        if element != "bf16" else cupy.asarray((host.view(np.uint32) >> 16).astype(np.uint16))
    strides = (desc.heads * 300 * 520, 300 * 520, 520, 1)
    results = []
    for run, offset in enumerate([0, 0, 1, 1, 0]):  # offset 1 element: not 16-byte aligned
        dy = TensorView(buf.data.ptr + offset * itemsize, desc.shape, strides, desc.element, 0,
                        "cupy", buf)
        contents = buf[offset:offset + n].copy()
        aligned = TensorView(contents.data.ptr, desc.shape, strides, desc.element, 0, "cupy",
                             contents)
        src = dy if run % 2 == 0 else aligned  # same values, different addresses and paths
        out = cupy.full((desc.heads,), np.nan, dtype=np.float64 if element == "f64" else
                        np.float32)
        pool = cupy.empty(plan.workspace_size + 4096, dtype=cupy.uint8)
        ws = Workspace(-(-pool.data.ptr // 256) * 256 + 256 * run, plan.workspace_size, 0, pool)
        cupy.cuda.runtime.deviceSynchronize()  # the copies above ran on the legacy stream
        stream = cupy.cuda.Stream(non_blocking=True)
        plan.run(AlibiBackwardArgs(src, None, out), workspace=ws, stream=stream)
        stream.synchronize()
        results.append((offset, out.get().tobytes()))
    by_offset = {}
    for offset, bits in results:
        by_offset.setdefault(offset, set()).add(bits)
    assert all(len(bits) == 1 for bits in by_offset.values()), "not bitwise repeatable"
    # Offsets 0 and 1 hold different data, so compare paths on equal data: runs 0 (vector) and
    # 1 (copy of the same data at an aligned address) must agree; so must 2 (scalar) and 3.
    assert results[0][1] == results[1][1] and results[2][1] == results[3][1]


def test_torch_tensors_streams_and_functional_forms():
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand((2, 4, 33, 65), device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1
    slopes = torch.rand(4, device="cuda", generator=gen)
    before = a.clone()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # None: torch's current stream, here the side stream
        y = alibi_forward(a, slopes)
    side.synchronize()
    assert torch.equal(a, before)  # out of place leaves the input alone
    expected = ref_forward(a.double().cpu().numpy(), slopes.double().cpu().numpy())
    assert relative_error(y.double().cpu().numpy(), expected) < 8e-3
    d_in, d_slopes = alibi_backward(a, stream=side)
    side.synchronize()
    assert torch.equal(d_in, a)
    _, ref_slopes = ref_backward(a.double().cpu().numpy())
    assert relative_error(d_slopes.double().cpu().numpy(), ref_slopes) < 1e-5
    in_place = a.clone()
    assert alibi_forward(in_place, slopes, in_place=True) is in_place
    torch.cuda.synchronize()
    assert torch.equal(in_place, y)


def test_strided_rows_are_served_and_transposed_rows_are_named():
    torch = pytest.importorskip("torch")
    padded = torch.randn((2, 3, 17, 40), device="cuda")
    a = padded[..., :29]  # rows padded to 40 elements: unit stride along K only
    slopes = torch.rand(3, device="cuda")
    y = alibi_forward(a, slopes)
    torch.cuda.synchronize()
    expected = ref_forward(a.double().cpu().numpy(), slopes.double().cpu().numpy())
    assert relative_error(y.double().cpu().numpy(), expected) < 1e-6
    with pytest.raises(LayoutMismatch, match="input must have unit stride"):
        alibi_forward(a.transpose(2, 3), slopes)


def test_cupy_and_jax_arrays():
    import cupy

    a = cupy.random.uniform(-1, 1, (2, 2, 9, 11)).astype(cupy.float32)
    s = cupy.random.uniform(0, 1, 2).astype(cupy.float32)
    y = alibi_forward(a, s)
    cupy.cuda.get_current_stream().synchronize()
    assert relative_error(y.get(), ref_forward(a.get(), s.get())) < 1e-6
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jnp = pytest.importorskip("jax.numpy")
    ja, js = jnp.asarray(a.get()), jnp.asarray(s.get())
    ja.block_until_ready()
    jy = alibi_forward(ja, js)  # JAX arrays are read-only: the output is allocated for them
    cupy.cuda.runtime.deviceSynchronize()
    assert relative_error(cupy.asnumpy(cupy.asarray(jy)), ref_forward(a.get(), s.get())) < 1e-6


def test_bad_input_on_the_gpu_is_typed_and_named():
    import cupy

    desc = AlibiBackwardDescriptor(batch=2, heads=4, query_len=16, key_len=16, element="f32")
    plan = Plan.select(desc, device=0)
    dy = cupy.ones(desc.shape, dtype=cupy.float32)
    d_in, d_s = cupy.empty_like(dy), cupy.empty(4, dtype=cupy.float32)
    args = AlibiBackwardArgs(dy, d_in, d_s)
    with pytest.raises(BufferTooSmall, match="workspace has 8 bytes"):
        plan.run(args, workspace=cupy.empty(8, dtype=cupy.uint8))
    big = cupy.empty(plan.workspace_size + 512, dtype=cupy.uint8)
    with pytest.raises(LayoutMismatch, match="workspace must be 256-byte aligned"):
        plan.run(args, workspace=big[4:])
    with pytest.raises(DeviceMismatch, match="workspace is in host memory"):
        plan.run(args, workspace=np.empty(plan.workspace_size, np.uint8))
    misaligned = TensorView(dy.data.ptr + 2, desc.shape, (1024, 256, 16, 1),
                            desc.element, 0, "cupy", dy)
    with pytest.raises(LayoutMismatch, match="grad_output"):
        plan.run(AlibiBackwardArgs(misaligned, d_in, d_s))
    with pytest.raises(DeviceMismatch, match="grad_slopes is in host memory"):
        plan.run(AlibiBackwardArgs(dy, d_in, np.empty(4, np.float32)))
    if cupy.cuda.runtime.getDeviceCount() > 1:
        with cupy.cuda.Device(1):
            elsewhere = cupy.empty(4, dtype=cupy.float32)
        with pytest.raises(DeviceMismatch, match="grad_slopes is on cuda:1"):
            plan.run(AlibiBackwardArgs(dy, d_in, elsewhere))
    plan.free()
    with pytest.raises(Exception, match="freed"):
        plan.run(args)


def test_workspace_size_is_exact_and_enough():
    """A workspace of exactly workspace_size bytes, surrounded by guard bytes that must survive."""
    import cupy

    desc = AlibiBackwardDescriptor(batch=2, heads=5, query_len=100, key_len=300, element="f16")
    plan = Plan.select(desc, device=0)
    guard = 4096
    pool = cupy.full(plan.workspace_size + 2 * guard, 0xA5, dtype=cupy.uint8)
    ws = Workspace(pool.data.ptr + guard, plan.workspace_size, 0, pool)
    dy = cupy.random.uniform(-1, 1, desc.shape).astype(cupy.float16)
    d_s = cupy.empty(5, dtype=cupy.float32)
    plan.run(AlibiBackwardArgs(dy, cupy.empty_like(dy), d_s), workspace=ws)
    cupy.cuda.runtime.deviceSynchronize()
    host = pool.get()
    assert (host[:guard] == 0xA5).all() and (host[guard + plan.workspace_size:] == 0xA5).all()
    _, ref = ref_backward(dy.get())
    assert relative_error(d_s.get(), ref) < 1e-5


def test_repeat_runs_on_the_callers_own_tensors():
    import cupy

    from opfacade.testing import repeat_runs

    desc = AlibiBackwardDescriptor(batch=4, heads=16, query_len=256, key_len=384, element="f32")
    dy = cupy.random.uniform(-1, 1, desc.shape).astype(cupy.float32)
    args = AlibiBackwardArgs(dy, cupy.empty_like(dy), cupy.empty(16, dtype=cupy.float32))
    result = repeat_runs(Plan.select(desc, device=0), args, runs=4)
    assert result.bitwise_equal and result.differing_outputs == [] and result.runs == 4
