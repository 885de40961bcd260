"""What every op family and every SKU implementation provides to the shared plan machinery.

Adding an op is: a Descriptor, an Args dataclass and a ``bind`` that wraps and checks the args
(an ``OpSpec``), and one ``SkuImpl`` per kernel offering. Selection, explain, workspaces, streams,
the plan cache, the catalog and the CLI come from the shared machinery.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..types import ElementKind, KernelSku, OpCategory
from .tensors import TensorView
from .validation import invalid_problem

__all__ = [
    "BoundArgs", "Descriptor", "OpSpec", "ReasonCode", "SkuImpl", "TensorSpec", "Unfit",
    "Workspace",
]


class Descriptor(BaseModel):
    """A problem statement: frozen (hashable, a plan-cache key), storage-free, self-validating.

    Construction errors are ``InvalidProblem`` naming the field, never pydantic's own error.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)
    op_name: ClassVar[str]

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise invalid_problem(type(self), error) from None

    @classmethod
    def from_json(cls, text: str):
        """Round trip of ``model_dump_json`` (for logs and bug reports), with typed errors."""
        import json

        return cls(**json.loads(text))


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
    precision_below_minimum = "precision_below_minimum"
    error_bound_too_loose = "error_bound_too_loose"
    workspace_over_limit = "workspace_over_limit"
    backend_unavailable = "backend_unavailable"
    version_blocked = "version_blocked"


@dataclass(frozen=True)
class Unfit:
    """A SKU's own reason for not serving a descriptor."""

    code: ReasonCode
    detail: str


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


class SkuImpl(abc.ABC):
    """One kernel offering: its catalog entry and how to check and launch it."""

    sku: KernelSku

    def unfit(self, desc: Descriptor) -> Unfit | None:
        """Why this SKU cannot serve ``desc`` (shape, feature, element), or None. No GPU needed."""
        return None

    def unavailable(self) -> str | None:
        """Why the backend library cannot be used in this process, or None."""
        return None

    def workspace_size(self, desc: Descriptor) -> int:
        return 0

    # Selection calls these two with its Target (arch and maybe device); SKUs whose support or
    # workspace depends on the target (a cuDNN graph built for one device) override them.
    def unfit_on(self, desc: Descriptor, target: Any) -> Unfit | None:
        return self.unfit(desc)

    def workspace_size_on(self, desc: Descriptor, target: Any) -> int:
        return self.workspace_size(desc)

    def plan_for(self, desc: Descriptor, pref: Any, target: Any) -> tuple[int, str] | Unfit:
        """(workspace bytes, what was chosen inside the SKU) under the preference, or why not.

        Library-backed SKUs pick an algorithm here (cuBLASLt's heuristic within the workspace
        limit, say) and describe it for explain; the default is the SKU's fixed workspace.
        """
        return self.workspace_size_on(desc, target), ""

    def check_args(self, desc: Descriptor, args: BoundArgs) -> None:  # noqa: B027 - optional
        """SKU-specific argument checks beyond the op's (alignment a kernel needs, say)."""

    def prepared(self, desc: Descriptor, args: BoundArgs, workspace: Workspace,
                 stream: int | None) -> Callable[[], None]:
        """A call that re-enqueues this exact launch (Plan.prepare). SKUs with per-launch
        look-ups (a cuBLASLt recipe, a cuDNN variant pack) resolve them here, once."""
        return lambda: self.launch(desc, args, workspace, stream)

    @abc.abstractmethod
    def launch(
        self, desc: Descriptor, args: BoundArgs, workspace: Workspace, stream: int | None
    ) -> None:
        """Enqueue the work on ``stream`` (None for host SKUs). Arguments are already checked."""


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


@dataclass(frozen=True)
class OpSpec:
    """An op family member (alibi_forward, sdpa_backward, ...) as the plan machinery sees it."""

    name: str
    category: OpCategory
    descriptor: type[Descriptor]
    args: type
    bind: Callable[[Any, Any], BoundArgs]  # (descriptor, args) -> checked BoundArgs
    skus: tuple[SkuImpl, ...]
    summary: str
    # The op's arguments for a descriptor (name -> spec), in Args field order; None is omitted.
    signature: Callable[[Any], dict[str, TensorSpec]]
    # Small standard problems for one element type, used by `opfacade verify` and the GPU tests.
    sample_problems: Callable[[ElementKind], list[Any]]
    # For a forward op used in training: the backward problem its saved tensors feed. Selecting
    # for training selects that backward too, so no forward is chosen whose backward cannot run.
    training_backward: Callable[[Any], Any] | None = None
    # Verification inputs that random values cannot be (the saved stats a backward consumes,
    # valid sequence lengths): (descriptor, random inputs, rng) -> inputs to use instead.
    verification_inputs: Callable[[Any, dict, Any], dict] | None = None
