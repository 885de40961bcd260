"""The sdpa family's memory layouts: the dense orders out (and the gradients) are stored in, and
q, k, v unless the descriptor gives their own strides (views into one packed QKV projection).
Part of the sdpa contract (``contracts/sdpa.py`` re-exports every name)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["LAYOUTS", "MEMORY_ORDER", "Layout", "QkvStrides", "dense_in", "dense_strides",
           "layout_by_order", "layout_of", "output_layout"]

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


def dense_in(layout: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a 4-D tensor with these element strides is dense in ``layout``, the strides of
    size-1 extents aside."""
    expected = dense_strides(layout, *shape)
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expected, strict=True))


def layout_of(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    """The dense layout (of ``LAYOUTS``) a 4-D tensor with these element strides is stored in,
    the strides of size-1 extents aside; None when it is none of them."""
    return next((layout for layout in LAYOUTS if dense_in(layout, shape, strides)), None)


def layout_by_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    """The layout whose memory order these strides follow, dense or not: the first of
    ``LAYOUTS`` along whose order (outermost first) the strides of the extents above 1 never
    grow. q = qkv[:, :, 0].transpose(1, 2) of a packed [B, S, 3, H, D] projection follows
    "bshd"; a view following none of them gives None."""
    for layout in LAYOUTS:
        kept = [strides[axis] for axis in MEMORY_ORDER[layout] if shape[axis] > 1]
        if all(outer >= inner for outer, inner in zip(kept, kept[1:], strict=False)):
            return layout
    return None


def output_layout(q_shape: tuple[int, ...], q_strides: tuple[int, ...]) -> str:
    """The layout out and the gradients are stored in, given q's view: q's own when q is dense,
    else the one q's strides follow, else "bhsd"."""
    return layout_of(q_shape, q_strides) or layout_by_order(q_shape, q_strides) or "bhsd"


Stride = Annotated[int, Field(ge=0)]
Strides = tuple[Stride, Stride, Stride, Stride]


class QkvStrides(BaseModel):
    """Element strides of q, k and v, each indexed [batch, heads, seq, dim], for inputs that are
    not dense in the descriptor's layout: q/k/v sliced from one packed [B, S, 3, H, D] QKV
    projection have q strides (3*S*H*D, D, 3*H*D, 1). The dim stride must be 1; a stride of an
    extent of 1 is never used (any value passes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    q: Strides
    k: Strides
    v: Strides

    @field_validator("q", "k", "v")
    @classmethod
    def _unit_dim_stride(cls, strides: tuple[int, ...]) -> tuple[int, ...]:
        if strides[3] != 1:
            raise ValueError(f"the dim stride must be 1 (rows are read contiguously), got "
                             f"{strides[3]} in {strides}")
        return strides
