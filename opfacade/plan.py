"""Select-then-run, shared by every op: checks, workspaces, streams, the plan cache, lifetime.

    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    plan.workspace_size; plan.can_implement(args); plan.run(args, workspace=ws, stream=s)
    Plan.explain(desc, pref, arch="sm90")   # works without a GPU

How a SKU is chosen is ``_internal/selection.py``; which SKUs an op has is ``_registry.py``.
"""

from __future__ import annotations

import functools
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

from . import _registry as registry
from ._internal.call_memo import CallMemo
from ._internal.checks import self_aliasing
from ._internal.contract import BoundArgs, Descriptor, settled, stated_strides
from ._internal.device import device_arch
from ._internal.log import LOG
from ._internal.lru import BuildOnceLRU
from ._internal.retarget import Checked, Retarget
from ._internal.selection import ExplainReport, Target, Verdict, rank
from ._internal.sku import SkuImpl, Workspace
from ._internal.streams import owning_package, resolve_stream
from ._internal.tensors import TensorView, wrap
from ._registry import OpSpec
from .errors import (
    BufferTooSmall,
    DeviceMismatch,
    InvalidArgument,
    InvalidProblem,
    LayoutMismatch,
    NoKernelSku,
    PlanFreed,
)
from .types import ArchSku, KernelSku, PlanPreference, PrecisionGuarantee

__all__ = ["ExplainReport", "Plan", "PreparedRun", "Target", "TrainingPair", "Verdict",
           "plan_class"]


# Process-wide plans keyed by (op, descriptor, preference, target); a freed plan is a miss.
PLAN_CACHE: BuildOnceLRU[Plan] = BuildOnceLRU("plan", 512, usable=lambda plan: not plan.freed)
# The functional forms' plans keyed by the facts they build a descriptor from (shapes, element,
# device, options): a repeat call skips building and validating the descriptor, which costs a
# functional call several times what run() does.
FACTS_CACHE: BuildOnceLRU[Plan] = BuildOnceLRU("functional plan", 1024,
                                               usable=lambda plan: not plan.freed)


class _Live(NamedTuple):
    """What a live plan runs with: its SKU and its memo of checked calls (None on the host).

    One attribute holds both, so that a run reads them in one step and ``free()`` takes them
    away in one step: a run that has read them finishes with them; a later one finds None and
    raises PlanFreed. Nothing reads ``Plan._live`` twice in one call.
    """

    impl: SkuImpl
    calls: CallMemo | None


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class Plan:
    """A selected SKU bound to one descriptor: reusable across tensors, streams and threads."""

    op: ClassVar[OpSpec | None] = None  # op-specific subclasses pin their family

    def __init__(self, op: OpSpec, desc: Descriptor, pref: PlanPreference, target: Target,
                 impl: SkuImpl, report: ExplainReport):
        self._op = op
        self._descriptor = desc
        self._preference = pref
        self._target = target
        self._report = report
        self._workspace_size = report.chosen.workspace_size or 0
        # run()'s checked calls; a host plan checks in full (its tensors are NumPy arrays).
        calls = None if target.is_host else CallMemo(self._checked_launch)
        self._live: _Live | None = _Live(impl, calls)
        self._free_lock = threading.Lock()  # two free()s release the SKU's build once

    # -- selection ---------------------------------------------------------------------------
    @classmethod
    def _op_for(cls, desc: Descriptor) -> OpSpec:
        op = registry.op_for(desc)
        if cls.op is not None and op is not cls.op:
            raise InvalidProblem(
                f"{cls.__name__} takes a {cls.op.descriptor.__name__}, got {type(desc).__name__}",
                field="descriptor")
        return op

    @classmethod
    def explain(cls, desc: Descriptor, pref: PlanPreference | dict | None = None, *,
                device: int | str | None = None, arch: str | ArchSku | None = None
                ) -> ExplainReport:
        """Every candidate SKU with its reason code; works without a GPU when ``arch`` is given."""
        report, _ = rank(cls._op_for(desc), desc, PlanPreference.coerce(pref),
                          Target.resolve(device, arch))
        return report

    @classmethod
    def select(cls, desc: Descriptor, pref: PlanPreference | dict | None = None, *,
               device: int | str | None = None, arch: str | ArchSku | None = None) -> Plan:
        """The best SKU for ``desc`` on the target, or NoKernelSku carrying the explain report.

        ``device``: a CUDA ordinal (default: the current device), or 'cpu' for the float64
        reference. ``arch``: select for an architecture without a GPU; the plan then runs on
        whatever device its tensors live on, if that device covers the SKU's arch.
        """
        op = cls._op_for(desc)
        pref = PlanPreference.coerce(pref)
        report, impl = rank(op, desc, pref, Target.resolve(device, arch))
        if impl is None:
            raise NoKernelSku(f"no SKU serves {op.name} for this problem:\n{report.table()}",
                              report)
        chosen_class = cls if cls.op is not None else plan_class(op.name)
        return chosen_class(op, desc, pref, report.target, impl, report)

    @classmethod
    def cached(cls, desc: Descriptor, pref: PlanPreference | dict | None = None, *,
               device: int | str | None = None) -> Plan:
        """Like select, from a thread-safe process-wide cache; do not free the plan it returns."""
        pref = PlanPreference.coerce(pref)
        target = Target.resolve(device, None)
        key = (cls._op_for(desc).name, desc, pref, target)
        return PLAN_CACHE.get(key, lambda: cls.select(desc, pref, device=device))

    @classmethod
    def cached_for(cls, facts: tuple, describe: Callable[[], Descriptor],
                   pref: PlanPreference | dict | None = None, *,
                   device: int | str | None = None) -> Plan:
        """Plan.cached for the descriptor ``describe()`` makes and ``pref``, remembered under
        ``facts``: everything the descriptor and the preference are built from, hashable. A
        functional form's repeat call then costs a tuple's hash instead of the descriptor's
        validation. Unhashable facts (a list among the options) build the descriptor."""
        key = (cls.__name__, facts, device)
        try:
            plan = FACTS_CACHE.peek(key)  # hashes the key once
        except TypeError:
            return cls.cached(describe(), pref, device=device)
        if plan is not None:  # the hot path: no closure made for the miss
            return plan
        return FACTS_CACHE.get(key, lambda: cls.cached(describe(), pref, device=device))

    @classmethod
    def select_for_training(cls, desc: Descriptor, pref: PlanPreference | dict | None = None, *,
                            device: int | str | None = None,
                            arch: str | ArchSku | None = None) -> TrainingPair:
        """A forward plan and the backward plan for its saved tensors, chosen together.

        The backward is selected first, under the same preference: when no backward SKU can
        serve, no forward is returned either (NoKernelSku carries the backward's report).
        """
        op = cls._op_for(desc)
        if op.training_backward is None:
            raise InvalidProblem(f"{op.name} has no backward to pair with", field="descriptor")
        backward = Plan.select(op.training_backward(desc), pref, device=device, arch=arch)
        forward = cls.select(desc, pref, device=device, arch=arch)
        return TrainingPair(forward, backward)

    # -- what was chosen ---------------------------------------------------------------------
    @property
    def descriptor(self) -> Descriptor:
        return self._descriptor

    @property
    def preference(self) -> PlanPreference:
        return self._preference

    @property
    def target(self) -> Target:
        return self._target

    @property
    def sku(self) -> KernelSku:
        return self._report.chosen.sku

    @property
    def precision_guarantee(self) -> PrecisionGuarantee:
        return self.sku.precision_guarantee

    @property
    def workspace_size(self) -> int:
        """Bytes of workspace run() needs; known at selection, before anything runs."""
        return self._workspace_size

    @property
    def report(self) -> ExplainReport:
        return self._report

    @property
    def freed(self) -> bool:
        return self._live is None

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"workspace_size={self.workspace_size}"
        return f"<{type(self).__name__} {self.sku.id} on {self._target}, {state}>"

    # -- running -----------------------------------------------------------------------------
    def _state(self) -> _Live:
        live = self._live  # read once: free() may run on another thread at any point
        if live is None:
            raise PlanFreed(f"this {self._op.name} plan was freed; select a new one")
        return live

    def _live_impl(self) -> SkuImpl:
        return self._state().impl

    # The SKU and the memo as attributes, for the bench and the tests that look inside a plan.
    @property
    def _impl(self) -> SkuImpl | None:
        live = self._live
        return None if live is None else live.impl

    @property
    def _calls(self) -> CallMemo | None:
        live = self._live
        return None if live is None else live.calls

    @_calls.setter
    def _calls(self, calls: CallMemo | None) -> None:
        live = self._live
        if live is not None:
            self._live = live._replace(calls=calls)

    @functools.cached_property
    def _stated_strides(self) -> dict[str, tuple[tuple, tuple]]:
        return stated_strides(self._op.signature(self._descriptor))

    def _bind(self, impl: SkuImpl, args: Any) -> BoundArgs:
        # Extent-1 dimensions' strides settled to the signature's before any SKU reads them.
        bound = settled(self._op.bind(self._descriptor, args), self._stated_strides)
        self._check_placement(bound)
        impl.check_args(self._descriptor, bound)
        return bound

    def _check_placement(self, bound: BoundArgs) -> None:
        """Writable outputs; all tensors on the host for a host plan, else all on one GPU that
        covers the SKU."""
        views = bound.present()
        for name in bound.outputs:
            view = bound.views.get(name)
            if view is None:
                continue
            if view.readonly:
                raise LayoutMismatch(f"{name} is read-only; outputs must be writable",
                                     argument=name)
            aliasing = self_aliasing(view)
            if aliasing:
                raise LayoutMismatch(
                    f"{name} has shape {view.shape} and strides {view.strides}, so {aliasing}; "
                    "an output needs one address per element", argument=name)
        if self._target.is_host:
            for name, view in views.items():
                if view.device is not None:
                    raise DeviceMismatch(
                        f"{name} is on cuda:{view.device}; this plan is the host reference and "
                        "takes NumPy arrays", argument=name)
            return
        first_name, first = next(iter(views.items()))
        for name, view in views.items():
            if view.device is None:
                raise DeviceMismatch(
                    f"{name} is in host memory; this plan runs on a GPU ({self._target})",
                    argument=name)
            if view.device != first.device:
                raise DeviceMismatch(
                    f"{name} is on cuda:{view.device}, but {first_name} is on cuda:{first.device}",
                    argument=name)
        if self._target.device is not None and first.device != self._target.device:
            raise DeviceMismatch(
                f"{first_name} is on cuda:{first.device}; this plan was selected for "
                f"cuda:{self._target.device}", argument=first_name)
        actual = device_arch(first.device)
        if self.sku.arch is not None and not actual.covers(self.sku.arch):
            raise DeviceMismatch(
                f"{first_name} is on cuda:{first.device} ({actual}); {self.sku.id} needs "
                f"{self.sku.arch}", argument=first_name)

    def can_implement(self, args: Any, workspace: Any = None) -> None:
        """Raises the typed error run() would raise for these args; returns None when fine."""
        bound = self._bind(self._live_impl(), args)
        if workspace is not None:
            self._user_workspace(workspace, bound)

    def _device_of(self, bound: BoundArgs) -> int | None:
        return None if self._target.is_host else bound.device

    def _user_workspace(self, workspace: Any, bound: BoundArgs) -> Workspace:
        if isinstance(workspace, Workspace):
            ws = workspace
            if not (_is_int(ws.ptr) and ws.ptr >= 0 and _is_int(ws.size)
                    and (ws.device is None or _is_int(ws.device) and ws.device >= 0)):
                raise InvalidArgument(
                    f"workspace must be a Workspace(ptr, size, device) of non-negative int "
                    f"address, int size and int ordinal or None, got {ws!r}",
                    argument="workspace")
        else:
            view: TensorView = wrap(workspace, "workspace")
            if not view.is_contiguous:
                raise LayoutMismatch("workspace must be a contiguous buffer", argument="workspace")
            ws = Workspace(view.ptr, view.nbytes, view.device, workspace)
        need = self._workspace_size
        if ws.size < need:
            raise BufferTooSmall(
                f"workspace has {ws.size} bytes; this plan needs {need} (plan.workspace_size)",
                argument="workspace")
        if need and ws.device != self._device_of(bound):
            where = "host memory" if ws.device is None else f"cuda:{ws.device}"
            raise DeviceMismatch(f"workspace is in {where}; the tensors are on "
                                 f"cuda:{self._device_of(bound)}", argument="workspace")
        if need and ws.ptr % Workspace.ALIGNMENT:
            raise LayoutMismatch(
                f"workspace must be {Workspace.ALIGNMENT}-byte aligned, got address {ws.ptr:#x}",
                argument="workspace")
        return ws

    def _resolve(self, impl: SkuImpl, args: Any, workspace: Any, stream: Any,
                 scratch: str | None = "launch") -> tuple[BoundArgs, Workspace, int | None]:
        """Everything run() checks and decides before the launch. A missing workspace: for
        ``scratch`` "launch" (one launch, enqueued now) the stream's block where it serves;
        "kept" (a prepared call, launched later and again) memory of its own, which the
        stream's block is not: a bigger request replaces that block; None leaves it to the
        caller (an empty one comes back)."""
        bound = self._bind(impl, args)
        if self._target.is_host:
            return bound, Workspace.empty(), None
        device = self._device_of(bound)
        owner = owning_package(bound.present().values(), stream)
        handle = resolve_stream(stream, owner, device)
        if workspace is not None:
            ws = self._user_workspace(workspace, bound)
        elif self._workspace_size and scratch is not None:
            from ._internal.memory import allocate_bytes, scratch_bytes

            allocate = scratch_bytes if scratch == "launch" else allocate_bytes
            ptr, keep = allocate(self._workspace_size, device, owner, handle)
            ws = Workspace(ptr, self._workspace_size, device, keep)
        else:
            ws = Workspace.empty()
        return bound, ws, handle

    def prepare(self, args: Any, workspace: Any = None, stream: Any = None) -> PreparedRun:
        """Checks ``args`` once and returns a call that re-launches on the same tensors.

        For hot loops over fixed buffers (and CUDA graph capture): the prepared call skips every
        check, so the tensors must stay alive with the same shapes, strides and addresses; their
        contents may change. It holds the workspace (allocated once when None) and the stream;
        call it from the thread that prepared it (library handles are per thread).
        """
        impl = self._live_impl()
        bound, ws, handle = self._resolve(impl, args, workspace, stream, scratch="kept")
        return PreparedRun(self, impl, bound, ws, handle)

    def run(self, args: Any, workspace: Any = None, stream: Any = None) -> None:
        """Enqueues the op on ``stream`` and returns without waiting.

        ``workspace``: a Workspace or any contiguous device buffer of at least
        ``workspace_size`` bytes; None allocates from the tensors' framework (stream-ordered).
        ``stream``: None for the current stream of the package that owns the tensors, an int
        handle, a CuPy or torch stream, or an object with ``__cuda_stream__``.

        The checks run once per distinct call: a later call whose tensors have the same
        addresses, shapes, strides, dtypes and devices, with the same workspace and stream, only
        launches (``_internal/call_memo.py`` says what is compared and why that is enough).
        """
        impl, calls = self._state()  # one read: a concurrent free() lets this run finish
        if calls is not None:
            launch = calls.launch_for(args, workspace, stream)
            if launch is not None:
                launch()
                return
            LOG.debug("%s run: checked in full (its tensors, workspace or stream cannot be "
                      "keyed exactly)", self._op.name)
        bound, ws, handle = self._resolve(impl, args, workspace, stream)
        impl.launch(self._descriptor, bound, ws, handle)

    def _checked_launch(self, args: Any, workspace: Any, stream: Any) -> Checked:
        """Checks a call in full and returns its launch, holding addresses but no user object,
        and without a workspace its Retarget (the same facts at other addresses)."""
        impl, desc = self._live_impl(), self._descriptor
        # Scratch for a call without a workspace is allocated per launch (_launch_on).
        bound, ws, handle = self._resolve(impl, args, workspace, stream, scratch=None)
        views = {name: None if view is None else replace(view, obj=None)
                 for name, view in bound.views.items()}
        detached = BoundArgs(views, bound.outputs)
        scratch = workspace is None and self._workspace_size > 0
        owner = owning_package(detached.present().values(), stream) if scratch else None

        def launch_on(checked: BoundArgs) -> Callable[[], None]:
            return self._launch_on(impl, desc, checked, ws, handle, owner, stream)

        return Checked(launch_on(detached),
                       Retarget(detached, launch_on) if workspace is None else None)

    def _launch_on(self, impl: SkuImpl, desc: Descriptor, bound: BoundArgs, ws: Workspace,
                   handle: int | None, scratch_owner: str | None, stream: Any
                   ) -> Callable[[], None]:
        """The launch of checked arguments; with a ``scratch_owner``, scratch from that package
        on every call."""
        if scratch_owner is None:
            return impl.prepared(desc, bound, Workspace(ws.ptr, ws.size, ws.device), handle)
        from ._internal.memory import scratch_bytes

        size, device = self._workspace_size, bound.device
        # With no stream named, torch tensors run on torch's current stream, which the memo's
        # key holds: on every call this launch serves, it is current.
        current = stream is None and scratch_owner == "torch"
        # Scratch on every call, stream-ordered, as the full path does: the stream's own block,
        # else the framework's caching allocator, which hands the same block back call after
        # call. Either way the launch prepared for the last pointer is reused while it repeats.
        last: list = [None, None]  # [pointer, the launch prepared for it]

        def allocate_and_launch() -> None:
            ptr, keep = scratch_bytes(size, device, scratch_owner, handle, current)
            if last[0] != ptr:
                last[1] = impl.prepared(desc, bound, Workspace(ptr, size, device), handle)
                last[0] = ptr
            last[1]()
            del keep  # back to the stream's pool, ordered after the launch just enqueued

        return allocate_and_launch

    # -- lifetime ----------------------------------------------------------------------------
    def free(self) -> None:
        """Releases what the plan holds (its checked calls, and what its SKU built for this
        problem: a cuDNN graph, cuBLASLt recipes); safe to call twice, and while other threads
        run the plan: a run already under way finishes, a later one raises PlanFreed."""
        with self._free_lock:
            live, self._live = self._live, None
        if live is not None:
            live.impl.release(self._descriptor)  # the memo, every thread's launches, goes too

    def __enter__(self) -> Plan:
        self._live_impl()
        return self

    def __exit__(self, *exc_info) -> None:
        self.free()


class PreparedRun:
    """A plan bound to checked tensors, a workspace and a stream: calling it only launches."""

    __slots__ = ("_plan", "_bound", "_workspace", "_call")

    def __init__(self, plan: Plan, impl: SkuImpl, bound: BoundArgs, workspace: Workspace,
                 stream: int | None):
        self._plan, self._bound, self._workspace = plan, bound, workspace  # kept alive
        self._call = impl.prepared(plan.descriptor, bound, workspace, stream)

    def __call__(self) -> None:
        if self._plan._live is None:
            self._plan._state()  # raises PlanFreed
        self._call()


@dataclass(frozen=True)
class TrainingPair:
    """A forward plan and the backward plan that consumes what the forward saves."""

    forward: Plan
    backward: Plan

    @property
    def workspace_size(self) -> int:
        """The larger of the two: one buffer serves both when they run in sequence."""
        return max(self.forward.workspace_size, self.backward.workspace_size)

    def free(self) -> None:
        self.forward.free()
        self.backward.free()


@functools.cache  # one class per op, made on first use: the same object every time
def plan_class(op_name: str) -> type[Plan]:
    """The Plan subclass pinned to one op (AlibiForwardPlan, SdpaBackwardPlan, ...), for typing
    and isinstance."""
    try:
        op = registry.op_named(op_name)
    except InvalidProblem:
        # Called as a family's public module is imported: a family missing from the table is an
        # import error, never a silent hole.
        raise ImportError(f"op {op_name!r} is not in opfacade/_registry.py's FAMILIES "
                          "table") from None
    name = "".join(part.title() for part in op.name.split("_")) + "Plan"
    return type(name, (Plan,), {"op": op, "__doc__": f"Plan for {op.name}: {op.summary}",
                                "__module__": "opfacade"})
