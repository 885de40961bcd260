"""What every SKU implementation provides to the shared plan machinery.

A backend implements an op of a family (its ``OpContract``, in ``opfacade/contracts/``) with one
``SkuImpl`` per kernel offering, typed by the family's descriptor. Selection, explain,
workspaces, streams, the plan cache, the catalog and the CLI come from the shared machinery.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..types import KernelSku
from .contract import BoundArgs, Descriptor

__all__ = ["ReasonCode", "SkuImpl", "Unfit", "Workspace"]

D = TypeVar("D", bound=Descriptor)


class ReasonCode(enum.StrEnum):
    """Why a candidate SKU was or was not chosen; stable strings for machines to match on."""

    chosen = "chosen"
    ranked_lower = "ranked_lower"
    not_requested = "not_requested"
    backend_not_allowed = "backend_not_allowed"
    reference_is_oracle = "reference_is_oracle"
    needs_gpu = "needs_gpu"
    arch_too_old = "arch_too_old"
    element_unsupported = "element_unsupported"
    shape_unsupported = "shape_unsupported"
    feature_unsupported = "feature_unsupported"
    not_deterministic = "not_deterministic"
    not_bit_stable = "not_bit_stable"
    not_batch_invariant = "not_batch_invariant"
    precision_below_minimum = "precision_below_minimum"
    error_bound_too_loose = "error_bound_too_loose"
    workspace_over_limit = "workspace_over_limit"
    backend_unavailable = "backend_unavailable"
    version_blocked = "version_blocked"
    build_failed = "build_failed"  # a library build failed for another reason than "unsupported"


@dataclass(frozen=True)
class Unfit:
    """A SKU's own reason for not serving a descriptor."""

    code: ReasonCode
    detail: str


@dataclass(frozen=True)
class Workspace:
    """Device scratch memory for one run: address, size in bytes, and the object that owns it."""

    ptr: int
    size: int
    device: int | None
    owner: object = None

    ALIGNMENT: ClassVar[int] = 256  # what cuBLASLt and cuDNN expect; ours need 16

    @classmethod
    def empty(cls) -> Workspace:
        return cls(0, 0, None)

    @classmethod
    def round_up(cls, value: int) -> int:
        """``value`` (a size or an address) rounded up to a multiple of ALIGNMENT."""
        return -(-value // cls.ALIGNMENT) * cls.ALIGNMENT


class SkuImpl(abc.ABC, Generic[D]):
    """One kernel offering of one op: its catalog entry and how to check and launch it.

    Typed by the family's descriptor (``SkuImpl[LinearDescriptor]``). Everything a run needs
    is resolved in ``prepared``: a one-off run is ``prepared(...)()``, so a call made once and a
    call bound for a hot loop or a CUDA graph take the same path.
    """

    sku: KernelSku

    def unfit(self, desc: D) -> Unfit | None:
        """Why this SKU cannot serve ``desc`` (shape, feature, element), or None. No GPU needed."""
        return None

    def unavailable(self) -> str | None:
        """Why the backend library cannot be used in this process, or None."""
        return None

    def workspace_size(self, desc: D) -> int:
        return 0

    # Selection calls these two with its Target (arch and maybe device); SKUs whose support or
    # workspace depends on the target (a cuDNN graph built for one device) override them.
    def unfit_on(self, desc: D, target: Any) -> Unfit | None:
        return self.unfit(desc)

    def builds_to_screen(self, target: Any) -> bool:
        """Whether screening this SKU on ``target`` builds something costly (a cuDNN graph):
        selection then screens it only if every SKU ranked above it fails. ``unfit_on`` is then
        ``data_unfit_on`` (what needs no build) followed by ``built_unfit_on`` (the build)."""
        return False

    def data_unfit_on(self, desc: D, target: Any) -> Unfit | None:
        """The verdict of the checks that need no build (for SKUs that build to screen)."""
        return self.unfit_on(desc, target)

    def built_unfit_on(self, desc: D, target: Any) -> Unfit | None:
        """The verdict only the build gives, once ``data_unfit_on`` has passed."""
        return None

    def workspace_size_on(self, desc: D, target: Any) -> int:
        return self.workspace_size(desc)

    def plan_for(self, desc: D, pref: Any, target: Any) -> tuple[int, str] | Unfit:
        """(workspace bytes, what was chosen inside the SKU) under the preference, or why not.

        Library-backed SKUs pick an algorithm here (cuBLASLt's heuristic within the workspace
        limit, say) and describe it for explain; the default is the SKU's fixed workspace.
        """
        return self.workspace_size_on(desc, target), ""

    def check_args(self, desc: D, args: BoundArgs) -> None:  # noqa: B027 - optional
        """SKU-specific argument checks beyond the op's (alignment a kernel needs, say)."""

    @abc.abstractmethod
    def prepared(self, desc: D, args: BoundArgs, workspace: Workspace,
                 stream: int | None) -> Callable[[], None]:
        """A call that enqueues this exact launch on ``stream`` (None for host SKUs), with every
        look-up (a cuBLASLt recipe, a cuDNN graph, kernel arguments) resolved here, once.
        Arguments are already checked."""

    def launch(self, desc: D, args: BoundArgs, workspace: Workspace, stream: int | None) -> None:
        """Enqueue once: the prepared call, made and called."""
        self.prepared(desc, args, workspace, stream)()

    def release(self, desc: D) -> None:  # noqa: B027 - optional
        """Drops what this SKU built for ``desc`` (a graph, recipes): Plan.free calls it. A later
        run of another plan for the same problem builds again."""
