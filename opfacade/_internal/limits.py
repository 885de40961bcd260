"""Size limits of a kernel offering, stated as data: one row per integer the kernel indexes with.

A kernel forms its indices in integers of a fixed width (an ``int`` column index, an ``i64``
element offset), launches a grid whose extents are bounded, and its plan allocates a workspace.
Each backend states its SKUs' limits as a table of ``Limit`` rows; the SKU's ``unfit`` checks
them before anything else is computed from the problem, so a problem no kernel can index is
rejected with ``ReasonCode.shape_unsupported`` (never an OverflowError, never a workspace no
device holds) and explain shows the limit beside the problem's value::

    batch*heads*query_len = 1.3e33 rows exceeds the kernel's int64 row index (9.2e18)

A row holds only what can bind: an index that a stricter row (or the descriptor's own bounds)
always keeps in range is noted beside the table, not listed in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Generic, TypeVar

from .sku import ReasonCode, Unfit

__all__ = [
    "GRID_X_MAX", "GRID_YZ_MAX", "INT32_MAX", "INT64_MAX", "Limit", "MAX_WORKSPACE", "check",
    "number", "workspace_limit",
]

P = TypeVar("P")

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
# CUDA's launch limits (the programming guide's "maximum x-dimension of a grid of thread
# blocks" and "maximum y- or z-dimension"), the same on every architecture since sm30.
GRID_X_MAX = (1 << 31) - 1
GRID_YZ_MAX = 65535
# A plan's workspace stays below 2**48 bytes (256 TiB, the 48-bit virtual address space GPUs
# map): no device holds more, so a larger request is a problem out of reach, never an allocation
# to try.
MAX_WORKSPACE = (1 << 48) - 1


def _short(value: int) -> str:
    return f"{Decimal(value):.1e}".replace("e+", "e")  # exact for any int: no float overflow


def number(value: int, other: int | None = None) -> str:
    """``value`` for a reason text: exact below 10^12, else in two significant digits (9.2e18),
    unless that would print it the same as ``other`` (the value it is compared with)."""
    if value < 10**12:
        return str(value)
    short = _short(value)
    if other is not None and short == _short(other):
        return str(value)
    return short


@dataclass(frozen=True)
class Limit(Generic[P]):
    """One limit: ``measure(problem)`` must not exceed ``value``.

    ``quantity`` names the measured value in the problem's terms ("batch*heads*query_len"),
    ``unit`` what it counts ("rows", "elements of q", "bytes"), ``bound`` what holds it ("the
    kernel's int64 row index"); ``source`` says where the limit is stated (a kernel's parameter
    in ``native/``, a library header). ``measure`` returns None where the limit does not apply.
    """

    name: str
    quantity: str
    unit: str
    bound: str
    value: int
    measure: Callable[[P], int | None]
    source: str
    code: ReasonCode = ReasonCode.shape_unsupported

    def reason(self, actual: int) -> str:
        return (f"{self.quantity} = {number(actual, self.value)} {self.unit} exceeds "
                f"{self.bound} ({number(self.value, actual)})")

    def check(self, problem: P) -> Unfit | None:
        """An Unfit naming the limit and the problem's value when it is exceeded, else None."""
        actual = self.measure(problem)
        if actual is None or actual <= self.value:
            return None
        return Unfit(self.code, self.reason(actual))


def check(limits: Iterable[Limit[P]], problem: P) -> Unfit | None:
    """The first limit ``problem`` exceeds, as an Unfit, or None."""
    for limit in limits:
        unfit = limit.check(problem)
        if unfit is not None:
            return unfit
    return None


def workspace_limit(measure: Callable[[P], int | None], source: str,
                    quantity: str = "the workspace") -> Limit[P]:
    """The row every SKU with a workspace has: what it asks for within ``MAX_WORKSPACE``."""
    return Limit("workspace", quantity, "bytes", "the 48-bit address space a GPU maps",
                 MAX_WORKSPACE, measure, source)
