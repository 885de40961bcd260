"""cuBLASLt through nvmath-python's thin binding (nvmath.bindings.cublasLt): matmul epilogues.

- ``library``: the lazy binding, per-(thread, device) handles, errors, type constants.
- ``epilogues``: the epilogues we use and what each reads and writes (which activation takes
  which is the linear contract's activation table).
- ``layouts``: row-major problems as the column-major GEMMs cuBLASLt computes (no GPU needed).
- ``matmul``: one prepared cublasLtMatmul: descriptor, layouts, heuristic, bound calls.
- ``recipes``: ``RECIPES``, the one cache of the linear SKUs' prepared work.
- ``common``, ``forward``, ``backward``: the linear SKUs' shared base and each op's SKUs;
  ``linear``: their table, ``SKUS``.

nvmath is imported on first GPU use only; importing opfacade does not load it.
"""


def clear_caches() -> None:
    """Drops every prepared matmul recipe (descriptors, layouts, the heuristic's choice), and
    with them every SKU's shortcut to its last recipe."""
    from .linear import RECIPES

    RECIPES.clear()
