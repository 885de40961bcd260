"""The op families, one line each: a family's contract joined to the SKUs of every backend that
implements it. Nothing registers itself; a family left out of this table does not exist, and a
family named here whose modules are missing is an ImportError.

Within an op, candidates keep the order given here (each backend's SKUs in its own order), which
is selection's documented preference: GPU backends first, the float64 reference (the test
oracle, never offered for a GPU) last.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, fields

from ._backends.cublaslt import linear as cublaslt_linear
from ._backends.cudnn import decode as cudnn_decode
from ._backends.cudnn import sdpa as cudnn_sdpa
from ._backends.cudnn import varlen as cudnn_varlen
from ._backends.nvrtc import alibi as nvrtc_alibi
from ._backends.nvrtc import attention_f32 as nvrtc_attention
from ._backends.nvrtc import decode_attention as nvrtc_decode
from ._backends.reference import skus as reference
from ._internal.contract import Descriptor, OpContract
from ._internal.sku import SkuImpl
from .contracts import alibi, decode_attention, kv_append, linear, sdpa, varlen_attention
from .errors import InvalidProblem

__all__ = ["FAMILIES", "Family", "OpSpec", "all_ops", "op_for", "op_named"]


@dataclass(frozen=True)
class OpSpec(OpContract):
    """An op's contract with its candidate SKUs, in selection order."""

    skus: tuple[SkuImpl, ...] = ()


@dataclass(frozen=True)
class Family:
    """One op family: its contract module (whose ``OPS`` lists its ops) and, per backend,
    ``{op name: SKUs}``."""

    name: str
    contract: types.ModuleType
    implementations: tuple[dict[str, tuple[SkuImpl, ...]], ...]

    def ops(self) -> tuple[OpSpec, ...]:
        contracts = self.contract.OPS
        names = {op.name for op in contracts}
        for table in self.implementations:
            stray = set(table) - names
            if stray:
                raise ImportError(f"family {self.name}: SKUs for {sorted(stray)}, which its "
                                  f"contract does not declare (it declares {sorted(names)})")
        specs = []
        for op in contracts:
            skus = tuple(sku for table in self.implementations for sku in table.get(op.name, ()))
            if not skus:
                raise ImportError(f"family {self.name}: op {op.name} has no SKU")
            for sku in skus:
                if sku.sku.op != op.name:
                    raise ImportError(f"{sku.sku.id} is listed under {op.name}")
            specs.append(OpSpec(**{f.name: getattr(op, f.name) for f in fields(op)}, skus=skus))
        return tuple(specs)


FAMILIES: tuple[Family, ...] = (
    Family("alibi", alibi, (nvrtc_alibi.SKUS, reference.ALIBI)),
    Family("linear", linear, (cublaslt_linear.SKUS, reference.LINEAR)),
    Family("sdpa", sdpa, (cudnn_sdpa.SKUS, nvrtc_attention.SDPA_SKUS, reference.SDPA)),
    Family("varlen_attention", varlen_attention,
           (cudnn_varlen.SKUS, nvrtc_attention.VARLEN_SKUS, reference.VARLEN_ATTENTION)),
    Family("decode_attention", decode_attention,
           (nvrtc_decode.DECODE_SKUS, cudnn_decode.SKUS, reference.DECODE_ATTENTION)),
    Family("kv_append", kv_append, (nvrtc_decode.APPEND_SKUS, reference.KV_APPEND)),
)

_OPS: dict[str, OpSpec] = {op.name: op for family in FAMILIES for op in family.ops()}
_BY_DESCRIPTOR: dict[type[Descriptor], OpSpec] = {op.descriptor: op for op in _OPS.values()}


def all_ops() -> list[OpSpec]:
    """Every op of every family, in table order."""
    return list(_OPS.values())


def op_named(name: str) -> OpSpec:
    try:
        return _OPS[name]
    except (KeyError, TypeError):
        known = ", ".join(_OPS)
        raise InvalidProblem(f"op must be one of {known}, got {name!r}", field="op") from None


def op_for(descriptor: object) -> OpSpec:
    op = _BY_DESCRIPTOR.get(type(descriptor))
    if op is None:
        raise InvalidProblem(
            f"descriptor must be an opfacade descriptor, got {type(descriptor).__name__}",
            field="descriptor")
    return op
