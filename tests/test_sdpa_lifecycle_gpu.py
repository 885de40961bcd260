"""SDPA on a real GPU, lifecycle: the graph built at selection with an exact workspace, both
execute paths bitwise equal, one plan from several threads, a training pair in one workspace,
what free() and clear_caches() release, bad input typed and named, and torch/CuPy interop.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from sdpa_gpu_cases import (
    BASE,
    CASES,
    backward_case,
    case_inputs,
    forward_case,
    relative_errors,
    rng_for,
    run_plan,
    same_bits,
    upload,
    valid_rows,
)

from opfacade import (
    BufferTooSmall,
    DeviceMismatch,
    DTypeMismatch,
    LayoutMismatch,
    NoKernelSku,
    Plan,
    PlanPreference,
    ShapeMismatch,
    Workspace,
)
from opfacade._backends.cudnn import graphs
from opfacade._backends.cudnn.sdpa import BACKWARD_BOUND, FORWARD_BOUND
from opfacade._backends.reference import sdpa as reference
from opfacade._backends.reference.skus import _sdpa_backward as _reference_backward
from opfacade._internal.tensors import TensorView
from opfacade.contracts.sdpa import SDPA_BACKWARD, SDPA_FORWARD
from opfacade.ops.sdpa import (
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaDescriptor,
    SdpaForwardPlan,
    sdpa,
    sdpa_backward,
)
from opfacade.testing import _from_bits, _to_bits, download_bits
from opfacade.types import ElementKind

pytestmark = pytest.mark.gpu


# ----------------------------------------------------------------------------- lifecycle


def test_graph_is_built_at_selection_with_an_exact_workspace():
    desc = backward_case("bf16", "causal_bottom_right")
    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    built = graphs.backward_graph(desc, 0, deterministic=True)
    assert isinstance(built, graphs.BuiltGraph)
    assert plan.workspace_size == built.workspace_size > 0
    assert built.names == tuple(sorted(built.names, key=lambda n: {
        v: k for k, v in graphs.ARGUMENT.items()}[n]))
    report = Plan.explain(desc, {"deterministic": True}, device=0)
    assert report.chosen.workspace_size == built.workspace_size


def test_free_and_clear_caches_release_the_graph_and_a_live_plan_builds_it_again():
    """free() drops the graph its selection built; another plan of the same problem builds it
    again on its next run, as it does after clear_caches(), and writes the same bits."""
    import opfacade

    desc = forward_case("bf16", "gqa")
    key = graphs.GraphKey("forward", desc, 0, False)
    first = Plan.select(desc, device=0)
    second = Plan.select(desc, device=0)
    assert isinstance(graphs.GRAPHS.get(key), graphs.BuiltGraph)
    first.free()
    assert key not in graphs.GRAPHS._entries
    signature = SDPA_FORWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("free"))
    before = run_plan(second, signature, inputs)
    assert key in graphs.GRAPHS._entries
    opfacade.clear_caches()
    assert len(graphs.GRAPHS) == 0
    after = run_plan(second, signature, inputs)
    assert same_bits([before[0], after[0]])
    second.free()
    assert key not in graphs.GRAPHS._entries


def test_workspace_of_exactly_workspace_size_suffices_and_less_is_refused():
    import cupy

    desc = backward_case("bf16", "gqa_bias_window_bshd_d128")
    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    signature = SDPA_BACKWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("guard"))
    views = {name: upload(spec, None if spec.role == "out" else inputs[name])
             for name, spec in signature.items()}
    args = SdpaBackwardArgs(**views)
    guard = 4096
    pool = cupy.full(plan.workspace_size + 2 * guard, 0xA5, dtype=cupy.uint8)
    with pytest.raises(BufferTooSmall, match="workspace has"):
        plan.run(args, workspace=Workspace(pool.data.ptr + guard, plan.workspace_size - 256, 0,
                                           pool))
    plan.run(args, workspace=Workspace(pool.data.ptr + guard, plan.workspace_size, 0, pool))
    cupy.cuda.runtime.deviceSynchronize()
    host = pool.get()
    assert (host[:guard] == 0xA5).all() and (host[guard + plan.workspace_size:] == 0xA5).all()
    bits = {name: download_bits(views[name]) for name, spec in signature.items()
            if spec.role == "out"}
    errors = relative_errors(desc, signature, bits, _reference_backward(desc, inputs), inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_raw_pointer_and_public_execute_paths_agree_bitwise(direction, monkeypatch):
    if direction == "forward":
        desc = forward_case("bf16", "bias_1hqk_causal")
        plan = Plan.select(desc, device=0)
        built = graphs.forward_graph(desc, 0)
        signature = SDPA_FORWARD.signature(desc)
    else:
        desc = backward_case("bf16", "padding_bias")
        plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
        built = graphs.backward_graph(desc, 0, deterministic=True)
        signature = SDPA_BACKWARD.signature(desc)
    assert built.launch.raw, f"the raw-pointer call is not available ({built.served_by})"
    inputs = case_inputs(desc, signature, rng_for("paths", direction))
    raw = run_plan(plan, signature, inputs)
    monkeypatch.setattr(graphs, "EXECUTE_PATH", "public")
    public = run_plan(plan, signature, inputs)
    masks = {n: valid_rows(desc, n, inputs) for n in raw[0]}
    for name in raw[0]:
        a = _from_bits(raw[0][name], signature[name].element)
        b = _from_bits(public[0][name], signature[name].element)
        if masks[name] is not None:
            a, b = np.where(masks[name], a, 0.0), np.where(masks[name], b, 0.0)
        assert a.tobytes() == b.tobytes(), name


def test_one_plan_from_several_threads_each_with_its_own_handle_and_stream():
    desc = forward_case("bf16", "gqa")
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("threads"))
    expected = run_plan(plan, signature, inputs)[0]
    outcomes = []

    def worker():
        try:
            outcomes.append(run_plan(plan, signature, inputs, runs=3))
        except Exception as error:  # reported below, with the thread's failure
            outcomes.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outcome in outcomes:
        assert not isinstance(outcome, Exception), outcome
        assert same_bits([expected, *outcome])


def test_training_pair_runs_forward_then_backward_in_one_workspace():
    import cupy

    desc = SdpaDescriptor(**{**BASE, **CASES["gqa"]}, element="bf16", causal="top_left",
                               save_stats=True)
    pair = SdpaForwardPlan.select_for_training(desc, {"deterministic": True}, device=0)
    assert pair.backward.sku.id == "sdpa_backward.cudnn.bf16.deterministic"
    fsig = SDPA_FORWARD.signature(desc)
    bdesc = pair.backward.descriptor
    bsig = SDPA_BACKWARD.signature(bdesc)
    rng = rng_for("pair")
    inputs = case_inputs(desc, fsig, rng)
    inputs["grad_out"] = _from_bits(_to_bits(rng.uniform(-1, 1, desc.o_shape), desc.element),
                                    desc.element)
    views = {name: upload(spec, None if spec.role == "out" else inputs[name])
             for name, spec in fsig.items()}
    workspace = cupy.empty(pair.workspace_size, dtype=cupy.uint8)
    pair.forward.run(SdpaArgs(**views), workspace=workspace, stream=0)
    grads = {name: upload(bsig[name], None) for name in ("grad_q", "grad_k", "grad_v")}
    pair.backward.run(SdpaBackwardArgs(
        views["q"], views["k"], views["v"], views["out"], upload(bsig["grad_out"],
                                                                  inputs["grad_out"]),
        views["stats"], grads["grad_q"], grads["grad_k"], grads["grad_v"]),
        workspace=workspace, stream=0)
    cupy.cuda.runtime.deviceSynchronize()
    expected = _reference_backward(bdesc, inputs)
    bits = {name: download_bits(view) for name, view in grads.items()}
    errors = relative_errors(bdesc, bsig, bits, expected, inputs)
    # The forward's own rounding of out and stats enters here: one more rounding of out.
    assert all(e <= pair.backward.precision_guarantee.max_rel_error for e in errors.values()), \
        errors


# ----------------------------------------------------------------------------- bad input


def test_bad_input_on_the_gpu_is_typed_and_named():
    import cupy

    desc = SdpaDescriptor(**BASE, element="f16", padding=True, save_stats=True)
    plan = Plan.select(desc, device=0)
    q = cupy.zeros(desc.q_shape, cupy.float16)
    k, v, out = cupy.zeros_like(q), cupy.zeros_like(q), cupy.empty_like(q)
    stats = cupy.empty(desc.stats_shape, cupy.float32)
    lengths = cupy.full((2,), 128, cupy.int32)
    good = dict(q=q, k=k, v=v, out=out, stats=stats, seq_len_q=lengths, seq_len_kv=lengths)
    plan.can_implement(SdpaArgs(**good))

    def check(error, match, argument, **change):
        with pytest.raises(error, match=match) as caught:
            plan.run(SdpaArgs(**{**good, **change}))
        assert caught.value.argument == argument

    check(DTypeMismatch, "stats must have element type f32", "stats",
          stats=cupy.empty(desc.stats_shape, cupy.float16))
    check(ShapeMismatch, "stats must have shape", "stats",
          stats=cupy.empty((2, 4, 128), cupy.float32))
    check(DTypeMismatch, "seq_len_q must have element type i32", "seq_len_q",
          seq_len_q=cupy.full((2,), 128, cupy.int64))
    check(ShapeMismatch, r"seq_len_kv must have shape \(2,\)", "seq_len_kv",
          seq_len_kv=cupy.full((3,), 128, cupy.int32))
    bshd = cupy.zeros((2, 128, 4, 64), cupy.float16).transpose(0, 2, 1, 3)
    check(LayoutMismatch, "q must have the dense bhsd strides", "q", q=bshd)
    # A buffer of its own with room to spare, so the shifted view overlaps no other argument.
    roomy = cupy.zeros(q.size + 64, cupy.float16)
    shifted = TensorView(roomy.data.ptr + 2, desc.q_shape, (32768, 8192, 64, 1), desc.element,
                         0, "cupy", roomy)
    check(LayoutMismatch, "q must be 16-byte aligned", "q", q=shifted)
    check(DeviceMismatch, "k is in host memory", "k", k=np.zeros(desc.k_shape, np.float16))
    check(LayoutMismatch, "out must have unit stride", "out",
          out=cupy.empty((2, 4, 64, 128), cupy.float16).transpose(0, 1, 3, 2))
    with pytest.raises(NoKernelSku, match="head_dim 100 and head_dim_v 100 must be multiples"):
        Plan.select(SdpaDescriptor(**{**BASE, "head_dim": 100}, element="f16"), device=0)


def test_functional_forms_with_cupy_arrays():
    import cupy

    rng = rng_for("cupy")
    q, k, v = (cupy.asarray(rng.uniform(-1, 1, s).astype(np.float16))
               for s in ((2, 4, 64, 64), (2, 2, 96, 64), (2, 2, 96, 64)))
    out, stats = sdpa(q, k, v, causal="bottom_right", return_stats=True)
    cupy.cuda.get_current_stream().synchronize()
    ref_out, ref_lse = reference.sdpa_forward(q.get(), k.get(), v.get(), causal="bottom_right")
    from opfacade.testing import relative_error

    assert relative_error(out.get(), ref_out) <= FORWARD_BOUND[ElementKind.f16]
    assert relative_error(stats.get()[..., 0], ref_lse) <= FORWARD_BOUND[ElementKind.f16]
    d_out = cupy.asarray(rng.uniform(-1, 1, out.shape).astype(np.float16))
    dq, dk, dv = sdpa_backward(q, k, v, out, d_out, stats,
                                              causal="bottom_right", deterministic=True)
    cupy.cuda.get_current_stream().synchronize()
    grads = reference.sdpa_backward(q.get(), k.get(), v.get(), d_out.get(),
                                    causal="bottom_right")
    for ours, name in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
        assert relative_error(ours.get(), grads[name]) <= BACKWARD_BOUND[ElementKind.f16], name


def test_torch_tensors_layouts_streams_and_functional_forms():
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.rand(shape, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1

    # BSHD tensors as models hold them: [B, S, H, D] memory, viewed as [B, H, S, D].
    q = rand(2, 200, 8, 128).transpose(1, 2)
    k, v = rand(2, 256, 2, 128).transpose(1, 2), rand(2, 256, 2, 128).transpose(1, 2)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # None: torch's current stream, here the side stream
        out, stats = sdpa(q, k, v, causal=True, return_stats=True)
    side.synchronize()
    assert out.shape == (2, 8, 200, 128) and out.stride() == (200 * 8 * 128, 128, 8 * 128, 1)
    from opfacade.testing import relative_error

    q64, k64, v64 = (t.double().cpu().numpy() for t in (q, k, v))
    ref_out, ref_lse = reference.sdpa_forward(q64, k64, v64, causal="top_left")
    bound, grad_bound = FORWARD_BOUND[ElementKind.bf16], BACKWARD_BOUND[ElementKind.bf16]
    assert relative_error(out.double().cpu().numpy(), ref_out) <= bound
    assert relative_error(stats[..., 0].double().cpu().numpy(), ref_lse) <= bound
    d_out = rand(2, 200, 8, 128).transpose(1, 2)
    dq, dk, dv = sdpa_backward(q, k, v, out, d_out, stats, causal=True)
    torch.cuda.synchronize()
    grads = reference.sdpa_backward(q64, k64, v64, d_out.double().cpu().numpy(),
                                    causal="top_left")
    for ours, name in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
        assert relative_error(ours.double().cpu().numpy(), grads[name]) <= grad_bound, name
    # The same problem through torch's own SDPA agrees with ours to the bound.
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(4, 1), v.double().repeat_interleave(4, 1),
        is_causal=True)
    assert relative_error(out.double().cpu().numpy(), expected.cpu().numpy()) <= bound
    with pytest.raises(LayoutMismatch, match="q must have non-negative strides and a unit dim"):
        sdpa(rand(2, 8, 128, 200).transpose(2, 3), k, v)
