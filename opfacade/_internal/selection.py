"""Selection: the target a plan runs on, every candidate's verdict, and the explain report.

Selection never runs a kernel. Candidates are the op's SKUs in the order the registry table lists
them (the documented preference, fastest first); ``rank`` drops those that cannot serve the
problem on the target or that miss the preference, then keeps the first survivor (with
``objective="memory"``, the smallest workspace first). The report keeps every candidate with a
reason code, and the choice and each rejection are logged at DEBUG.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ..errors import BackendUnavailable, InvalidProblem
from ..types import ArchSku, BackendKind, KernelSku, PlanPreference
from .contract import Descriptor
from .device import DEVICES, check_ordinal, current_device, device_arch, device_count
from .log import LOG
from .sku import ReasonCode, SkuImpl, Unfit

__all__ = ["ExplainReport", "Target", "Verdict", "rank"]


@dataclass(frozen=True)
class Target:
    """Where a plan will run: a GPU architecture (and maybe a fixed device), or the host."""

    arch: ArchSku | None
    device: int | None = None

    @property
    def is_host(self) -> bool:
        return self.arch is None

    def __str__(self) -> str:
        if self.is_host:
            return "host"
        return f"cuda:{self.device} ({self.arch})" if self.device is not None else str(self.arch)

    @classmethod
    def resolve(cls, device: int | str | None, arch: str | ArchSku | None) -> Target:
        """device='cpu' is the host (reference oracle); arch alone selects without a GPU."""
        if device == "cpu":
            if arch is not None:
                raise InvalidProblem("give either device='cpu' or arch, not both", field="arch")
            return cls(None)
        if device is not None and isinstance(device, str):
            raise InvalidProblem(f"device must be an int ordinal or 'cpu', got {device!r}",
                                 field="device")
        if device is None and arch is not None:
            return cls(ArchSku.parse(arch))
        if device is None:
            if device_count() == 0:
                tip = ("pass arch='sm90' (say) to select without a GPU, or device='cpu' for the "
                       "float64 reference")
                try:
                    DEVICES.runtime()  # without the GPU stack: names what to install
                except BackendUnavailable as error:
                    raise BackendUnavailable(f"{error}; or {tip}") from None
                raise BackendUnavailable(f"no CUDA device is visible: {tip}")
            device = current_device()
        check_ordinal(device)
        actual = device_arch(device)
        if arch is not None and ArchSku.parse(arch) != actual:
            raise InvalidProblem(f"arch {arch} does not match cuda:{device}, which is {actual}",
                                 field="arch")
        return cls(actual, device)


@dataclass(frozen=True)
class Verdict:
    """One candidate SKU's fate in a selection."""

    sku: KernelSku
    code: ReasonCode
    detail: str
    workspace_size: int | None

    @property
    def chosen(self) -> bool:
        return self.code is ReasonCode.chosen

    @property
    def viable(self) -> bool:
        return self.code in (ReasonCode.chosen, ReasonCode.ranked_lower)

    def to_dict(self) -> dict:
        return {"sku": self.sku.id, "backend": self.sku.backend.value, "code": self.code.value,
                "detail": self.detail, "workspace_size": self.workspace_size}


@dataclass(frozen=True)
class ExplainReport:
    """Every candidate for a problem, chosen or rejected, with the reason: data first, then text."""

    op: str
    descriptor: Descriptor
    preference: PlanPreference
    target: Target
    verdicts: tuple[Verdict, ...]

    @property
    def chosen(self) -> Verdict | None:
        return next((v for v in self.verdicts if v.chosen), None)

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "descriptor": self.descriptor.model_dump(mode="json"),
            "preference": self.preference.model_dump(mode="json"),
            "target": str(self.target),
            "candidates": [v.to_dict() for v in self.verdicts],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self) -> str:
        fields = " ".join(f"{k}={v}" for k, v in self.descriptor.model_dump(mode="json").items())
        header = f"{self.op} on {self.target}: {fields}"
        rows = [("sku", "backend", "verdict", "workspace", "why")]
        for v in self.verdicts:
            ws = "-" if v.workspace_size is None else str(v.workspace_size)
            rows.append((v.sku.id, v.sku.backend.value, v.code.value, ws, v.detail))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [header]
        for row in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
                         + "  " + row[4])
        return "\n".join(lines)

    __str__ = table


def _screen(impl: SkuImpl, desc: Descriptor, pref: PlanPreference, target: Target,
            build: bool = True) -> Verdict:
    """The first reason ``impl`` cannot serve (desc, pref) on ``target``, as a verdict.
    ``build=False`` stops before what a SKU must build to know (its data limits only): a viable
    verdict then says "not built"."""
    sku = impl.sku
    workspace = None

    def reject(code: ReasonCode, detail: str) -> Verdict:
        return Verdict(sku, code, detail, workspace)

    if pref.sku is not None and sku.id != pref.sku:
        return reject(ReasonCode.not_requested, f"preference pins {pref.sku}")
    if pref.backends is not None and sku.backend not in pref.backends:
        allowed = ", ".join(sorted(b.value for b in pref.backends))
        return reject(ReasonCode.backend_not_allowed, f"preference allows only {allowed}")
    if sku.backend is BackendKind.reference and not target.is_host:
        return reject(ReasonCode.reference_is_oracle,
                      "the float64 reference is the test oracle; select it with device='cpu'")
    if sku.backend is not BackendKind.reference and target.is_host:
        return reject(ReasonCode.needs_gpu, "runs on a GPU; the target is the host")
    if sku.arch is not None and not target.arch.covers(sku.arch):
        return reject(ReasonCode.arch_too_old,
                      f"needs {sku.arch} or newer, target is {target.arch}")
    # What needs no build first, the preference's guarantees next: a SKU the preference rules
    # out is never built.
    unfit: Unfit | None = impl.data_unfit_on(desc, target)
    if unfit is not None:
        return reject(unfit.code, unfit.detail)
    guarantee = sku.precision_guarantee
    if pref.deterministic and not guarantee.deterministic:
        return reject(ReasonCode.not_deterministic,
                      "not bitwise repeatable; preference requires it")
    if pref.bit_stable and not guarantee.bit_stable:
        return reject(ReasonCode.not_bit_stable,
                      "reduction order not fixed; preference requires it")
    if pref.batch_invariant and not guarantee.batch_invariant:
        return reject(ReasonCode.not_batch_invariant,
                      "results may depend on the rest of the batch; preference requires not")
    if pref.min_math_precision and not guarantee.math_precision.at_least(pref.min_math_precision):
        return reject(ReasonCode.precision_below_minimum,
                      f"math in {guarantee.math_precision}, preference needs at least "
                      f"{pref.min_math_precision}")
    if pref.max_rel_error is not None and guarantee.max_rel_error > pref.max_rel_error:
        return reject(ReasonCode.error_bound_too_loose,
                      f"declares max_rel_error {guarantee.max_rel_error:g} > preference "
                      f"{pref.max_rel_error:g}")
    if build and impl.builds_to_screen(target):
        unfit = impl.built_unfit_on(desc, target)
        if unfit is not None:
            return reject(unfit.code, unfit.detail)
    elif not build:
        missing = impl.unavailable()
        if missing is not None:
            return reject(ReasonCode.backend_unavailable, missing)
        return Verdict(sku, ReasonCode.ranked_lower, NOT_BUILT, None)
    planned = impl.plan_for(desc, pref, target)
    if isinstance(planned, Unfit):
        return reject(planned.code, planned.detail)
    workspace, chosen = planned
    if pref.workspace_limit is not None and workspace > pref.workspace_limit:
        return reject(ReasonCode.workspace_over_limit,
                      f"needs {workspace} bytes of workspace, limit is {pref.workspace_limit}")
    missing = impl.unavailable()
    if missing is not None:
        return reject(ReasonCode.backend_unavailable, missing)
    return Verdict(sku, ReasonCode.ranked_lower, chosen, workspace)


# What an unbuilt SKU's verdict says (see rank).
NOT_BUILT = "passes its data limits; not built, as a SKU ranked above it serves"


def rank(op, desc: Descriptor, pref: PlanPreference, target: Target):
    """Screens every candidate and marks the winner; returns (report, winning impl or None).

    A SKU that must build to be screened (a cuDNN graph on a GPU) is built only when every SKU
    ranked above it has failed, when speed is the objective: a training pair's first selection
    then builds the one backward graph it returns, not every variant's. Those left unbuilt are
    reported viable as far as their data limits tell (``NOT_BUILT``)."""
    screened, found = [], False
    for impl in op.skus:
        lazy = found and pref.objective == "speed" and impl.builds_to_screen(target)
        verdict = _screen(impl, desc, pref, target, build=not lazy)
        found = found or verdict.viable
        screened.append((impl, verdict))
    viable = [(impl, v) for impl, v in screened if v.viable]
    if pref.objective == "memory":
        viable.sort(key=lambda pair: pair[1].workspace_size)  # stable: ties keep the op's order
    winner = viable[0][0] if viable else None
    verdicts = []
    for impl, v in screened:
        inner = f"; {v.detail}" if v.detail else ""  # what the SKU chose inside (an algorithm)
        if impl is winner:
            rule = "smallest workspace" if pref.objective == "memory" else "op order"
            v = Verdict(v.sku, ReasonCode.chosen, f"first of {len(viable)} viable ({rule}){inner}",
                        v.workspace_size)
        elif v.viable:
            v = Verdict(v.sku, ReasonCode.ranked_lower,
                        f"viable; ranked below {winner.sku.id}{inner}", v.workspace_size)
        verdicts.append(v)
    report = ExplainReport(op.name, desc, pref, target, tuple(verdicts))
    if LOG.isEnabledFor(logging.DEBUG):  # the report's text is built only when someone listens
        chosen = report.chosen
        LOG.debug("select %s on %s: %s", op.name, target,
                  f"chose {chosen.sku.id} ({chosen.detail})" if chosen else "no SKU serves")
        for v in verdicts:
            if not v.chosen:
                LOG.debug("  %s: %s: %s", v.sku.id, v.code.value, v.detail)
    return report, winner


