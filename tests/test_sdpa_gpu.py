"""SDPA on a real GPU: every feature and supported combination against the float64 reference
within the SKU's declared bound, forward determinism and the deterministic backward bitwise over
fresh workspaces and streams, dropout repeatable by seed and checked with cuDNN's own mask, the
graph lifecycle (select-time build, exact workspace, both execute paths, threads), bad input,
training pairs and torch/CuPy interop.

Inputs are uniform in [-1, 1) and rounded to the element; the reference runs in float64 on those
rounded values. Outputs are poisoned (all bits set) before each run. Rows past seq_len_q (and
gradient rows past the lengths) are unspecified by the contract and left out of comparisons.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np
import pytest

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
from opfacade._backends.cudnn.sdpa import (
    BACKWARD_BOUND,
    FORWARD_BOUND,
    run_forward_dumping_dropout,
)
from opfacade._backends.reference import sdpa as reference
from opfacade._backends.reference.skus import _sdpa_backward as _reference_backward
from opfacade._backends.reference.skus import _sdpa_forward as _reference_forward
from opfacade._internal.contract import TensorSpec
from opfacade._internal.tensors import TensorView, wrap
from opfacade.contracts.sdpa import SDPA_BACKWARD, SDPA_FORWARD, reference_options
from opfacade.contracts.sdpa_samples import verification_inputs
from opfacade.ops.sdpa import (
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    SdpaForwardPlan,
    sdpa,
    sdpa_backward,
)
from opfacade.testing import (
    _device_tensor,
    _from_bits,
    _to_bits,
    download_bits,
    random_inputs,
    verify_plan,
)
from opfacade.types import ElementKind

pytestmark = pytest.mark.gpu

BASE = dict(batch=2, heads_q=4, heads_kv=4, seq_q=128, seq_kv=128, head_dim=64)

# Every feature alone, then the combinations that interact (masks with padding, bias with
# masks and GQA, layouts with everything). Each runs forward and backward.
CASES = {
    "plain": {},
    "d128": dict(head_dim=128),
    "dv_differs": dict(head_dim=128, head_dim_v=64),
    "odd_lengths": dict(seq_q=200, seq_kv=300),
    "bshd": dict(layout="bshd", seq_q=200, seq_kv=300),
    "sbhd": dict(layout="sbhd"),
    "scale": dict(scale=0.3),
    "gqa": dict(heads_q=8, heads_kv=2),
    "mqa": dict(heads_q=8, heads_kv=1),
    "causal_top_left": dict(causal="top_left", seq_q=200, seq_kv=300),
    "causal_top_left_tall": dict(causal="top_left", seq_q=300, seq_kv=200),
    "causal_bottom_right": dict(causal="bottom_right", seq_q=130, seq_kv=300),
    "window_left": dict(window=(64, None)),
    "window_left_right": dict(window=(48, 16), seq_q=160, seq_kv=224),
    "window_right_only": dict(window=(None, 8)),
    "window_causal": dict(causal="top_left", window=(32, None)),
    "window_bottom_right": dict(causal="bottom_right", window=(40, None), seq_q=100,
                                seq_kv=260),
    "bias_bhqk": dict(bias="bhqk"),
    "bias_1hqk_causal": dict(bias="1hqk", causal="top_left"),
    "bias_b1qk": dict(bias="b1qk"),
    "bias_11qk_window": dict(bias="11qk", window=(32, 32)),
    "alibi": dict(alibi=True, causal="top_left"),
    "alibi_six_heads_gqa": dict(alibi=True, causal="top_left", heads_q=6, heads_kv=3),
    "padding": dict(padding=True, seq_q=200, seq_kv=300),
    "padding_causal_bottom_right": dict(padding=True, causal="bottom_right", seq_q=200,
                                        seq_kv=300),
    "padding_bias": dict(padding=True, bias="bhqk", causal="top_left"),
    "padding_window": dict(padding=True, window=(32, 0)),
    "gqa_bias_window_bshd_d128": dict(heads_q=8, heads_kv=2, bias="bhqk", window=(64, 0),
                                      layout="bshd", head_dim=128),
}
F16_CASES = ("plain", "causal_bottom_right", "bias_1hqk_causal", "alibi", "padding", "gqa",
             "window_left_right")
PARAMS = [pytest.param("bf16", name, id=f"bf16-{name}") for name in CASES] + [
    pytest.param("f16", name, id=f"f16-{name}") for name in F16_CASES]
DETERMINISTIC = ("plain", "causal_bottom_right", "gqa_bias_window_bshd_d128", "padding_bias",
                 "alibi", "window_left_right")


# ----------------------------------------------------------------------------- helpers


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


def _forward(element, name, **extra) -> SdpaDescriptor:
    return SdpaDescriptor(**{**BASE, **CASES[name], **extra}, element=element,
                               save_stats=True)


def _backward(element, name, **extra) -> SdpaBackwardDescriptor:
    fields = {**BASE, **CASES[name], **extra}
    return SdpaBackwardDescriptor(**fields, element=element,
                                       need_bias_grad=fields.get("bias") is not None)


def _inputs(desc, signature: dict[str, TensorSpec], rng) -> dict[str, np.ndarray]:
    floats = {n: s for n, s in signature.items() if s.element.is_float and s.role != "out"}
    return verification_inputs(desc, random_inputs(floats, rng), rng)


def _upload(spec: TensorSpec, values: np.ndarray | None) -> TensorView:
    import cupy

    if spec.element.is_float:
        return _device_tensor(spec, 0, values)
    dtype = {ElementKind.i32: np.int32, ElementKind.i64: np.int64}[spec.element]
    with cupy.cuda.Device(0):
        return wrap(cupy.asarray(np.asarray(values, dtype=dtype).reshape(spec.shape)),
                    "lengths")


def _run(plan, signature, inputs, *, runs=1, args_type=None) -> list[dict[str, np.ndarray]]:
    """Raw output bits of ``runs`` runs, each with a fresh workspace buffer (at a different
    address and offset), fresh poisoned outputs and a new non-blocking stream."""
    import cupy

    args_type = args_type or type(plan).op.args
    results, keep = [], []
    for run in range(runs):
        views = {name: _upload(spec, None if spec.role == "out" else inputs[name])
                 for name, spec in signature.items()}
        pool = cupy.empty(plan.workspace_size + 2 * Workspace.ALIGNMENT * (run + 2),
                          dtype=cupy.uint8)
        keep.append(pool)
        base = Workspace.round_up(pool.data.ptr)
        workspace = Workspace(base + run * Workspace.ALIGNMENT, plan.workspace_size, 0, pool)
        cupy.cuda.runtime.deviceSynchronize()  # uploads and poison ran on the legacy stream
        stream = cupy.cuda.Stream(non_blocking=True)
        plan.run(args_type(**views), workspace=workspace, stream=stream.ptr)
        stream.synchronize()
        results.append({name: download_bits(views[name]) for name, spec in signature.items()
                        if spec.role == "out"})
    return results


def _valid(desc, name: str, inputs) -> np.ndarray | None:
    """Where ``name`` is specified: rows inside the sequence lengths (None: everywhere)."""
    if not desc.padding:
        return None
    len_q, len_kv = inputs["seq_len_q"], inputs["seq_len_kv"]
    rows_q = np.arange(desc.seq_q)[None, None, :, None] < len_q[:, None, None, None]
    rows_kv = np.arange(desc.seq_kv)[None, None, :, None] < len_kv[:, None, None, None]
    if name in ("out", "stats", "grad_q"):
        return rows_q
    if name in ("grad_k", "grad_v"):
        return rows_kv
    cols = np.arange(desc.seq_kv)[None, None, None, :] < len_kv[:, None, None, None]
    both = rows_q & cols
    return both.all(axis=0, keepdims=True) if desc.bias_shape[0] == 1 else both


def _errors(desc, signature, bits: dict, expected: dict, inputs) -> dict[str, float]:
    from opfacade.testing import relative_error

    errors = {}
    for name, ref in expected.items():
        got = _from_bits(bits[name], signature[name].element)
        mask = _valid(desc, name, inputs)
        if mask is not None:
            got, ref = np.where(mask, got, 0.0), np.where(mask, ref, 0.0)
        errors[name] = relative_error(got, ref)
    return errors


def _same_bits(results: list[dict]) -> bool:
    return all(r[n].tobytes() == results[0][n].tobytes() for r in results[1:] for n in r)


# ----------------------------------------------------------------------------- features


@pytest.mark.parametrize("element,name", PARAMS)
def test_forward_matches_the_reference_and_repeats_bitwise(element, name):
    desc = _forward(element, name)
    plan = Plan.select(desc, device=0)
    assert plan.sku.id == f"sdpa_forward.cudnn.{element}"
    signature = SDPA_FORWARD.signature(desc)
    inputs = _inputs(desc, signature, _rng("fwd", element, name))
    expected = _reference_forward(desc, inputs)
    results = _run(plan, signature, inputs, runs=2)
    errors = _errors(desc, signature, results[0], expected, inputs)
    bound = plan.precision_guarantee.max_rel_error
    assert all(e <= bound for e in errors.values()), f"{errors} vs bound {bound}"
    assert _same_bits(results), "the forward is declared deterministic"


@pytest.mark.parametrize("element,name", PARAMS)
def test_backward_matches_the_reference(element, name):
    desc = _backward(element, name)
    plan = Plan.select(desc, device=0)
    assert plan.sku.id == f"sdpa_backward.cudnn.{element}"
    signature = SDPA_BACKWARD.signature(desc)
    inputs = _inputs(desc, signature, _rng("bwd", element, name))
    expected = _reference_backward(desc, inputs)
    errors = _errors(desc, signature, _run(plan, signature, inputs)[0], expected, inputs)
    bound = plan.precision_guarantee.max_rel_error
    assert all(e <= bound for e in errors.values()), f"{errors} vs bound {bound}"


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_backward_is_bitwise_repeatable(name):
    desc = _backward("bf16", name)
    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    assert plan.sku.id == "sdpa_backward.cudnn.bf16.deterministic"
    default = Plan.select(desc, device=0)
    assert plan.workspace_size >= default.workspace_size  # the dP workspace is reported
    signature = SDPA_BACKWARD.signature(desc)
    inputs = _inputs(desc, signature, _rng("det", name))
    results = _run(plan, signature, inputs, runs=4)
    assert _same_bits(results), "declared deterministic, but bits differ across runs"
    errors = _errors(desc, signature, results[0], _reference_backward(desc, inputs),
                     inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_verify_plan_passes_every_forward_sample(element):
    for desc in SDPA_FORWARD.sample_problems(element):
        result = verify_plan(Plan.select(desc, device=0), runs=2)
        assert result.passed, result.summary()


def test_forward_without_stats_writes_only_out():
    desc = SdpaDescriptor(**{**BASE, **CASES["causal_top_left"]}, element="bf16")
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    assert "stats" not in signature
    inputs = _inputs(desc, signature, _rng("nostats"))
    errors = _errors(desc, signature, _run(plan, signature, inputs)[0],
                     _reference_forward(desc, inputs), inputs)
    assert errors["out"] <= plan.precision_guarantee.max_rel_error


# ----------------------------------------------------------------------------- dropout


def _dropout_mask(desc: SdpaDescriptor, inputs) -> np.ndarray:
    """cuDNN's keep mask for the inputs' seed and offset, from the forward's dump variant."""
    import cupy

    signature = SDPA_FORWARD.signature(desc)
    views = {name: _upload(spec, None if spec.role == "out" else inputs[name])
             for name, spec in signature.items()}
    mask = cupy.zeros((desc.batch, desc.heads_q, desc.seq_q, desc.seq_kv), dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    run_forward_dumping_dropout(desc, views, wrap(mask, "dropout_mask"), stream.ptr)
    return mask.get()


@pytest.mark.parametrize("element,extra", [
    ("bf16", dict(causal="top_left")),
    ("f16", dict(bias="1hqk", padding=True, seq_q=200, seq_kv=300)),
])
def test_dropout_forward_repeats_by_seed_and_matches_the_reference_with_cudnns_mask(element,
                                                                                     extra):
    p = 0.2
    desc = SdpaDescriptor(**{**BASE, **extra}, element=element, dropout_p=p,
                               save_stats=True)
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    inputs = _inputs(desc, signature, _rng("dropout", element))
    first, second = _run(plan, signature, inputs, runs=2)
    assert _same_bits([first, second]), "same seed and offset must give the same bits"
    reseeded = _run(plan, signature, {**inputs, "dropout_seed": inputs["dropout_seed"] + 1})[0]
    assert reseeded["out"].tobytes() != first["out"].tobytes()
    mask = _dropout_mask(desc, inputs)
    assert set(np.unique(mask)) <= {0.0, 1.0}
    scores = np.ones((desc.batch, 1, desc.seq_q, desc.seq_kv), bool)
    if desc.padding:
        scores = reference.sdpa_mask(desc.batch, desc.seq_q, desc.seq_kv,
                                     seq_len_q=inputs["seq_len_q"],
                                     seq_len_kv=inputs["seq_len_kv"])[:, None]
    kept = mask[np.broadcast_to(scores, mask.shape)]
    assert abs(kept.mean() - (1 - p)) < 0.02
    out, lse = reference.sdpa_forward(
        inputs["q"], inputs["k"], inputs["v"], bias=inputs.get("bias"),
        seq_len_q=inputs.get("seq_len_q"), seq_len_kv=inputs.get("seq_len_kv"),
        dropout_keep=mask > 0, **{**reference_options(desc)})
    errors = _errors(desc, signature, first, {"out": out, "stats": lse[..., None]}, inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors


@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_backward_uses_the_forwards_mask(deterministic):
    p = 0.15
    common = dict(BASE, heads_q=8, heads_kv=2, causal="top_left", element="bf16",
                  dropout_p=p)
    fwd = SdpaDescriptor(**common, save_stats=True)
    desc = SdpaBackwardDescriptor(**common)
    signature = SDPA_BACKWARD.signature(desc)
    rng = _rng("dropout-bwd", deterministic)
    floats = {n: s for n, s in signature.items() if s.element.is_float and s.role != "out"}
    inputs = random_inputs(floats, rng)
    inputs["dropout_seed"] = np.array([1234567], np.int64)
    inputs["dropout_offset"] = np.array([89], np.int64)
    keep = _dropout_mask(fwd, inputs) > 0
    options = reference_options(desc)
    out, lse = reference.sdpa_forward(inputs["q"], inputs["k"], inputs["v"], dropout_keep=keep,
                                      **options)
    inputs["out"] = _from_bits(_to_bits(out, desc.element), desc.element)
    inputs["stats"] = lse[..., None].astype(np.float32).astype(np.float64)
    grads = reference.sdpa_backward(inputs["q"], inputs["k"], inputs["v"], inputs["grad_out"],
                                    dropout_keep=keep, **options)
    expected = {"grad_q": grads["dq"], "grad_k": grads["dk"], "grad_v": grads["dv"]}
    plan = Plan.select(desc, PlanPreference(deterministic=deterministic), device=0)
    results = _run(plan, signature, inputs, runs=3 if deterministic else 1)
    errors = _errors(desc, signature, results[0], expected, inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors
    if deterministic:
        assert _same_bits(results)


# ----------------------------------------------------------------------------- lifecycle


def test_graph_is_built_at_selection_with_an_exact_workspace():
    desc = _backward("bf16", "causal_bottom_right")
    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    built = graphs.backward_graph(desc, 0, deterministic=True)
    assert isinstance(built, graphs.BuiltGraph)
    assert plan.workspace_size == built.workspace_size > 0
    assert built.names == tuple(sorted(built.names, key=lambda n: {
        v: k for k, v in graphs.ARGUMENT.items()}[n]))
    report = Plan.explain(desc, {"deterministic": True}, device=0)
    assert report.chosen.workspace_size == built.workspace_size


def test_workspace_of_exactly_workspace_size_suffices_and_less_is_refused():
    import cupy

    desc = _backward("bf16", "gqa_bias_window_bshd_d128")
    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    signature = SDPA_BACKWARD.signature(desc)
    inputs = _inputs(desc, signature, _rng("guard"))
    views = {name: _upload(spec, None if spec.role == "out" else inputs[name])
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
    errors = _errors(desc, signature, bits, _reference_backward(desc, inputs), inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_raw_pointer_and_public_execute_paths_agree_bitwise(direction, monkeypatch):
    if direction == "forward":
        desc = _forward("bf16", "bias_1hqk_causal")
        plan = Plan.select(desc, device=0)
        built = graphs.forward_graph(desc, 0)
        signature = SDPA_FORWARD.signature(desc)
    else:
        desc = _backward("bf16", "padding_bias")
        plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
        built = graphs.backward_graph(desc, 0, deterministic=True)
        signature = SDPA_BACKWARD.signature(desc)
    assert built.launch.raw, f"the raw-pointer call is not available ({built.served_by})"
    inputs = _inputs(desc, signature, _rng("paths", direction))
    raw = _run(plan, signature, inputs)
    monkeypatch.setattr(graphs, "EXECUTE_PATH", "public")
    public = _run(plan, signature, inputs)
    masks = {n: _valid(desc, n, inputs) for n in raw[0]}
    for name in raw[0]:
        a = _from_bits(raw[0][name], signature[name].element)
        b = _from_bits(public[0][name], signature[name].element)
        if masks[name] is not None:
            a, b = np.where(masks[name], a, 0.0), np.where(masks[name], b, 0.0)
        assert a.tobytes() == b.tobytes(), name


def test_one_plan_from_several_threads_each_with_its_own_handle_and_stream():
    desc = _forward("bf16", "gqa")
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    inputs = _inputs(desc, signature, _rng("threads"))
    expected = _run(plan, signature, inputs)[0]
    outcomes = []

    def worker():
        try:
            outcomes.append(_run(plan, signature, inputs, runs=3))
        except Exception as error:  # reported below, with the thread's failure
            outcomes.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outcome in outcomes:
        assert not isinstance(outcome, Exception), outcome
        assert _same_bits([expected, *outcome])


def test_training_pair_runs_forward_then_backward_in_one_workspace():
    import cupy

    desc = SdpaDescriptor(**{**BASE, **CASES["gqa"]}, element="bf16", causal="top_left",
                               save_stats=True)
    pair = SdpaForwardPlan.select_for_training(desc, {"deterministic": True}, device=0)
    assert pair.backward.sku.id == "sdpa_backward.cudnn.bf16.deterministic"
    fsig = SDPA_FORWARD.signature(desc)
    bdesc = pair.backward.descriptor
    bsig = SDPA_BACKWARD.signature(bdesc)
    rng = _rng("pair")
    inputs = _inputs(desc, fsig, rng)
    inputs["grad_out"] = _from_bits(_to_bits(rng.uniform(-1, 1, desc.o_shape), desc.element),
                                    desc.element)
    views = {name: _upload(spec, None if spec.role == "out" else inputs[name])
             for name, spec in fsig.items()}
    workspace = cupy.empty(pair.workspace_size, dtype=cupy.uint8)
    pair.forward.run(SdpaArgs(**views), workspace=workspace, stream=0)
    grads = {name: _upload(bsig[name], None) for name in ("grad_q", "grad_k", "grad_v")}
    pair.backward.run(SdpaBackwardArgs(
        views["q"], views["k"], views["v"], views["out"], _upload(bsig["grad_out"],
                                                                  inputs["grad_out"]),
        views["stats"], grads["grad_q"], grads["grad_k"], grads["grad_v"]),
        workspace=workspace, stream=0)
    cupy.cuda.runtime.deviceSynchronize()
    expected = _reference_backward(bdesc, inputs)
    bits = {name: download_bits(view) for name, view in grads.items()}
    errors = _errors(bdesc, bsig, bits, expected, inputs)
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

    rng = _rng("cupy")
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
    with pytest.raises(LayoutMismatch, match="q must be a dense"):
        sdpa(rand(2, 8, 128, 200).transpose(2, 3), k, v)
