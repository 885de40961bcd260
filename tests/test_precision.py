"""The form of every precision bound, on the host: magnitude references, the input distributions
verify draws from, and the relative error they are combined in. The GPU side (every SKU on every
distribution) is tests/test_precision_gpu.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opfacade import testing
from opfacade._backends.reference import alibi_backward
from opfacade._backends.reference import linear as linear_math
from opfacade._backends.reference.alibi import alibi_backward_magnitude, alibi_distance
from opfacade._registry import all_ops
from opfacade.errors import InvalidArgument
from opfacade.plan import plan_class
from opfacade.testing import DISTRIBUTIONS, reference_check, relative_error, verification_problem
from opfacade.types import ElementKind, PlanPreference

OPS = all_ops()


def _first_samples(op, count: int = 3) -> list:
    """The op's first sample problems in the first GPU element it has samples for."""
    for element in (ElementKind.bf16, ElementKind.f16, ElementKind.f32):
        try:
            return op.sample_problems(element)[:count]
        except Exception:  # noqa: BLE001 - an element this op has no samples in
            continue
    raise AssertionError(f"{op.name} has no sample problems")


def _host_plan(op, desc):
    f64 = {"element": ElementKind.f64} | ({"tf32": False} if getattr(desc, "tf32", False) else {})
    return plan_class(op.name).select(desc.model_copy(update=f64),
                                      PlanPreference(backends={"reference"}), device="cpu")


CASES = [pytest.param(op, desc, id=f"{op.name}-{i}") for op in OPS
         for i, desc in enumerate(_first_samples(op))]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize(("op", "desc"), CASES)
def test_magnitude_reference_bounds_every_result_and_results_stay_finite(op, desc, distribution):
    rng = np.random.default_rng(5)
    inputs = verification_problem(op, desc, rng, distribution)
    check = reference_check(_host_plan(op, desc), inputs)
    signature = op.signature(desc)
    for name, want in check.expected.items():
        size = check.magnitudes[name]
        assert np.isfinite(size).all(), name
        allowance = check.allowances[name]
        assert allowance.shape == want.shape and (allowance >= 0).all(), name
        finite = np.isfinite(want)
        if name in ("stats", "lse"):  # an empty row's log-sum-exp is -inf by definition
            assert (want[~finite] == -np.inf).all()
        else:
            assert finite.all(), name
        assert (np.abs(want[finite]) <= size[finite] * (1 + 1e-12) + 1e-300).all(), name
        # The result fits its element's range: nothing the GPU writes would overflow.
        element = signature[name].element
        assert np.abs(want[finite]).max(initial=0) < 2.0 ** (element.max_exponent + 1), name


@pytest.mark.parametrize(("op", "desc"), CASES)
def test_large_distribution_reaches_near_the_top_of_some_input_range(op, desc):
    """At least one input of every problem sits within 2**-10 of its type's largest exponent:
    the reductions' headroom decides how far the others must stay below it."""
    inputs = verification_problem(op, desc, np.random.default_rng(6), "large")
    signature = op.signature(desc)
    reach = max(math.log2(np.abs(value).max()) - signature[name].element.max_exponent
                for name, value in inputs.items()
                if signature[name].element.is_float and np.abs(value).max() > 0)
    assert reach >= -10, reach


def test_every_op_has_large_scales_and_a_magnitude_reference():
    for op in OPS:
        assert op.large_scales is not None, op.name
        reference = [impl for impl in op.skus if impl.sku.backend == "reference"]
        assert reference and callable(reference[0].magnitude), op.name


def test_heavy_tailed_inputs_are_dominated_by_few_values_and_stay_within_one():
    values = testing._draw("heavy_tailed", (200_000,), np.random.default_rng(1))
    magnitude = np.abs(values)
    assert magnitude.max() <= 1.0
    assert magnitude.max() > 100 * np.median(magnitude)
    top = np.sort(magnitude)[-2000:]  # 1% of the values carry over a tenth of the total
    assert top.sum() > 0.1 * magnitude.sum()


def test_positive_inputs_are_positive_and_symmetric_ones_cancel():
    rng = np.random.default_rng(2)
    assert (testing._draw("positive", (1000,), rng) >= 0).all()
    symmetric = testing._draw("symmetric", (100_000,), rng)
    assert abs(symmetric.sum()) < 0.01 * np.abs(symmetric).sum()


def test_unknown_distribution_is_a_typed_error():
    with pytest.raises(InvalidArgument, match="distribution"):
        testing.random_inputs({}, np.random.default_rng(0), "gaussian")


def test_relative_error_is_measured_against_the_magnitude():
    ref = np.array([1.0, -1.0])
    out = np.array([1.0, -1.0 + 1e-3])
    assert relative_error(out, ref) == pytest.approx(1e-3 / math.sqrt(2))
    assert relative_error(out, ref, np.array([100.0, 100.0])) == pytest.approx(
        1e-3 / math.sqrt(2e4))
    # Matching infinities (an empty attention row's log-sum-exp) are no error; NaN is infinite.
    assert relative_error(np.array([-np.inf, 2.0]), np.array([-np.inf, 2.0])) == 0.0
    assert relative_error(np.array([np.nan, 2.0]), np.array([1.0, 2.0])) == math.inf
    # Values near float64's range do not overflow the norms' squares.
    big = np.array([1e300, 1e300])
    assert relative_error(big * (1 + 1e-10), big) == pytest.approx(1e-10, rel=1e-3)


def test_slope_gradient_error_depends_on_the_data_only_in_the_plain_form():
    """The issue's case: with dY uniform in [0, 1), dslope = sum dY (j - i) cancels ((j - i)
    changes sign), so the plain relative error of an f32 sum grows with the cancellation:
    here a blocked sum (1024-term blocks, as a kernel sums) is 5e-4 off in the plain form, 50
    times the old 1e-5 bound, and 2e-8 against sum |dY| |j - i|."""
    rng = np.random.default_rng(3)
    dy = rng.uniform(0.0, 1.0, (4, 1, 512, 512)).astype(np.float32).astype(np.float64)
    _, exact = alibi_backward(dy, need_input_grad=False)
    _, size = alibi_backward_magnitude(dy, need_input_grad=False)
    terms = (dy * alibi_distance(512, 512)).astype(np.float32).reshape(-1, 1024)
    blocked = terms.sum(axis=1, dtype=np.float32).sum(dtype=np.float32, keepdims=True)
    assert relative_error(blocked, exact) > 1e-4
    assert relative_error(blocked, exact, size) < 1e-7


def test_activation_steepest_slopes_bound_the_derivatives():
    x = np.linspace(-12, 12, 200_001)
    for name, slope in linear_math._STEEPEST_SLOPE.items():
        assert np.abs(linear_math.activation_grad(x, name)).max() <= slope, name
        assert (np.abs(linear_math.activation(x, name)) <= np.abs(x) + 1e-15).all(), name


def test_relative_error_subtracts_the_underflow_allowance():
    ref = np.array([1.0, 1.0])
    out = np.array([1.0 + 3e-3, 1.0])
    assert relative_error(out, ref, allowance=np.array([1e-3, 0.0])) == pytest.approx(2e-3 / 2**0.5)
    assert relative_error(out, ref, allowance=np.array([1e-2, 0.0])) == 0.0


def test_element_facts_match_numpy_and_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for element, dtype in ((ElementKind.f16, np.float16), (ElementKind.f32, np.float32),
                           (ElementKind.f64, np.float64), (ElementKind.bf16, ml_dtypes.bfloat16),
                           (ElementKind.fp8_e4m3, ml_dtypes.float8_e4m3fn),
                           (ElementKind.fp8_e5m2, ml_dtypes.float8_e5m2)):
        info = ml_dtypes.finfo(dtype)
        assert element.subnormal_spacing == float(info.smallest_subnormal), element
        assert math.frexp(float(info.max))[1] - 1 == element.max_exponent, element
        assert element.unit_roundoff == float(info.eps) / 2, element


def test_f16_gradient_underflow_is_covered_by_the_allowance_and_only_by_it():
    """A backward that rounds d_pre to f16 before its GEMMs (as the GPU SKUs do) loses up to
    2**-24 per term when d_pre is tiny: far more than any relative bound of the magnitude, and
    within the underflow allowance."""
    rng = np.random.default_rng(4)
    x, w = rng.uniform(-1, 1, (64, 48)), rng.uniform(-1, 1, (48, 32))
    dy = rng.uniform(-1, 1, (64, 32)) * 2.0 ** -22  # d_pre deep in f16's subnormals
    pre = rng.uniform(-1, 1, (64, 32))
    exact = linear_math.linear_backward(dy, x, w, pre)["dx"]
    rounded = dy.astype(np.float16).astype(np.float64)  # what the GEMM then reads
    gpu_like = rounded @ w.T
    size = linear_math.linear_backward_magnitude(dy, x, w, pre)["dx"]
    floor = linear_math.linear_backward_underflow(dy, x, w, unit=2.0 ** -24)["dx"]
    assert relative_error(gpu_like, exact, size) > 1e-2
    assert relative_error(gpu_like, exact, size, floor) == 0.0
