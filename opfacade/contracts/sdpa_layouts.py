"""The sdpa family's memory layouts: the dense orders q, k, v, out (and their gradients) may be
stored in. Part of the sdpa contract (``contracts/sdpa.py`` re-exports every name)."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["LAYOUTS", "MEMORY_ORDER", "Layout", "dense_strides", "layout_of"]

# The dense memory orders q, k, v, out (and their gradients) may be stored in; indexing is
# [batch, heads, seq, dim] whatever the order. MEMORY_ORDER lists each one's axes from the
# outermost in memory to the innermost ("bshd": memory is [batch, seq, heads, dim]).
Layout = Literal["bhsd", "bshd", "sbhd"]
LAYOUTS: tuple[str, ...] = get_args(Layout)
MEMORY_ORDER: dict[str, tuple[int, int, int, int]] = {
    "bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3)}


def dense_strides(layout: str, batch: int, heads: int, seq: int, dim: int
                  ) -> tuple[int, int, int, int]:
    """Element strides of a dense tensor indexed [batch, heads, seq, dim] stored in ``layout``
    order. (The functional forms read it for every tensor they are given: a plain loop, no
    intermediate tuples.)"""
    order = MEMORY_ORDER.get(layout)
    if order is None:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    extents = (batch, heads, seq, dim)
    strides = [0, 0, 0, 0]
    running = 1
    for axis in reversed(order):  # innermost in memory first
        strides[axis] = running
        running *= extents[axis]
    return tuple(strides)


def layout_of(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    """The dense layout (of ``LAYOUTS``) a 4-D tensor with these element strides is stored in,
    the strides of size-1 extents aside; None when it is none of them."""
    for layout in LAYOUTS:
        expected = dense_strides(layout, *shape)
        if all(n == 1 or s == e for n, s, e in zip(shape, strides, expected, strict=True)):
            return layout
    return None
