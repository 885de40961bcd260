"""The float64 reference as a host SKU: the oracle behind tests and `opfacade verify`.

Selection never offers it for a GPU target (reason ``reference_is_oracle``); it is chosen only for
``device='cpu'``, with NumPy arrays, for debugging and for checking the GPU SKUs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._internal.sku import BoundArgs, SkuImpl, Workspace
from ..._internal.tensors import as_numpy
from ...types import (
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PrecisionGuarantee,
)

REFERENCE_GUARANTEE = PrecisionGuarantee(
    math_precision=MathPrecision.f64,
    accumulator=ElementKind.f64,
    deterministic=True,
    bit_stable=True,
    max_rel_error=1e-14,
    capture_safe=False,  # runs on the host
)

# compute(descriptor, arrays by argument name) -> results by output argument name, in float64.
Compute = Callable[[object, dict[str, np.ndarray]], dict[str, np.ndarray]]


class ReferenceSku(SkuImpl):
    """Runs ``compute`` in float64 and rounds once into the caller's output arrays."""

    def __init__(self, op: str, category: OpCategory, compute: Compute, description: str):
        self.compute = compute
        self.sku = KernelSku(
            id=f"{op}.reference",
            category=category,
            op=op,
            element=ElementKind.f64,
            layout="any",
            arch=None,
            backend=BackendKind.reference,
            precision_guarantee=REFERENCE_GUARANTEE,
            description=description + " Float64 on the host; output rounded once to its type.",
        )

    def launch(self, desc, args: BoundArgs, workspace: Workspace, stream: int | None) -> None:
        arrays = {name: as_numpy(view) for name, view in args.present().items()}
        for name, value in self.compute(desc, arrays).items():
            np.copyto(arrays[name], value, casting="unsafe")
