"""``capture_safe`` is a claim like any other: every GPU SKU that declares it is captured in a
CUDA graph (with its workspace given), replayed into poisoned outputs, and must write the bits an
eager run writes."""

from __future__ import annotations

import numpy as np
import pytest

from opfacade import Plan, PlanPreference, Workspace
from opfacade._registry import all_ops
from opfacade.testing import _device_tensor, download_bits, random_inputs
from opfacade.types import BackendKind

pytestmark = pytest.mark.gpu


def _claims():
    for op in all_ops():
        for impl in op.skus:
            sku = impl.sku
            if sku.backend is BackendKind.reference or not sku.precision_guarantee.capture_safe:
                continue
            # Out-of-place problems only: an in-place run changes its own input between runs.
            served = [d for d in op.sample_problems(sku.element) if impl.unfit(d) is None
                      and all(spec.role != "inout" for spec in op.signature(d).values())]
            if served:
                yield pytest.param(op, sku.id, served[len(served) // 2], id=sku.id)


@pytest.mark.parametrize("op,sku,desc", list(_claims()))
def test_capture_safe_skus_replay_from_a_cuda_graph(op, sku, desc):
    import cupy

    plan = Plan.select(desc, PlanPreference(sku=sku), device=0)
    signature = op.signature(desc)
    inputs = random_inputs(signature, np.random.default_rng(11))
    if op.verification_inputs is not None:
        inputs = op.verification_inputs(desc, inputs, np.random.default_rng(11))
    views = {name: _device_tensor(spec, 0, inputs.get(name) if spec.role != "out" else None)
             for name, spec in signature.items()}
    outputs = [name for name, spec in signature.items() if spec.role != "in"]
    pool = cupy.empty(plan.workspace_size + Workspace.ALIGNMENT, dtype=cupy.uint8)
    base = Workspace.round_up(pool.data.ptr)
    workspace = Workspace(base, plan.workspace_size, 0, pool)
    args = op.args(**views)
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()
    plan.run(args, workspace=workspace, stream=stream.ptr)  # eager, and the warm-up
    stream.synchronize()
    eager = {name: download_bits(views[name]) for name in outputs}

    with stream:
        stream.begin_capture()
        plan.run(args, workspace=workspace, stream=stream.ptr)
        graph = stream.end_capture()
    for name in outputs:
        views[name].obj.view(cupy.uint8).fill(0xFF)  # poison, then replay
    cupy.cuda.runtime.deviceSynchronize()
    graph.launch(stream)
    stream.synchronize()
    for name in outputs:
        assert download_bits(views[name]).tobytes() == eager[name].tobytes(), name
