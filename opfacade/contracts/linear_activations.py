"""The linear family's activations, one row each, and the layouts of the aux they save.

Who computes each activation, what a training forward saves for the backward (the aux, a
saved-tensor layout of this contract) and who takes the derivative, in one table that every
backend asks (nvmath's ``epilog_protocol`` idea): nothing outside it compares activation names.

    activation  cuBLASLt epilogue      separate NVRTC pass        aux saved       d_pre kernel
    none        DEFAULT / BIAS         -                          -               - (grad_out)
    relu        RELU[_AUX][_BIAS]      -                          ReLU bit-mask   FromReluMask
    gelu_tanh   GELU[_AUX][_BIAS]      -                          pre-activation  FromPre<GeluTanh>
    gelu_erf    - (GELU is tanh-only)  linear_gelu_erf (GeluErf)  pre-activation  FromPre<GeluErf>
    silu        - (no SiLU epilogue)   linear_silu (Silu)         pre-activation  FromPre<Silu>

The aux layouts (what cuBLASLt reads and writes):

- the pre-activation ``x @ W + bias (+ residual)`` in the output's element type and shape
  ``[.., M, N]``; cuBLASLt needs its row stride (leading dimension) and batch stride to be
  multiples of 8 elements (``padded_row``);
- cuBLASLt's ReLU bit-mask of ``pre > 0``, one bit per output element, as u8
  ``[.., M, relu_mask_bytes(N)]``: row m holds the bits of ``out[m, :]``, bit n in byte ``n // 8``
  at position ``n % 8`` (least significant first); bits past N are unspecified. cuBLASLt needs
  the row length in bits to be a multiple of 128, hence 16-byte rows.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from ..types import ElementKind

__all__ = [
    "ACTIVATIONS",
    "PRE_ACTIVATION",
    "RELU_MASK",
    "ActivationSpec",
    "AuxLayout",
    "NativeKernel",
    "pack_relu_mask",
    "padded_row",
    "relu_mask_bytes",
    "unpack_relu_mask",
]

ROW_MULTIPLE = 8  # elements: cuBLASLt's leading-dimension rule for a pre-activation aux


def padded_row(n: int) -> int:
    """Elements per row of a pre-activation-shaped matrix (the aux, the backward's d_pre) whose
    rows cuBLASLt accepts: ``n`` rounded up to a multiple of 8. The one padding rule."""
    return -(-n // ROW_MULTIPLE) * ROW_MULTIPLE


def relu_mask_bytes(n: int) -> int:
    """Bytes per row of the ReLU bit-mask for ``n`` outputs: 128-bit (16-byte) multiples."""
    return -(-n // 128) * 16


def pack_relu_mask(pre: np.ndarray) -> np.ndarray:
    """The bit-mask of ``pre > 0`` for ``pre`` [.., M, N], padded with zero bits to full rows."""
    pre = np.asarray(pre)
    n = pre.shape[-1]
    bits = np.zeros(pre.shape[:-1] + (relu_mask_bytes(n) * 8,), dtype=np.uint8)
    bits[..., :n] = pre > 0
    return np.packbits(bits, axis=-1, bitorder="little")


def unpack_relu_mask(mask: np.ndarray, n: int) -> np.ndarray:
    """``pre > 0`` as booleans [.., M, n] from a bit-mask made by ``pack_relu_mask``."""
    bits = np.unpackbits(np.asarray(mask, dtype=np.uint8), axis=-1, bitorder="little")
    return bits[..., :n].astype(bool)


@dataclass(frozen=True)
class AuxLayout(abc.ABC):
    """One kind of saved aux: what it holds, its element type, its row length and the stride rule
    cuBLASLt imposes on it (row and batch strides multiples of ``row_multiple`` ``unit``)."""

    name: str
    mask: bool  # a bit-mask (u8, strides in bytes) rather than values of the element type
    unit: str  # what its strides count, for messages
    row_multiple: int

    @abc.abstractmethod
    def element(self, element: ElementKind) -> ElementKind:
        """The aux's element type in a problem of ``element``."""

    @abc.abstractmethod
    def columns(self, n: int) -> int:
        """The last extent of the aux of a problem with ``n`` outputs per row."""

    @abc.abstractmethod
    def row_stride(self, n: int) -> int:
        """The smallest row stride cuBLASLt accepts for it: the rows padded, in ``unit``."""

    @abc.abstractmethod
    def describe(self, lead: str) -> str:
        """Its shape in words, for error messages (``lead`` is "batch, " or "")."""

    @abc.abstractmethod
    def encode(self, pre: np.ndarray) -> np.ndarray:
        """What a forward saves, from the float64 pre-activation (the host reference's aux)."""

    @abc.abstractmethod
    def decode(self, aux: np.ndarray, n: int) -> np.ndarray:
        """A pre-activation the derivative can be taken at, from the aux: the aux itself, or for
        the mask +1 where pre > 0 and -1 elsewhere (all a ReLU derivative reads)."""


@dataclass(frozen=True)
class _PreActivation(AuxLayout):
    def element(self, element: ElementKind) -> ElementKind:
        return element

    def columns(self, n: int) -> int:
        return n

    def row_stride(self, n: int) -> int:
        return padded_row(n)

    def describe(self, lead: str) -> str:
        return f"[{lead}M, N], the pre-activation"

    def encode(self, pre: np.ndarray) -> np.ndarray:
        return pre

    def decode(self, aux: np.ndarray, n: int) -> np.ndarray:
        return aux


@dataclass(frozen=True)
class _ReluMask(AuxLayout):
    def element(self, element: ElementKind) -> ElementKind:
        return ElementKind.u8

    def columns(self, n: int) -> int:
        return relu_mask_bytes(n)

    def row_stride(self, n: int) -> int:
        return relu_mask_bytes(n)  # already whole 16-byte units

    def describe(self, lead: str) -> str:
        return f"[{lead}M, ceil(N/128)*16] bytes of ReLU bit-mask"

    def encode(self, pre: np.ndarray) -> np.ndarray:
        return pack_relu_mask(pre)

    def decode(self, aux: np.ndarray, n: int) -> np.ndarray:
        return np.where(unpack_relu_mask(aux, n), 1.0, -1.0)


PRE_ACTIVATION: AuxLayout = _PreActivation("pre-activation", mask=False, unit="elements",
                                           row_multiple=ROW_MULTIPLE)
RELU_MASK: AuxLayout = _ReluMask("ReLU bit-mask", mask=True, unit="bytes (128 mask bits)",
                                 row_multiple=16)


@dataclass(frozen=True)
class NativeKernel:
    """A kernel family in ``native/<source>``: ``<name>_<element suffix>`` per element type,
    instantiated from ``code`` (the functor or policy named in the source's kernel list)."""

    source: str
    name: str
    code: str


@dataclass(frozen=True)
class ActivationSpec:
    """One activation: who computes it, what it saves, who takes its derivative.

    Attributes:
        name: the descriptor's ``activation`` value.
        epilogue: the cuBLASLt epilogue prefix that computes it in the GEMM ("" for no
            activation: DEFAULT or BIAS; "RELU"; "GELU"), or None when no epilogue does.
        unfused: why cuBLASLt cannot fuse it (None when it can).
        act_pass: the forward's separate NVRTC pass, for what cuBLASLt cannot fuse.
        aux: what a training forward saves for the backward (None: the backward needs nothing).
        d_pre: the backward's ``d_pre = grad_out * act'(aux)`` kernel (None: d_pre is grad_out).
    """

    name: str
    epilogue: str | None
    unfused: str | None = None
    act_pass: NativeKernel | None = None
    aux: AuxLayout | None = None
    d_pre: NativeKernel | None = None

    def __post_init__(self) -> None:
        if (self.epilogue is None) != (self.unfused is not None) or (
                (self.epilogue is None) != (self.act_pass is not None)):
            raise ValueError(f"activation {self.name}: either a cuBLASLt epilogue computes it, or "
                             f"a separate pass does and `unfused` says why not cuBLASLt")
        if (self.aux is None) != (self.d_pre is None):
            raise ValueError(f"activation {self.name}: the d_pre kernel reads the aux it saves")

    @property
    def fused(self) -> bool:
        """Whether cuBLASLt computes it in the GEMM's epilogue."""
        return self.epilogue is not None


def _d_pre(name: str, code: str) -> NativeKernel:
    return NativeKernel("linear_grad.cu", f"linear_d{name}", code)


def _act_pass(name: str, code: str) -> NativeKernel:
    return NativeKernel("linear_act.cu", f"linear_{name}", code)


ACTIVATIONS: dict[str, ActivationSpec] = {spec.name: spec for spec in (
    ActivationSpec("none", epilogue=""),
    ActivationSpec("relu", epilogue="RELU", aux=RELU_MASK,
                   d_pre=_d_pre("relu", "FromReluMask")),
    ActivationSpec("gelu_tanh", epilogue="GELU", aux=PRE_ACTIVATION,
                   d_pre=_d_pre("gelu_tanh", "FromPre<GeluTanh>")),
    ActivationSpec("gelu_erf", epilogue=None,
                   unfused="cuBLASLt's GELU epilogues use the tanh approximation; it has none "
                           "for the exact (erf) GELU",
                   act_pass=_act_pass("gelu_erf", "GeluErf"), aux=PRE_ACTIVATION,
                   d_pre=_d_pre("gelu_erf", "FromPre<GeluErf>")),
    ActivationSpec("silu", epilogue=None, unfused="cuBLASLt has no SiLU epilogue",
                   act_pass=_act_pass("silu", "Silu"), aux=PRE_ACTIVATION,
                   d_pre=_d_pre("silu", "FromPre<Silu>")),
)}
