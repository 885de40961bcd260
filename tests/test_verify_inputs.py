"""verify_plan's check that a run writes nothing into its inputs, on the host: still_holds reads a
device input back as download_bits does (a buffer in storage order, indexed by the view's
strides) and compares its bits with those uploaded (uploaded_bits), and a result with a changed
input fails. (verify_plan itself runs on a GPU: test_precision_gpu.py and ``opfacade verify``.)"""

from __future__ import annotations

import numpy as np
import pytest

from opfacade._internal.contract import TensorSpec
from opfacade._internal.view import TensorView
from opfacade.testing import VerificationResult, _to_bits, still_holds, uploaded_bits
from opfacade.types import ElementKind


class _Buffer:
    """A host stand-in for the CuPy buffer behind a device input: ``get`` copies it out."""

    def __init__(self, storage: np.ndarray) -> None:
        self.storage = storage

    def get(self) -> np.ndarray:
        return self.storage.copy()


def _input(values: np.ndarray, spec: TensorSpec, order: tuple[int, ...]) -> TensorView:
    """``values`` laid out in ``order`` (outermost dimension first), as _device_tensor stores an
    input whose strides are a permutation of a dense layout."""
    storage = np.ascontiguousarray(_to_bits(values, spec.element).transpose(order))
    strides = [0] * len(spec.shape)
    running = 1
    for d in reversed(order):
        strides[d] = running
        running *= spec.shape[d]
    return TensorView(0x1000, tuple(spec.shape), tuple(strides), spec.element, 0, "cupy",
                      _Buffer(storage))


@pytest.mark.parametrize("element", [ElementKind.bf16, ElementKind.f32, ElementKind.i32])
@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2)])
def test_an_input_holds_its_bits_until_one_element_changes(element, order):
    rng = np.random.default_rng(3)
    values = rng.integers(-50, 50, (3, 4, 5)) if element is ElementKind.i32 else \
        rng.standard_normal((3, 4, 5))
    if element is not ElementKind.i32:
        values[2, 3, 4] = np.nan  # cache content past a length: compared as bits
    spec = TensorSpec((3, 4, 5), element)
    view = _input(values, spec, order)
    assert still_holds(view, uploaded_bits(values, spec))
    flat = view.obj.storage.reshape(-1)
    flat[11] = flat[11] + 1  # one element (not the NaN) written by a run
    assert not still_holds(view, uploaded_bits(values, spec))


def test_a_result_whose_run_wrote_an_input_fails_and_says_which():
    kept = VerificationResult(sku="s", descriptor={}, runs=2, max_rel_error=1e-3,
                              rel_errors={"out": 1e-4}, bitwise_equal=True,
                              deterministic_declared=True, seconds=0.1)
    written = VerificationResult(sku="s", descriptor={}, runs=2, max_rel_error=1e-3,
                                 rel_errors={"out": 1e-4}, bitwise_equal=True,
                                 deterministic_declared=True, seconds=0.1,
                                 inputs_changed=["k"])
    assert kept.passed and kept.to_dict()["inputs_changed"] == []
    assert not written.passed and written.to_dict()["inputs_changed"] == ["k"]
    assert "inputs the run wrote into: ['k']" in written.summary()
