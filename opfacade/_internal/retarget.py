"""A checked run() call re-pointed at other addresses: what run()'s memo (``call_memo.py``)
launches for a call whose tensors pass the guard of a call it checked in full but sit at new
addresses (a training step's fresh activations), instead of checking it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .contract import BoundArgs

__all__ = ["Checked", "Retarget"]


class Checked(NamedTuple):
    """What checking a call in full gives the memo: its launch, and (for a call without a
    workspace) how to launch the same facts at other addresses."""

    launch: Callable[[], None]
    retarget: Retarget | None = None


class Retarget:
    """A checked call, re-pointed: ``retarget({name: address})`` gives the launch of a call whose
    arguments have the checked call's facts (the memo's guard has compared them) at these
    addresses, or None when an address-dependent check could decide differently.

    Those checks are the alignments (each SKU's, all powers of two up to 256 bytes) and the
    contract's rules on which arguments share memory with an output (none, or exactly, for an
    in-place op). So each new address must equal the checked one modulo ``ALIGNMENT``, and
    every pair of an output and another argument must meet or miss as in the checked call,
    meeting at the same relative offset. What a SKU decides from its inputs' addresses (one
    cu_seqlens buffer for both sides, exact aliasing, a vectorised path for 16-byte pointers)
    it decides in ``prepared``, which runs again on the moved views; a check of that kind
    added to a contract's bind would have to be added here too.
    """

    ALIGNMENT = 256
    __slots__ = ("_all", "_views", "_outputs", "_pairs", "_launch_on")

    def __init__(self, bound: BoundArgs, launch_on: Callable[[BoundArgs], Callable[[], None]]):
        present = bound.present()
        self._all, self._views = bound.views, present  # absent arguments stay None
        self._outputs, self._launch_on = bound.outputs, launch_on
        spans = {name: tuple(edge - view.ptr for edge in view.byte_span())
                 for name, view in present.items()}
        pairs, seen = [], set()
        for out in bound.outputs:
            for other in present:
                if out not in present or other == out or frozenset((out, other)) in seen:
                    continue
                seen.add(frozenset((out, other)))
                a, b = present[out], present[other]
                delta = a.ptr - b.ptr if a.overlaps(b) else None
                pairs.append((out, other, spans[out], spans[other], delta))
        self._pairs = tuple(pairs)

    def __call__(self, addresses: dict[str, int]) -> Callable[[], None] | None:
        views = self._views
        if len(addresses) != len(views):
            return None
        for name, ptr in addresses.items():
            view = views.get(name)
            if view is None or (ptr - view.ptr) % self.ALIGNMENT:
                return None
        for out, other, (a_lo, a_hi), (b_lo, b_hi), delta in self._pairs:
            a, b = addresses[out], addresses[other]
            meet = a_lo < a_hi and b_lo < b_hi and a + a_lo < b + b_hi and b + b_lo < a + a_hi
            if meet != (delta is not None) or (meet and a - b != delta):
                return None
        moved = {name: None if view is None else view.at(addresses[name])
                 for name, view in self._all.items()}
        return self._launch_on(BoundArgs(moved, self._outputs))
