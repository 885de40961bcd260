"""ALiBi descriptors and argument checks, on the host (no GPU): every bad input is a typed error
that names the argument. GPU behaviour is in test_alibi_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from opfacade import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    DTypeMismatch,
    InvalidArgument,
    InvalidProblem,
    LayoutMismatch,
    Plan,
    ShapeMismatch,
    alibi_backward,
    alibi_forward,
)
from opfacade._backends.reference.alibi import alibi_forward as reference_forward

SHAPE = dict(batch=2, heads=3, query_len=5, key_len=7)
DIMS = (2, 3, 5, 7)


@pytest.mark.parametrize("field,value", [
    ("batch", 0), ("heads", -1), ("query_len", 0), ("key_len", 1 << 24), ("element", "i32"),
    ("element", "tf32"), ("element", "f128"), ("batch", "two"),
])
def test_descriptor_rejects_impossible_problems_naming_the_field(field, value):
    with pytest.raises(InvalidProblem, match=field) as caught:
        AlibiForwardDescriptor(**{**SHAPE, "element": "f32", field: value})
    assert caught.value.field == field


def test_descriptor_rejects_unknown_fields():
    with pytest.raises(InvalidProblem, match="bacth"):
        AlibiForwardDescriptor(**SHAPE, element="f32", bacth=2)


def test_slope_element_follows_the_accumulator():
    assert AlibiForwardDescriptor(**SHAPE, element="bf16").slope_element == "f32"
    assert AlibiForwardDescriptor(**SHAPE, element="f64").slope_element == "f64"


def host_forward(in_place=False):
    return Plan.select(AlibiForwardDescriptor(**SHAPE, element="f64", in_place=in_place),
                       device="cpu")


def test_forward_shape_dtype_and_layout_errors_name_the_argument():
    plan = host_forward()
    a, s, y = np.ones(DIMS), np.ones(3), np.empty(DIMS)
    with pytest.raises(ShapeMismatch, match=r"input must have shape \(2, 3, 5, 7\)"):
        plan.can_implement(AlibiForwardArgs(np.ones((2, 3, 5, 8)), s, y))
    with pytest.raises(ShapeMismatch, match="slopes"):
        plan.can_implement(AlibiForwardArgs(a, np.ones(4), y))
    with pytest.raises(DTypeMismatch, match="slopes must have element type f64"):
        plan.can_implement(AlibiForwardArgs(a, np.ones(3, np.float32), y))
    with pytest.raises(DTypeMismatch, match="output"):
        plan.can_implement(AlibiForwardArgs(a, s, np.empty(DIMS, np.float32)))
    with pytest.raises(LayoutMismatch, match="input must have unit stride"):
        plan.can_implement(AlibiForwardArgs(np.ones((2, 3, 7, 5)).transpose(0, 1, 3, 2), s, y))
    with pytest.raises(InvalidArgument, match="output is required"):
        plan.can_implement(AlibiForwardArgs(a, s))
    with pytest.raises(LayoutMismatch, match="output"):
        plan.can_implement(AlibiForwardArgs(a, s, a))
    with pytest.raises(InvalidArgument, match="input must be"):
        plan.can_implement(AlibiForwardArgs([[1.0]], s, y))


def test_forward_out_of_place_leaves_the_input_alone_and_in_place_writes_it():
    rng = np.random.default_rng(3)
    a, s = rng.uniform(-1, 1, DIMS), rng.uniform(0, 1, 3)
    before = a.copy()
    y = np.empty(DIMS)
    host_forward().run(AlibiForwardArgs(a, s, y))
    np.testing.assert_array_equal(a, before)
    np.testing.assert_allclose(y, reference_forward(a, s))
    host_forward(in_place=True).run(AlibiForwardArgs(a, s))
    np.testing.assert_array_equal(a, y)
    with pytest.raises(LayoutMismatch, match="output must be input itself"):
        host_forward(in_place=True).can_implement(AlibiForwardArgs(a, s, np.empty(DIMS)))


def test_backward_requires_exactly_the_outputs_it_computes():
    dy = np.ones(DIMS)
    only_slopes = Plan.select(
        AlibiBackwardDescriptor(**SHAPE, element="f64", need_input_grad=False), device="cpu")
    with pytest.raises(InvalidArgument, match="grad_input must be None"):
        only_slopes.can_implement(AlibiBackwardArgs(dy, np.empty(DIMS), np.empty(3)))
    with pytest.raises(InvalidArgument, match="grad_slopes is required"):
        only_slopes.can_implement(AlibiBackwardArgs(dy))
    full = Plan.select(AlibiBackwardDescriptor(**SHAPE, element="f64"), device="cpu")
    with pytest.raises(InvalidArgument, match="grad_input is required"):
        full.can_implement(AlibiBackwardArgs(dy, None, np.empty(3)))
    flat = np.ones(dy.size + 1)
    shifted = flat[1:].reshape(DIMS)  # overlaps grad_output without being it
    with pytest.raises(LayoutMismatch, match="grad_input"):
        full.can_implement(AlibiBackwardArgs(flat[:-1].reshape(DIMS), shifted, np.empty(3)))
    full.can_implement(AlibiBackwardArgs(dy, dy, np.empty(3)))  # exact aliasing: dA = dY


def test_functional_forms_on_the_host():
    rng = np.random.default_rng(4)
    a, s = rng.uniform(-1, 1, DIMS), rng.uniform(0, 1, 3)
    np.testing.assert_allclose(alibi_forward(a, s), reference_forward(a, s))
    d_in, d_slopes = alibi_backward(a)
    np.testing.assert_array_equal(d_in, a)
    assert d_slopes.shape == (3,)
    assert alibi_backward(a, need_input_grad=False)[0] is None
