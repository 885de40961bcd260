"""The linear (GEMM + epilogue) SKUs on cuBLASLt: forward and backward, per element type.

Two SKUs per element type. The plain one takes the heuristic's best algorithm under every
reduction scheme and declares ``deterministic=False``: cuBLASLt's INPLACE split-K adds the
partial sums into the output in an order its counters serialise but its documentation does not
fix, and the bias-gradient epilogues reduce across thread blocks in an undocumented way. The
``.deterministic`` one restricts the heuristic to the schemes whose partial sums land in their own
workspace slots and are reduced in a fixed order (NONE, COMPUTE_TYPE, OUTPUT_TYPE), computes
dbias with a plain GEMM against a vector of ones instead of a BGRAD epilogue (with an activation,
both SKUs take d_pre and dbias from a fixed-order NVRTC kernel), and declares
``deterministic=True``; ``tests/test_linear_gpu.py`` checks both claims. Neither is
``bit_stable``: the heuristic's choice depends on the device's SM count.

cuBLASLt has no epilogue for the exact (erf) GELU or SiLU. For those, a second pair of SKUs per
element type (``linear_forward.cublaslt+act.*``) lets the GEMM write ``x @ W + bias (+ residual)``
and applies the activation in an NVRTC pass of its own (nvrtc/linear_act.py); it declares the
extra rounding in its bound. The backward serves every activation: its d_pre kernel takes each
derivative from the saved aux. Which activation goes where is the contract's table
(``opfacade/contracts/linear_activations.py``).

The modules: ``common`` (bounds, SKU declaration, argument checks, the shared base class and its
one execution path), ``limits`` (what cuBLASLt indexes, as data: the SKUs' size limits, checked
first at selection), ``recipes`` (``RECIPES``, the one recipe cache), ``forward`` and
``backward`` (each op's recipes and SKUs). Prepared matmuls are cached per (descriptor, device,
tensor strides); a run given less workspace than the cached algorithm needs uses the best
algorithm within what it was given.
"""

from __future__ import annotations

from ...contracts.linear import LINEAR_BACKWARD, LINEAR_FORWARD
from .backward import LinearBackwardCublasLt
from .common import ELEMENTS, WORKSPACE_LIMIT
from .forward import LinearForwardCublasLt, LinearForwardCublasLtActPass
from .recipes import RECIPES

__all__ = ["RECIPES", "SKUS", "WORKSPACE_LIMIT"]

SKUS = {
    LINEAR_FORWARD.name: (
        *(LinearForwardCublasLt(e, det) for e in ELEMENTS for det in (False, True)),
        *(LinearForwardCublasLtActPass(e, det) for e in ELEMENTS for det in (False, True))),
    LINEAR_BACKWARD.name: tuple(LinearBackwardCublasLt(e, det) for e in ELEMENTS
                                for det in (False, True)),
}
