"""Any stride on an extent-1 dimension, on a GPU: every GPU SKU, on its op's standard problems
with each extent set to 1 in turn (one problem per SKU and field), runs on views whose extent-1
dimensions carry a stride of 7 elements and writes what it writes through the dense views of the
same buffers: the same bits where it declares determinism, else an error within its bound of the
float64 reference for each.

Such a stride addresses nothing, and a hand-built view may hold one; SKUs whose stride rules ask
for multiples of 8 elements (cuDNN's decode and varlen graphs, kv_append) refused it until Plan
settled each extent-1 stride to the signature's (``contract.settled``) before any SKU's checks,
graph keys or launch read it. The host side of the rule, without a GPU:
test_host_checks_every_sku.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_host_checks_every_sku import _gpu_skus, _refusal, _views, _with_an_extent_of_one

from opfacade import Plan, PlanPreference
from opfacade._internal.device_buffers import _device_tensor, _from_bits, download_bits
from opfacade._registry import all_ops
from opfacade.testing import reference_check, verification_problem

pytestmark = pytest.mark.gpu

OPS = all_ops()
ODD = 7  # elements: no multiple of 8, nor of a row


def _one_problem_per_sku_and_field(op) -> dict[tuple[str, str], object]:
    """Where the SKU takes the layout the signature states (test_host_checks_every_sku's rule)."""
    problems = {}
    for field, desc in _with_an_extent_of_one(op):
        stated = _views(op.signature(desc))
        for impl in _gpu_skus(op, desc):
            if (impl.sku.id, field) not in problems and _refusal(op, impl, desc, stated) is None:
                problems[impl.sku.id, field] = desc
    return problems


def _outputs(plan, op, inputs, expected, odd: bool) -> dict[str, np.ndarray]:
    """The plan's outputs (raw bits, logical order) on fresh buffers holding ``inputs``, through
    dense views or through the same buffers' views with every extent-1 stride ODD."""
    import cupy

    signature = op.signature(plan.descriptor)
    views = {name: _device_tensor(spec, 0, inputs.get(name) if spec.role != "out" else None)
             for name, spec in signature.items()}
    if odd:
        views = {name: dataclasses.replace(view, strides=tuple(
                     ODD if extent == 1 else stride
                     for extent, stride in zip(view.shape, view.strides, strict=True)))
                 for name, view in views.items()}
    cupy.cuda.runtime.deviceSynchronize()  # the uploads
    plan.run(op.args(**views))
    cupy.cuda.runtime.deviceSynchronize()
    return {name: download_bits(views[name]) for name in expected}


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_a_stride_of_7_on_extent_one_dimensions_gives_the_dense_views_result(op):
    differing, ran = [], 0
    rng = np.random.default_rng(7)
    for (sku_id, field), desc in _one_problem_per_sku_and_field(op).items():
        with Plan.select(desc, PlanPreference(sku=sku_id), device=0) as plan:
            inputs = verification_problem(op, desc, rng)
            check = reference_check(plan, inputs)
            dense = _outputs(plan, op, inputs, check.expected, odd=False)
            odd = _outputs(plan, op, inputs, check.expected, odd=True)
            ran += 1
            signature = op.signature(desc)
            for name in check.expected:
                if plan.precision_guarantee.deterministic:
                    same = dense[name].tobytes() == odd[name].tobytes()
                else:
                    bound = plan.precision_guarantee.max_rel_error
                    same = all(check.relative_error(name, _from_bits(bits[name],
                                                                     signature[name].element))
                               <= bound for bits in (dense, odd))
                if not same:
                    differing.append(f"{sku_id} with {field}=1: {name}")
    assert ran
    assert not differing, "\n".join(differing[:10])
