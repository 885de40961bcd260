"""A dimension of extent 1 has a stride that addresses nothing, and CuPy, torch and verify hand
such dimensions the dense stride whatever layout the buffer had (a one-row slice of rows padded
to 32 elements reports row stride N). Every GPU SKU's host checks must take that layout wherever
they take the layout the op's signature states. A held-out problem found the cuBLASLt backward
refusing a one-row aux of N = 25 this way (seed 20261208, H200); this runs the same question on
the host for every op's standard problems with each extent set to 1 in turn.
"""

from __future__ import annotations

import pytest

from opfacade import OpFacadeError
from opfacade._internal.contract import TensorSpec
from opfacade._internal.view import TensorView
from opfacade._registry import all_ops
from opfacade.types import BackendKind, ElementKind

OPS = all_ops()


def _dense(spec: TensorSpec) -> tuple[int, ...]:
    """The strides of a buffer holding ``spec`` in its storage order with nothing between
    elements: what a framework reports for every dimension, those of extent 1 included."""
    shape = tuple(spec.shape)
    order = (sorted(range(len(shape)), key=lambda d: -spec.strides[d]) if spec.strides
             else range(len(shape)))
    strides, running = [0] * len(shape), 1
    for d in reversed(list(order)):
        strides[d] = running
        running *= shape[d]
    return tuple(strides)


def _views(signature: dict[str, TensorSpec], dense: bool) -> dict[str, TensorView]:
    """Views of the signature's tensors at distinct 1 GiB-aligned device addresses: laid out as
    the spec says, or with every extent-1 dimension's stride the dense one."""
    views = {}
    for i, (name, spec) in enumerate(signature.items()):
        stated = tuple(spec.strides) if spec.strides else _dense(spec)
        strides = (tuple(d if n == 1 else s for n, s, d in zip(spec.shape, stated, _dense(spec),
                                                                 strict=True))
                   if dense else stated)
        views[name] = TensorView((i + 1) << 30, tuple(spec.shape), strides, spec.element, 0,
                                 "cupy", None)
    return views


def _problems(op):
    """The op's standard problems with each integer field set to 1, where that is valid."""
    for element in ElementKind:
        try:
            samples = op.sample_problems(element)
        except OpFacadeError:
            continue
        for desc in samples:
            fields = desc.model_dump()
            for field, value in fields.items():
                if isinstance(value, bool) or not isinstance(value, int) or value == 1:
                    continue
                try:
                    yield field, type(desc)(**{**fields, field: 1})
                except (OpFacadeError, ValueError):
                    continue


def _takes(op, impl, desc, views) -> str | None:
    """None when the bind and the SKU's checks take ``views``, else the error."""
    try:
        impl.check_args(desc, op.bind(desc, op.args(**views)))
    except OpFacadeError as error:
        return f"{type(error).__name__}: {error}"
    return None


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_every_sku_takes_dense_strides_on_extent_one_dimensions(op):
    checked, refused = 0, []
    for field, desc in _problems(op):
        signature = op.signature(desc)
        for impl in op.skus:
            if impl.sku.backend is BackendKind.reference or impl.unfit(desc) is not None:
                continue
            if _takes(op, impl, desc, _views(signature, dense=False)) is not None:
                continue  # the stated layout is what this SKU refuses: not the question here
            checked += 1
            error = _takes(op, impl, desc, _views(signature, dense=True))
            if error is not None:
                refused.append(f"{impl.sku.id} with {field}=1: {error}")
    assert not refused, "\n".join(refused[:10])
    assert checked or not any(impl.sku.backend is not BackendKind.reference for impl in op.skus)
