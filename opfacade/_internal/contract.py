"""What every op family's contract module declares, and what its backends import.

A family (alibi, linear, sdpa, ...) has one contract module in ``opfacade/contracts/``: its
descriptors (the problem), its Args (the tensors), the layouts of what a forward saves for its
backward, the bind that wraps and checks a call's tensors, and one ``OpContract`` per op. Backends
implement SKUs against those types; ``opfacade/_registry.py`` joins each contract to its SKUs in
one table. Nothing here imports a backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from pydantic import ConfigDict

from ..errors import InvalidProblem
from ..types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    OpCategory,
    PrecisionGuarantee,
)
from .tensors import TensorView
from .validation import CheckedModel
from .view import c_strides

__all__ = ["BoundArgs", "Descriptor", "OpContract", "TensorSpec", "bits_for", "settled",
           "stated_strides"]


class Descriptor(CheckedModel):
    """A problem statement: frozen (hashable, a plan-cache key), storage-free, self-validating.

    Every way of making one (the constructor, ``model_validate``, ``model_validate_json``,
    ``from_json``, ``model_copy(update=...)``) validates, and a failure is ``InvalidProblem``
    naming the field, never pydantic's own error.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    @classmethod
    def from_json(cls, text: str | bytes):
        """Round trip of ``model_dump_json`` (for logs and bug reports), with typed errors."""
        if not isinstance(text, str | bytes | bytearray):
            raise InvalidProblem(f"{cls.__name__}.from_json takes a JSON string, got "
                                 f"{type(text).__name__}", field="text")
        return cls.model_validate_json(text)


D = TypeVar("D", bound=Descriptor)


@dataclass(frozen=True)
class BoundArgs:
    """A run's tensors, wrapped once at the edge and checked against the descriptor."""

    views: dict[str, TensorView | None]
    outputs: tuple[str, ...]

    def __post_init__(self) -> None:
        # run() consults these several times; compute them once per bind.
        present = {name: view for name, view in self.views.items() if view is not None}
        object.__setattr__(self, "_present", present)
        first = next(iter(present.values()), None)
        object.__setattr__(self, "device", None if first is None else first.device)

    def __getitem__(self, name: str) -> TensorView | None:
        return self.views[name]

    def present(self) -> dict[str, TensorView]:
        return self._present


@dataclass(frozen=True)
class TensorSpec:
    """One argument of an op for a given descriptor: what verify and the bench allocate.

    ``role`` is "in", "out" or "inout" (an in-place input that is also the result).
    ``strides`` (in elements) when the op needs a layout other than C order, e.g. attention's
    [B, H, S, D] tensors stored as BSHD; a permutation of a dense layout.
    """

    shape: tuple[int, ...]
    element: ElementKind
    role: str = "in"
    strides: tuple[int, ...] | None = None


def stated_strides(signature: dict[str, TensorSpec]) -> dict[str, tuple[tuple, tuple]]:
    """Each tensor's (shape, strides) as the op's signature states them (C order unless the
    spec gives strides): what ``settled`` reads, worked out once per plan."""
    return {name: (tuple(spec.shape), tuple(spec.strides) if spec.strides
                   else c_strides(tuple(spec.shape)))
            for name, spec in signature.items()}


def settled(bound: BoundArgs, stated: dict[str, tuple[tuple, tuple]]) -> BoundArgs:
    """``bound`` with the stride of each extent-1 dimension set to the one the op's signature
    states (``stated_strides``; C order of the view's own shape where that differs from the
    signature's, a batch under a plan's envelope say).

    Such a stride addresses nothing, and callers hand any value there: frameworks report the
    dense one whatever the buffer, and a hand-built view may hold 7. The SKUs' stride rules
    (multiples of 8 elements for cuDNN's 16-byte loads and kv_append's stores, cuBLASLt's aux
    rows padded to 8), their recipe and graph keys and their launches then read the layout the
    signature states (cuBLASLt's canonical strides, where its padded aux rows are one), where
    they would refuse, or build again, for a stride that nothing reads. Views without an extent-1
    dimension, the common case on every checked call, come back as they are."""
    views = bound.views
    changed = {}
    for name, view in views.items():
        if view is None or 1 not in view.shape:
            continue
        shape, want = stated.get(name, (None, None))
        if shape != view.shape:
            want = c_strides(view.shape)
        strides = tuple([w if n == 1 else s for n, s, w in zip(view.shape, view.strides, want,
                                                                strict=True)])
        if strides != view.strides:
            changed[name] = replace(view, strides=strides)
    return BoundArgs({**views, **changed}, bound.outputs) if changed else bound


@dataclass(frozen=True)
class OpContract(Generic[D]):
    """One op of a family (alibi_forward, sdpa_backward, ...) as its contract states it."""

    name: str
    category: OpCategory
    descriptor: type[D]
    args: type
    bind: Callable[[D, Any], BoundArgs]  # (descriptor, args) -> checked BoundArgs
    summary: str
    # The op's arguments for a descriptor (name -> spec), in Args field order; None is omitted.
    signature: Callable[[D], dict[str, TensorSpec]]
    # Small standard problems for one element type, used by `opfacade verify` and the GPU tests.
    sample_problems: Callable[[ElementKind], list[D]]
    # For a forward op used in training: the backward problem its saved tensors feed. Selecting
    # for training selects that backward too, so no forward is chosen whose backward cannot run.
    training_backward: Callable[[D], Descriptor] | None = None
    # Verification inputs that random values cannot be (the saved stats a backward consumes,
    # valid sequence lengths): (descriptor, random inputs, rng) -> inputs to use instead.
    verification_inputs: Callable[[D, dict, Any], dict] | None = None
    # The "large" verification distribution: a power-of-two multiplier per input name, putting
    # the largest inputs near the top of their type's range while every result (and every
    # intermediate the kernels hold) stays finite. Inputs not named keep their [-1, 1) values.
    large_scales: Callable[[D], dict[str, float]] | None = None

    def sku(self, backend: BackendKind, element: ElementKind, *, guarantee: PrecisionGuarantee,
            layout: str, arch: ArchSku | None, description: str, variant: str = "",
            qualifier: str = "", aux_element: ElementKind | None = None,
            epilogue: str | None = None) -> KernelSku:
        """The catalog entry of one SKU of this op. Its id is
        ``op.backend[+variant].element[.qualifier]`` (``op.reference`` for the host oracle):
        the one naming scheme of every SKU, e.g. ``linear_forward.cublaslt+act.bf16`` or
        ``sdpa_backward.cudnn.f16.deterministic``."""
        backend_part = backend.value + (f"+{variant}" if variant else "")
        sku_id = (f"{self.name}.{backend_part}" if backend is BackendKind.reference
                  else f"{self.name}.{backend_part}.{element.value}")
        if qualifier:
            sku_id += f".{qualifier}"
        return KernelSku(id=sku_id, category=self.category, op=self.name, element=element,
                         aux_element=aux_element, layout=layout, epilogue=epilogue, arch=arch,
                         backend=backend, precision_guarantee=guarantee, description=description)


def bits_for(count: float) -> int:
    """ceil(log2(count)), 0 for count <= 1: the exponent headroom a sum of ``count`` terms of one
    size needs (the contracts' ``large_scales``)."""
    return math.ceil(math.log2(count)) if count > 1 else 0
