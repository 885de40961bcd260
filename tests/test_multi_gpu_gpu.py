"""Two GPUs in one process (skipped with fewer): plans, library handles, loaded kernels and
scratch are per device, so a plan selected for cuda:1 runs there while cuda:0 is current, gives
what the same SKU gives on cuda:0, and leaves cuda:0 current; a plan selected for one device
refuses another's tensors with DeviceMismatch. Every GPU SKU of the catalog is run, then the
torch ops (eager, autograd and a CUDA graph captured on cuda:1).
"""

from __future__ import annotations

import numpy as np
import pytest

from opfacade import DeviceMismatch, Plan, PlanPreference, Workspace
from opfacade._internal.device import device_count, device_name
from opfacade._registry import all_ops
from opfacade.testing import (
    _device_tensor,
    _from_bits,
    download_bits,
    reference_check,
    verification_problem,
)
from opfacade.types import BackendKind

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(device_count() < 2, reason="needs two GPUs")]

GPU_SKUS = [(op, impl) for op in all_ops() for impl in op.skus
            if impl.sku.backend is not BackendKind.reference]


def _first_problem(op, impl):
    return next(d for d in op.sample_problems(impl.sku.element) if impl.unfit(d) is None)


def _run(plan: Plan, op, inputs: dict, device: int, *, workspace: bool = True,
         prepared: bool = False, null_stream: bool = False) -> dict[str, np.ndarray]:
    """Runs ``plan`` on fresh copies of ``inputs`` on ``device``, on a stream of that device
    (or on stream 0, which means the null stream of the device the work runs on), with cuda:0
    current throughout the call; every tensor's bits after it."""
    import cupy

    signature = op.signature(plan.descriptor)
    views = {name: _device_tensor(spec, device, inputs.get(name) if spec.role != "out" else None)
             for name, spec in signature.items()}
    with cupy.cuda.Device(device):
        pool = cupy.empty(plan.workspace_size + Workspace.ALIGNMENT, dtype=cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.runtime.deviceSynchronize()  # uploads and poison went to the legacy stream
    space = (Workspace(Workspace.round_up(pool.data.ptr), plan.workspace_size, device, pool)
             if workspace else None)
    handle = 0 if null_stream else stream.ptr
    assert cupy.cuda.runtime.getDevice() == 0
    if prepared:
        call = plan.prepare(op.args(**views), workspace=space, stream=handle)
        call()
        call()
    else:
        plan.run(op.args(**views), workspace=space, stream=handle)
    assert cupy.cuda.runtime.getDevice() == 0, "run() must restore the current device"
    with cupy.cuda.Device(device):
        cupy.cuda.runtime.deviceSynchronize()
    return {name: download_bits(view) for name, view in views.items()}


@pytest.mark.parametrize(("op", "impl"), GPU_SKUS, ids=[impl.sku.id for _, impl in GPU_SKUS])
def test_every_sku_runs_on_the_second_gpu(op, impl):
    import cupy

    cupy.cuda.runtime.setDevice(0)
    desc = _first_problem(op, impl)
    pref = PlanPreference(sku=impl.sku.id)
    inputs = verification_problem(op, desc, np.random.default_rng(7), "symmetric")
    first = Plan.select(desc, pref, device=0)
    second = Plan.select(desc, pref, device=1)
    assert second.target.device == 1 and cupy.cuda.runtime.getDevice() == 0

    on_first = _run(first, op, inputs, 0)
    on_second = _run(second, op, inputs, 1)
    scratch = _run(second, op, inputs, 1, workspace=False)
    prepared = _run(second, op, inputs, 1, prepared=True)
    null = _run(second, op, inputs, 1, workspace=False, null_stream=True)
    null_prepared = _run(second, op, inputs, 1, prepared=True, null_stream=True)

    check = reference_check(second, inputs)
    signature = op.signature(desc)
    for result in (on_second, null):
        for name in check.expected:
            error = check.relative_error(name, _from_bits(result[name], signature[name].element))
            assert error <= second.precision_guarantee.max_rel_error, (name, error)
    if second.precision_guarantee.deterministic:
        same_cards = device_name(0) == device_name(1)
        for name in check.expected:
            for other in (scratch, prepared, null, null_prepared):
                assert on_second[name].tobytes() == other[name].tobytes(), name
            if same_cards:  # one SKU, one problem, one kind of card: the same bits
                assert on_second[name].tobytes() == on_first[name].tobytes(), name

    # A plan refuses the other device's tensors, whichever way round.
    views = {name: _device_tensor(spec, 1, inputs.get(name) if spec.role != "out" else None)
             for name, spec in signature.items()}
    with pytest.raises(DeviceMismatch, match="selected for cuda:0"):
        first.run(op.args(**views))
    with pytest.raises(DeviceMismatch, match="selected for cuda:0"):
        first.can_implement(op.args(**views))


def test_library_handles_are_per_device():
    """cuDNN and cuBLASLt handles bind the device current when they are made: each device
    gets its own, whichever device is current when it is asked for."""
    import cupy

    from opfacade._backends.cublaslt import library
    from opfacade._backends.cudnn import runtime

    cupy.cuda.runtime.setDevice(0)
    assert runtime.handle_for(1) is not runtime.handle_for(0)
    assert runtime.handle_for(1) is runtime.handle_for(1)
    assert library.handle(1) != library.handle(0)
    assert cupy.cuda.runtime.getDevice() == 0


# --- the torch ops ---------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def _attention_inputs(torch, device, requires_grad=False):
    generator = torch.Generator(device="cpu").manual_seed(3)
    shapes = [(2, 8, 256, 64), (2, 2, 256, 64), (2, 2, 256, 64)]
    return [torch.randn(shape, generator=generator, dtype=torch.bfloat16).to(device)
            .requires_grad_(requires_grad) for shape in shapes]


def test_torch_sdpa_training_step_matches_across_devices():
    """Forward and deterministic backward of oft.sdpa on cuda:1 (cuda:0 current) give the bits
    they give on cuda:0."""
    torch = _torch()
    import opfacade.torch as oft

    torch.cuda.set_device(0)
    results = []
    for device in ("cuda:0", "cuda:1"):
        q, k, v = _attention_inputs(torch, device, requires_grad=True)
        out = oft.sdpa(q, k, v, is_causal=True, enable_gqa=True, deterministic=True)
        out.float().square().sum().backward()
        assert torch.cuda.current_device() == 0
        results.append([t.cpu() for t in (out.detach(), q.grad, k.grad, v.grad)])
    if torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1):
        for a, b in zip(*results, strict=True):
            assert torch.equal(a, b)
    reference = torch.nn.functional.scaled_dot_product_attention(
        *[t.to("cuda:1", torch.float64) for t in _attention_inputs(torch, "cpu")],
        is_causal=True, enable_gqa=True)
    assert torch.allclose(results[1][0].double(), reference.cpu(), atol=2e-2)


def test_torch_linear_on_the_second_gpu():
    torch = _torch()
    import opfacade.torch as oft

    torch.cuda.set_device(0)
    torch.manual_seed(5)
    dense = torch.nn.Linear(256, 512, device="cuda:1", dtype=torch.bfloat16)
    layer = oft.Linear.from_torch(dense, activation="gelu_tanh", deterministic=True)
    x = torch.randn(64, 256, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().sum().backward()
    assert y.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    expected = torch.nn.functional.gelu(
        torch.nn.functional.linear(x.double(), dense.weight.double(), dense.bias.double()),
        approximate="tanh")
    assert torch.allclose(y.double(), expected, atol=3e-2, rtol=2e-2)
    assert layer.weight.grad.device == torch.device("cuda:1")


def test_torch_ops_refuse_tensors_on_two_gpus():
    torch = _torch()
    import opfacade.torch as oft

    q, k, v = _attention_inputs(torch, "cuda:0")
    with pytest.raises(DeviceMismatch):
        oft.sdpa(q, k.to("cuda:1"), v, enable_gqa=True)
    x = torch.randn(16, 32, device="cuda:0", dtype=torch.bfloat16)
    w = torch.randn(8, 32, device="cuda:1", dtype=torch.bfloat16)
    with pytest.raises(DeviceMismatch):
        oft.linear(x, w)


def test_cuda_graph_captured_on_the_second_gpu_replays():
    """A CUDA graph of oft.sdpa captured on cuda:1 replays with new inputs, matching eager."""
    torch = _torch()
    import opfacade.torch as oft

    with torch.cuda.device(1):
        q, k, v = _attention_inputs(torch, "cuda:1")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            oft.sdpa(q, k, v, is_causal=True, enable_gqa=True)  # warm: plans, kernels
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = oft.sdpa(q, k, v, is_causal=True, enable_gqa=True)
        for seed in (11, 12):
            generator = torch.Generator(device="cpu").manual_seed(seed)
            for t in (q, k, v):
                t.copy_(torch.randn(t.shape, generator=generator, dtype=t.dtype))
            graph.replay()
            torch.cuda.synchronize(1)
            assert torch.equal(out, oft.sdpa(q, k, v, is_causal=True, enable_gqa=True))
