"""Bad input to every GPU SKU, on the host: for every op's standard problems and every GPU SKU that
serves them, each tensor in turn with another element type, a last extent one too long, or an
address one element off its allocation. The bind and the SKU's host checks must raise an
OpFacadeError whose ``argument`` is that tensor, or (for the address alone) take it where the
SKU reads any alignment: never another exception, and never a wrong element type or extent
taken. The per-op tests name the messages; this holds the rule for SKUs added later.
"""

from __future__ import annotations

import dataclasses

import pytest

from opfacade import OpFacadeError
from opfacade._internal.contract import TensorSpec
from opfacade._internal.view import TensorView
from opfacade._registry import all_ops
from opfacade.types import BackendKind, ElementKind

OPS = all_ops()
# Another element type of the same kind of tensor (floats to floats, indices to floats).
OTHER = {ElementKind.f64: ElementKind.f32, ElementKind.f32: ElementKind.f16,
         ElementKind.f16: ElementKind.bf16, ElementKind.bf16: ElementKind.f16,
         ElementKind.i32: ElementKind.f32, ElementKind.u8: ElementKind.i32}


def _view(spec: TensorSpec, ptr: int) -> TensorView:
    """A view of ``spec`` as its signature lays it out (C order unless it states strides)."""
    strides = spec.strides
    if not strides:
        strides, running = [], 1
        for extent in reversed(spec.shape):
            strides.insert(0, running)
            running *= extent
    return TensorView(ptr, tuple(spec.shape), tuple(strides), spec.element, 0, "cupy", None)


def _mutations(view: TensorView) -> dict[str, TensorView]:
    mutated = {"address": dataclasses.replace(view, ptr=view.ptr + view.element.itemsize)}
    if view.element in OTHER:
        mutated["element type"] = dataclasses.replace(view, element=OTHER[view.element])
    if view.shape:
        mutated["last extent"] = dataclasses.replace(view, shape=(*view.shape[:-1],
                                                             view.shape[-1] + 1))
    return mutated


def _check(op, impl, desc, views: dict[str, TensorView]) -> None:
    impl.check_args(desc, op.bind(desc, op.args(**views)))


def _served(op):
    """(descriptor, SKU) for every standard problem and every GPU SKU that serves it."""
    for element in ElementKind:
        try:
            samples = op.sample_problems(element)
        except OpFacadeError:
            continue
        for desc in samples:
            for impl in op.skus:
                if impl.sku.backend is not BackendKind.reference and impl.unfit(desc) is None:
                    yield desc, impl


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_bad_input_to_any_sku_is_a_typed_error_naming_the_tensor(op):
    wrong, pairs = [], 0
    for desc, impl in _served(op):
        signature = op.signature(desc)
        views = {name: _view(spec, (i + 1) << 30) for i, (name, spec) in
                 enumerate(signature.items())}
        _check(op, impl, desc, views)  # the signature's own layout is taken
        pairs += 1
        for name, view in views.items():
            for how, mutated in _mutations(view).items():
                where = f"{impl.sku.id}, {name} given a wrong {how} ({desc!r})"
                try:
                    _check(op, impl, desc, {**views, name: mutated})
                except OpFacadeError as error:
                    if error.argument != name:
                        wrong.append(f"{where}: names {error.argument!r}: {error}")
                    continue
                except Exception as error:  # noqa: BLE001 (what this test is for)
                    wrong.append(f"{where}: untyped {type(error).__name__}: {error}")
                    continue
                if how != "address":
                    wrong.append(f"{where}: taken")
    assert not wrong, "\n".join(wrong[:10])
    assert pairs or not any(impl.sku.backend is not BackendKind.reference for impl in op.skus)
