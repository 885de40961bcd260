"""Every op family registers its OpSpec here at import; the catalog and CLI read it back."""

from __future__ import annotations

import threading

from ..errors import InvalidProblem
from .sku import OpSpec

_lock = threading.Lock()
_by_name: dict[str, OpSpec] = {}
_by_descriptor: dict[type, OpSpec] = {}


def register(op: OpSpec) -> OpSpec:
    with _lock:
        if op.name in _by_name:
            raise RuntimeError(f"op {op.name!r} is registered twice")
        _by_name[op.name] = op
        _by_descriptor[op.descriptor] = op
    return op


def _ensure_loaded() -> None:
    # Importing the package imports every op module, and each registers itself.
    import opfacade  # noqa: F401


def all_ops() -> list[OpSpec]:
    _ensure_loaded()
    return list(_by_name.values())


def op_named(name: str) -> OpSpec:
    _ensure_loaded()
    try:
        return _by_name[name]
    except KeyError:
        known = ", ".join(sorted(_by_name))
        raise InvalidProblem(f"op must be one of {known}, got {name!r}", field="op") from None


def op_for(descriptor: object) -> OpSpec:
    _ensure_loaded()
    op = _by_descriptor.get(type(descriptor))
    if op is None:
        raise InvalidProblem(
            f"descriptor must be an opfacade descriptor, got {type(descriptor).__name__}",
            field="descriptor",
        )
    return op
