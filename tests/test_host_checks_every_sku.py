"""Every GPU SKU's host checks (the op's bind, then the SKU's check_args), without a GPU, on every
op's standard problems and every GPU SKU that serves them:

- Bad input: each tensor in turn with another element type, a last extent one too long, or an
  address one element off its allocation must raise an OpFacadeError whose ``argument`` is that
  tensor (the address may be taken, where the SKU reads any alignment): never another exception,
  and never a wrong element type or extent taken. The per-op tests name the messages; this holds
  the rule for SKUs added later.
- Extent-1 dimensions: such a dimension's stride addresses nothing, and CuPy, torch and verify
  report the dense stride there whatever the buffer's layout (a one-row slice of rows padded to
  32 elements reports row stride N). Wherever a SKU takes the layout the op's signature states,
  it must take that one too, on the standard problems with each extent set to 1 in turn. A
  held-out problem found the cuBLASLt backward refusing a one-row aux of N = 25 this way (seed
  20261208, H200). Any other stride there (7, 0) too: Plan settles those strides to the
  signature's before any SKU reads them (``contract.settled``), and ``_check`` binds as Plan
  does.
"""

from __future__ import annotations

import dataclasses

import pytest

from opfacade import OpFacadeError
from opfacade._internal.contract import TensorSpec, settled, stated_strides
from opfacade._internal.view import TensorView
from opfacade._registry import all_ops
from opfacade.testing import storage_layout
from opfacade.types import BackendKind, ElementKind

OPS = all_ops()
# Another element type of the same kind of tensor (floats to floats, indices to floats).
OTHER = {ElementKind.f64: ElementKind.f32, ElementKind.f32: ElementKind.f16,
         ElementKind.f16: ElementKind.bf16, ElementKind.bf16: ElementKind.f16,
         ElementKind.i32: ElementKind.f32, ElementKind.u8: ElementKind.i32}


def _standard_problems(op):
    for element in ElementKind:
        try:
            yield from op.sample_problems(element)
        except OpFacadeError:
            continue


def _gpu_skus(op, desc):
    return [impl for impl in op.skus
            if impl.sku.backend is not BackendKind.reference and impl.unfit(desc) is None]


def _views(signature: dict[str, TensorSpec], extent_one: str | int | None = None
           ) -> dict[str, TensorView]:
    """Views of the signature's tensors at distinct 1 GiB-aligned device addresses, laid out as
    each spec says, or with every extent-1 dimension's stride the dense one (``extent_one``
    "dense") or the int given."""
    views = {}
    for i, (name, spec) in enumerate(signature.items()):
        dense = storage_layout(spec)[1]  # what verify's buffers and the frameworks report
        strides = tuple(spec.strides) if spec.strides else dense
        if extent_one is not None:
            strides = tuple((d if extent_one == "dense" else extent_one) if n == 1 else s
                            for n, s, d in zip(spec.shape, strides, dense, strict=True))
        views[name] = TensorView((i + 1) << 30, tuple(spec.shape), strides, spec.element, 0,
                                 "cupy", None)
    return views


def _check(op, impl, desc, views: dict[str, TensorView]) -> None:
    """The op's bind, the extent-1 strides settled, the SKU's checks: as Plan._bind runs them."""
    impl.check_args(desc, settled(op.bind(desc, op.args(**views)),
                                  stated_strides(op.signature(desc))))


def _refusal(op, impl, desc, views: dict[str, TensorView]) -> str | None:
    """None when the checks take ``views``, else the typed error."""
    try:
        _check(op, impl, desc, views)
    except OpFacadeError as error:
        return f"{type(error).__name__}: {error}"
    return None


def _mutations(view: TensorView) -> dict[str, TensorView]:
    mutated = {"address": dataclasses.replace(view, ptr=view.ptr + view.element.itemsize)}
    if view.element in OTHER:
        mutated["element type"] = dataclasses.replace(view, element=OTHER[view.element])
    if view.shape:
        mutated["last extent"] = dataclasses.replace(view, shape=(*view.shape[:-1],
                                                                  view.shape[-1] + 1))
    return mutated


def _has_gpu_skus(op) -> bool:
    return any(impl.sku.backend is not BackendKind.reference for impl in op.skus)


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_bad_input_to_any_sku_is_a_typed_error_naming_the_tensor(op):
    wrong, pairs = [], 0
    for desc in _standard_problems(op):
        views = _views(op.signature(desc))
        for impl in _gpu_skus(op, desc):
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
    assert pairs or not _has_gpu_skus(op)


def _with_an_extent_of_one(op):
    """The op's standard problems with each integer field set to 1, where that is valid."""
    for desc in _standard_problems(op):
        fields = desc.model_dump()
        for field, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, int) or value == 1:
                continue
            try:
                yield field, type(desc)(**{**fields, field: 1})
            except (OpFacadeError, ValueError):
                continue


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_every_sku_takes_any_stride_on_extent_one_dimensions(op):
    checked, refused = 0, []
    for field, desc in _with_an_extent_of_one(op):
        signature = op.signature(desc)
        for impl in _gpu_skus(op, desc):
            if _refusal(op, impl, desc, _views(signature)) is not None:
                continue  # the stated layout is what this SKU refuses: not the question here
            checked += 1
            for stride in ("dense", 7, 0):
                error = _refusal(op, impl, desc, _views(signature, extent_one=stride))
                if error is not None:
                    refused.append(f"{impl.sku.id} with {field}=1, stride {stride}: {error}")
    assert not refused, "\n".join(refused[:10])
    assert checked or not _has_gpu_skus(op)
