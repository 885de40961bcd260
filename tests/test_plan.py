"""Plan machinery without a GPU: selection for an arch, explain, host plans, lifetime, cache."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from opfacade import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiBackwardPlan,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    AlibiForwardPlan,
    ArchSku,
    DeviceMismatch,
    InvalidArgument,
    InvalidProblem,
    LayoutMismatch,
    NoKernelSku,
    Plan,
    PlanFreed,
    PlanPreference,
    ReasonCode,
    Workspace,
)
from opfacade.plan import PLAN_CACHE

SHAPE = dict(batch=2, heads=4, query_len=16, key_len=16)


def backward(element="f32", **kw):
    return AlibiBackwardDescriptor(**SHAPE, element=element, **kw)


def codes(report):
    return {v.sku.id: v.code for v in report.verdicts}


def test_select_for_an_arch_needs_no_gpu():
    plan = Plan.select(backward(), arch="sm90")
    assert isinstance(plan, AlibiBackwardPlan)
    assert plan.sku.id == "alibi_backward.nvrtc.f32"
    assert plan.target.arch is ArchSku.sm90 and plan.target.device is None
    assert plan.precision_guarantee.deterministic and plan.precision_guarantee.bit_stable
    assert plan.workspace_size > 0 and plan.workspace_size % 256 == 0


def test_explain_gives_every_candidate_a_reason():
    report = Plan.explain(backward("bf16"), arch="sm90")
    found = codes(report)
    assert found["alibi_backward.nvrtc.bf16"] is ReasonCode.chosen
    assert found["alibi_backward.nvrtc.f32"] is ReasonCode.element_unsupported
    assert found["alibi_backward.reference"] is ReasonCode.reference_is_oracle
    assert len(found) == len(AlibiBackwardPlan.op.skus)
    text = report.table()
    assert "element_unsupported" in text and "chosen" in text
    assert report.to_dict()["candidates"][0]["code"] == "element_unsupported"


def test_preferences_filter_with_their_own_reason():
    report = Plan.explain(backward(), {"backends": ["cudnn"]}, arch="sm90")
    assert set(codes(report).values()) == {ReasonCode.backend_not_allowed}
    limited = Plan.explain(backward(), {"workspace_limit": 0}, arch="sm90")
    assert codes(limited)["alibi_backward.nvrtc.f32"] is ReasonCode.workspace_over_limit
    pinned = Plan.explain(backward(), {"sku": "alibi_backward.nvrtc.f64"}, arch="sm90")
    assert codes(pinned)["alibi_backward.nvrtc.f32"] is ReasonCode.not_requested
    stricter = Plan.explain(backward(), {"max_rel_error": 1e-9}, arch="sm90")
    assert codes(stricter)["alibi_backward.nvrtc.f32"] is ReasonCode.error_bound_too_loose
    # Without the dslope reduction there is no workspace, so a zero limit is fine.
    plan = Plan.select(backward(need_slope_grad=False), {"workspace_limit": 0}, arch="sm90")
    assert plan.workspace_size == 0


def test_no_sku_raises_with_the_report():
    with pytest.raises(NoKernelSku) as caught:
        Plan.select(backward(), {"backends": ["cublaslt"]}, arch="sm90")
    assert caught.value.report is not None
    assert "backend_not_allowed" in str(caught.value)


def test_unsupported_element_is_no_kernel_sku_not_invalid():
    desc = AlibiForwardDescriptor(**SHAPE, element="fp8_e4m3")
    with pytest.raises(NoKernelSku):
        Plan.select(desc, arch="sm90")


def test_plan_class_checks_its_descriptor():
    with pytest.raises(InvalidProblem, match="AlibiForwardDescriptor"):
        AlibiForwardPlan.select(backward(), arch="sm90")
    with pytest.raises(InvalidProblem, match="descriptor"):
        Plan.select(object(), arch="sm90")


def test_target_arguments_are_checked():
    with pytest.raises(InvalidProblem, match="arch"):
        Plan.select(backward(), arch="sm12")
    with pytest.raises(InvalidProblem, match="device"):
        Plan.select(backward(), device="gpu0")
    with pytest.raises(InvalidProblem, match="arch"):
        Plan.select(backward(), device="cpu", arch="sm90")


def test_gpu_plan_rejects_host_arrays_by_name():
    plan = Plan.select(backward(), arch="sm90")
    dy = np.ones((2, 4, 16, 16), np.float32)
    args = AlibiBackwardArgs(dy, np.empty_like(dy), np.empty(4, np.float32))
    with pytest.raises(DeviceMismatch, match="grad_output is in host memory"):
        plan.can_implement(args)


def test_host_plan_runs_the_reference():
    rng = np.random.default_rng(1)
    dy = rng.uniform(-1, 1, (2, 4, 16, 16))
    d_in, d_slopes = np.empty_like(dy), np.empty(4)
    with Plan.select(backward("f64"), device="cpu") as plan:
        assert plan.sku.id == "alibi_backward.reference"
        plan.run(AlibiBackwardArgs(dy, d_in, d_slopes))
    distance = np.arange(16)[None, :] - np.arange(16)[:, None]
    np.testing.assert_array_equal(d_in, dy)
    np.testing.assert_allclose(d_slopes, (dy * distance).sum(axis=(0, 2, 3)), rtol=1e-12)


def test_the_sku_sees_the_signatures_stride_on_an_extent_one_dimension(monkeypatch):
    """A stride of 7 elements on batch 1 (a hand-built view) reaches the SKU's checks and launch
    as the signature's (contract.settled): such a stride addresses nothing, and SKUs whose
    rules want multiples of 8 refused it before."""
    desc = AlibiBackwardDescriptor(batch=1, heads=4, query_len=16, key_len=16, element="f64")
    rng = np.random.default_rng(2)
    dense = rng.uniform(-1, 1, (1, 4, 16, 16))
    odd = np.lib.stride_tricks.as_strided(dense, dense.shape, (7 * 8, *dense.strides[1:]))
    seen = []
    with Plan.select(desc, device="cpu") as plan:
        impl = plan._live_impl()
        check = impl.check_args
        monkeypatch.setattr(impl, "check_args",
                            lambda d, bound: (seen.append(bound["grad_output"]), check(d, bound)))
        d_in, d_slopes = np.empty_like(dense), np.empty(4)
        plan.run(AlibiBackwardArgs(odd, d_in, d_slopes))
    assert seen[0].strides == (4 * 16 * 16, 16 * 16, 16, 1)
    np.testing.assert_array_equal(d_in, dense)


def test_settled_takes_c_order_of_a_views_own_shape_under_an_envelope():
    """A decode plan runs any batch up to its envelope: a view whose shape is not the
    signature's settles its extent-1 strides to C order of its own shape; other views, and
    every stride of an extent above 1, are left as they are."""
    from opfacade._internal.contract import BoundArgs, TensorSpec, settled, stated_strides
    from opfacade._internal.view import TensorView
    from opfacade.types import ElementKind

    bf16 = ElementKind.bf16
    stated = stated_strides({"q": TensorSpec((64, 1, 32, 128), bf16),
                             "k": TensorSpec((64, 4096, 8, 128), bf16)})

    def view(shape, strides):
        return TensorView(1 << 30, shape, strides, bf16, 0, "cupy", None)

    k = view((64, 4096, 8, 128), (4194304, 1024, 128, 1))
    bound = settled(BoundArgs({"q": view((3, 1, 32, 128), (8192, 7, 256, 1)), "k": k}, ()),
                    stated)
    assert bound["q"].strides == (8192, 4096, 256, 1)
    assert bound["k"] is k
    same = BoundArgs({"q": view((64, 1, 32, 128), (4096, 4096, 128, 1)), "k": k}, ())
    assert settled(same, stated) is same  # nothing to settle: the same object


def test_freed_plan_raises_and_free_is_idempotent():
    plan = Plan.select(backward(), device="cpu")
    plan.free()
    plan.free()
    assert plan.freed and "freed" in repr(plan)
    dy = np.ones((2, 4, 16, 16))
    with pytest.raises(PlanFreed):
        plan.run(AlibiBackwardArgs(dy, np.empty_like(dy), np.empty(4)))
    with pytest.raises(PlanFreed), plan:
        pass


def test_args_of_the_wrong_op_are_named():
    plan = Plan.select(backward(), device="cpu")
    with pytest.raises(InvalidArgument, match="args must be AlibiBackwardArgs"):
        plan.run(AlibiForwardArgs(1, 2, 3))


def test_plan_cache_is_shared_across_threads():
    PLAN_CACHE.clear()
    desc = backward()
    pref = PlanPreference(deterministic=True)
    plans = []

    def worker():
        plans.append(Plan.cached(desc, pref, device="cpu"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(p) for p in plans}) == 1
    plans[0].free()  # a freed cached plan is replaced, not handed out again
    assert Plan.cached(desc, pref, device="cpu") is not plans[0]


def test_descriptor_json_round_trip_and_hash():
    desc = backward("bf16", need_input_grad=False)
    again = AlibiBackwardDescriptor.from_json(desc.model_dump_json())
    assert again == desc and hash(again) == hash(desc)
    with pytest.raises(InvalidProblem, match="need_input_grad"):
        backward(need_input_grad=False, need_slope_grad=False)


def test_training_pair_selects_the_backward_with_the_forward():
    forward = AlibiForwardDescriptor(**SHAPE, element="bf16")
    pair = Plan.select_for_training(forward, {"deterministic": True}, arch="sm90")
    assert pair.forward.sku.id == "alibi_forward.nvrtc.bf16"
    assert pair.backward.sku.id == "alibi_backward.nvrtc.bf16"
    assert pair.workspace_size == pair.backward.workspace_size
    with pytest.raises(NoKernelSku):  # no backward fits in no workspace: no forward either
        Plan.select_for_training(forward, {"workspace_limit": 0}, arch="sm90")
    with pytest.raises(InvalidProblem, match="no backward"):
        Plan.select_for_training(backward(), arch="sm90")


def test_arrays_on_two_devices_are_named_without_touching_a_gpu():
    from opfacade._internal.tensors import TensorView

    plan = Plan.select(backward(), arch="sm90")
    shape = (2, 4, 16, 16)
    dy = TensorView(0x10000, shape, (1024, 256, 16, 1), "f32", 0, "cupy", None)
    d_in = TensorView(0x20000, shape, (1024, 256, 16, 1), "f32", 0, "cupy", None)
    d_s = TensorView(0x30000, (4,), (1,), "f32", 1, "cupy", None)
    with pytest.raises(DeviceMismatch, match="grad_slopes is on cuda:1, but grad_output is on "
                                             "cuda:0"):
        plan.can_implement(AlibiBackwardArgs(dy, d_in, d_s))


def test_prepared_run_relaunches_and_respects_free():
    rng = np.random.default_rng(5)
    dy = rng.uniform(-1, 1, (2, 4, 16, 16))
    d_in, d_slopes = np.empty_like(dy), np.empty(4)
    plan = Plan.select(backward("f64"), device="cpu")
    again = plan.prepare(AlibiBackwardArgs(dy, d_in, d_slopes))
    dy *= 2  # contents may change between calls; the prepared call sees them
    again()
    np.testing.assert_array_equal(d_in, dy)
    plan.free()
    with pytest.raises(PlanFreed):
        again()


def test_a_read_only_output_is_named_on_a_host_plan():
    desc = backward()
    dy = np.ones(desc.shape, np.float32)
    d_in = np.empty(desc.shape, np.float32)
    d_in.flags.writeable = False
    plan = Plan.select(desc, device="cpu")
    with pytest.raises(InvalidArgument, match="grad_input is read-only"):
        plan.can_implement(AlibiBackwardArgs(dy, d_in, np.empty(4, np.float32)))


def test_free_while_threads_run_lets_only_plan_freed_escape():
    """Many threads run one host plan while another frees it: each run either finishes or
    raises PlanFreed, never AttributeError from a half-freed plan."""
    rng = np.random.default_rng(7)
    dy = rng.uniform(-1, 1, (2, 4, 16, 16))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        for _ in range(5):
            plan = Plan.select(backward("f64"), device="cpu")
            escaped, finished = [], []
            go = threading.Barrier(9)

            def worker(plan=plan, escaped=escaped, finished=finished, go=go):
                d_in, d_slopes = np.empty_like(dy), np.empty(4)
                go.wait()
                try:
                    while True:
                        plan.run(AlibiBackwardArgs(dy, d_in, d_slopes))
                        finished.append(1)
                except PlanFreed:
                    pass
                except BaseException as error:  # noqa: BLE001 - the escape this test looks for
                    escaped.append(error)

            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            go.wait()
            while len(finished) < 20 and not escaped:
                time.sleep(1e-4)
            plan.free()
            for t in threads:
                t.join(timeout=30)
            assert not any(t.is_alive() for t in threads)
            assert escaped == []
            assert plan.freed
    finally:
        sys.setswitchinterval(interval)


def test_a_run_under_way_finishes_when_the_plan_is_freed(monkeypatch):
    """free() does not wait for runs: one that has started completes with what it read, and
    the next raises PlanFreed."""
    plan = Plan.select(backward("f64"), device="cpu")
    impl = plan._live_impl()
    entered, release = threading.Event(), threading.Event()
    compute = impl.compute

    def slow_compute(desc, arrays):
        entered.set()
        assert release.wait(10)
        return compute(desc, arrays)

    monkeypatch.setattr(impl, "compute", slow_compute)
    dy = np.random.default_rng(3).uniform(-1, 1, (2, 4, 16, 16))
    d_in, d_slopes = np.zeros_like(dy), np.zeros(4)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(
        plan.run(AlibiBackwardArgs(dy, d_in, d_slopes))))
    runner.start()
    assert entered.wait(10)
    plan.free()
    with pytest.raises(PlanFreed):
        plan.run(AlibiBackwardArgs(dy, np.empty_like(dy), np.empty(4)))
    release.set()
    runner.join(10)
    assert outcome == [None]
    np.testing.assert_array_equal(d_in, dy)  # the started run wrote its result


def _strided(shape, strides, dtype=np.float32, writeable=True):
    """A view of a small buffer with the given element strides (possibly overlapping)."""
    itemsize = np.dtype(dtype).itemsize
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True))
    base = np.zeros(span, dtype)
    return np.lib.stride_tricks.as_strided(base, shape, [s * itemsize for s in strides],
                                           writeable=writeable)


@pytest.mark.parametrize("strides, why", [
    ((0, 256, 16, 1), "broadcast"),  # batch broadcast: every batch entry one buffer
    ((1024, 256, 1, 1), "overlap"),  # rows overlapping by 15 elements
])
def test_an_output_whose_elements_alias_each_other_is_named(strides, why):
    desc = backward()
    dy = np.ones(desc.shape, np.float32)
    d_in = _strided(desc.shape, strides)
    args = AlibiBackwardArgs(dy, d_in, np.empty(4, np.float32))
    host = Plan.select(desc, device="cpu")
    for call in (host.can_implement, host.run):
        with pytest.raises(LayoutMismatch, match=f"grad_input has shape .* {why}") as caught:
            call(args)
        assert caught.value.argument == "grad_input"
    # A GPU plan refuses it too, before anything asks for a device.
    from opfacade._internal.tensors import TensorView

    views = [TensorView(0x10000, desc.shape, (1024, 256, 16, 1), "f32", 0, "cupy", None),
             TensorView(0x20000, desc.shape, strides, "f32", 0, "cupy", None),
             TensorView(0x30000, (4,), (1,), "f32", 0, "cupy", None)]
    with pytest.raises(LayoutMismatch, match=why):
        Plan.select(desc, arch="sm90").can_implement(AlibiBackwardArgs(*views))


def test_inputs_may_be_broadcast_and_outputs_reversed_or_permuted():
    desc = AlibiForwardDescriptor(**SHAPE, element="f64")
    x = np.broadcast_to(np.random.default_rng(2).uniform(-1, 1, (1, 4, 16, 16)), desc.shape)
    slopes = np.linspace(-1, 1, 4)
    plan = Plan.select(desc, device="cpu")
    expected = np.empty(desc.shape)
    plan.run(AlibiForwardArgs(x, slopes, expected))
    reversed_rows = np.empty(desc.shape)[:, :, ::-1, :]
    plan.run(AlibiForwardArgs(x, slopes, reversed_rows))
    np.testing.assert_array_equal(reversed_rows, expected)


@pytest.mark.parametrize("shape, strides, aliasing", [
    ((3, 3), (2, 3), False),  # interleaved, yet every element has its own address
    ((3, 3), (1, 2), True),  # offsets 2 = 2*1 = 0*1 + 1*2
    ((4, 1, 5), (5, 0, 1), False),  # a zero stride on a unit extent is no broadcast
    ((2, 3), (-3, 1), False),
    ((2, 0, 3), (0, 0, 0), False),  # no elements, nothing to alias
])
def test_self_aliasing_is_decided_exactly(shape, strides, aliasing):
    from opfacade._internal.checks import self_aliasing
    from opfacade._internal.tensors import TensorView

    view = TensorView(0x1000, shape, strides, "f32", None, "numpy", None)
    assert bool(self_aliasing(view)) is aliasing


def test_verify_refuses_a_problem_whose_strides_cannot_hold_its_random_inputs():
    """A descriptor may state q/k/v strides with extents that overlap (a read-only input may
    alias itself); verify, which gives every element its own random value, says so by name
    instead of writing colliding values and reporting the op wrong."""
    from opfacade.contracts.sdpa import SDPA_FORWARD, SdpaDescriptor
    from opfacade.testing import expect_distinct_elements

    strides = {"q": (81920, 64, 512, 1), "k": (81920, 64, 512, 1), "v": (81920, 64, 512, 1)}
    fits = SdpaDescriptor(batch=2, heads_q=4, heads_kv=2, seq_q=150, seq_kv=160, head_dim=64,
                          element="bf16", layout="bshd", qkv_strides=strides)
    expect_distinct_elements(SDPA_FORWARD.signature(fits))
    overlapping = fits.model_copy(update={"seq_kv": 261})  # 261 rows of 512 > a batch's 81920
    with pytest.raises(InvalidArgument, match=r"every element of k .*overlap") as caught:
        expect_distinct_elements(SDPA_FORWARD.signature(overlapping))
    assert caught.value.argument == "plan"


class _OneGpu:
    """CUDA's runtime as a process with one GPU sees it (device 0 current)."""

    def getDeviceCount(self):
        return 1

    def getDevice(self):
        return 0


@pytest.mark.parametrize("where", ["host", "gpu_memo"])
def test_a_free_during_a_runs_checks_lets_that_run_finish(where, monkeypatch):
    """free() lands while a run is between its checks and its launch (the window where a plan
    that read its state twice raised AttributeError): that run launches, the next raises
    PlanFreed. On the GPU path the run goes through the call memo, with stand-ins for the
    device (views at fake addresses, a one-GPU runtime, a launch that records its stream)."""
    from opfacade import plan as plan_module
    from opfacade._internal.call_keys import ArgumentReader
    from opfacade._internal.call_memo import CallMemo
    from opfacade._internal.device import Devices
    from opfacade._internal.tensors import TensorView

    desc = backward("f64" if where == "host" else "f32", need_slope_grad=False)
    if where == "host":
        plan = Plan.select(desc, device="cpu")
        dy = np.random.default_rng(4).uniform(-1, 1, desc.shape)
        d_in = np.zeros_like(dy)
        args, stream = AlibiBackwardArgs(dy, d_in), None
    else:
        plan = Plan.select(desc, arch="sm90")
        monkeypatch.setattr(plan_module, "device_arch", lambda device: ArchSku.sm90)
        plan._calls = CallMemo(plan._checked_launch, ArgumentReader(devices=Devices(_OneGpu())))
        strides = (1024, 256, 16, 1)
        args = AlibiBackwardArgs(TensorView(0x10000, desc.shape, strides, "f32", 0, "cupy", None),
                                 TensorView(0x20000, desc.shape, strides, "f32", 0, "cupy", None))
        stream = 7
    impl = plan._live_impl()
    launched = []
    if where == "gpu_memo":
        monkeypatch.setattr(impl, "prepared", lambda d, b, w, s: lambda: launched.append(s))
    monkeypatch.setattr(impl, "check_args", lambda d, bound: plan.free())
    plan.run(args, stream=stream)
    assert plan.freed
    if where == "host":
        np.testing.assert_array_equal(d_in, dy)
    else:
        assert launched == [7]
    with pytest.raises(PlanFreed):
        plan.run(args, stream=stream)


@pytest.mark.parametrize("workspace", [Workspace("a", "b", None), Workspace(1.5, 0, None),
                                       Workspace(0, 0, "cuda:0"), Workspace(-256, 0, None)])
def test_a_workspace_of_the_wrong_types_is_named(workspace):
    dy = np.ones((2, 4, 16, 16))
    args = AlibiBackwardArgs(dy, np.empty_like(dy), np.empty(4))
    with pytest.raises(InvalidArgument, match="workspace must be a Workspace") as caught:
        Plan.select(backward("f64"), device="cpu").can_implement(args, workspace)
    assert caught.value.argument == "workspace"


def test_a_batch_invariance_preference_rejects_every_sku_that_does_not_claim_it():
    """No SKU claims batch invariance yet (issue 13's split-KV decode will): explain says why
    each is out, with its own code."""
    from opfacade.contracts.sdpa import SdpaDescriptor

    desc = SdpaDescriptor(batch=1, heads_q=2, heads_kv=2, seq_q=64, seq_kv=64, head_dim=64,
                          element="bf16")
    report = Plan.explain(desc, PlanPreference(batch_invariant=True), arch="sm90")
    gpu = [v for v in report.verdicts
           if v.sku.backend.value != "reference" and v.sku.element.value == "bf16"]
    assert gpu and {v.code for v in gpu} == {ReasonCode.not_batch_invariant}
    assert "depend on the rest of the batch" in str(report)


def test_cached_for_remembers_the_plan_by_the_facts_a_descriptor_is_built_from():
    from opfacade import LinearDescriptor, LinearForwardPlan, clear_caches
    from opfacade.plan import FACTS_CACHE

    clear_caches()
    built = []

    def describe(n):
        built.append(n)
        return LinearDescriptor(m=4, n=n, k=8, element="f32")

    first = LinearForwardPlan.cached_for(("facts", 16), lambda: describe(16), device="cpu")
    again = LinearForwardPlan.cached_for(("facts", 16), lambda: describe(16), device="cpu")
    other = LinearForwardPlan.cached_for(("facts", 24), lambda: describe(24), device="cpu")
    assert first is again and other is not first and built == [16, 24]
    assert other.descriptor.n == 24
    unhashable = LinearForwardPlan.cached_for(("facts", [16]), lambda: describe(16),
                                              device="cpu")
    assert unhashable is first and built == [16, 24, 16]  # built, then found in PLAN_CACHE
    clear_caches()
    assert len(FACTS_CACHE) == 0
