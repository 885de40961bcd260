"""Every GPU SKU keeps its declared bound on every input distribution (testing.DISTRIBUTIONS):
symmetric, positive-only, heavy-tailed with outliers, and large magnitudes near the type's range,
each on all the sample problems the SKU serves, against the float64 reference and relative to
the op's magnitude reference (PrecisionGuarantee states the form)."""

from __future__ import annotations

import pytest

from opfacade._registry import all_ops
from opfacade.testing import DISTRIBUTIONS, verify_sku
from opfacade.types import BackendKind

pytestmark = pytest.mark.gpu

GPU_SKUS = [impl.sku.id for op in all_ops() for impl in op.skus
            if impl.sku.backend is not BackendKind.reference]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("sku_id", GPU_SKUS)
def test_sku_keeps_its_bound(sku_id, distribution):
    results = verify_sku(sku_id, runs=2, seed=2026, distributions=(distribution,))
    assert results, f"{sku_id} serves none of its op's sample problems"
    failures = [r.summary() for r in results if not r.passed]
    assert not failures, "\n".join(failures)
