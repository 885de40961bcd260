"""cuBLASLt through nvmath-python's thin binding (nvmath.bindings.cublasLt): matmul epilogues.

- ``library``: the lazy binding, per-(thread, device) handles, errors, type constants.
- ``epilogues``: which epilogue serves which activation, and the aux layouts (ReLU bit-mask).
- ``layouts``: row-major problems as the column-major GEMMs cuBLASLt computes (no GPU needed).
- ``matmul``: one prepared cublasLtMatmul: descriptor, layouts, heuristic, run.
- ``linear``: the linear_forward / linear_backward SKUs.

nvmath is imported on first GPU use only; importing opfacade does not load it.
"""


def clear_caches() -> None:
    """Drops every prepared matmul recipe (descriptors, layouts, the heuristic's choice)."""
    from .linear import RECIPES

    RECIPES.clear()
