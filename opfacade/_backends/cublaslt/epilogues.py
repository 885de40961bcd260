"""Which cuBLASLt epilogue serves which (activation, bias, aux) and what each one reads or writes.

One table (nvmath's ``epilog_protocol.py`` idea, much smaller): every epilogue we use, with its
``cublasLtEpilogue_t`` value, whether it reads or writes the bias vector and whether it reads or
writes the aux matrix. cuBLASLt has GELU only in its tanh approximation, and no SiLU.

The aux (what a training forward saves for the backward) is, by activation:

- ``gelu_tanh`` (and ``gelu_erf`` and ``silu``, whose activation runs in a separate pass): the
  pre-activation ``x @ W + bias (+ residual)`` in the output's element type and
  shape ``[.., M, N]``; cuBLASLt needs its row stride (its leading dimension) to be a multiple of
  8 elements.
- ``relu``: cuBLASLt's bit-mask of ``pre > 0``, one bit per output element, as ``u8``
  ``[.., M, relu_mask_bytes(N)]``: row ``m`` holds the bits of ``out[m, :]``, bit ``n`` in byte
  ``n // 8`` at position ``n % 8`` (least significant first); bits past ``N`` are unspecified.
  cuBLASLt needs the row length in bits to be a multiple of 128, hence 16-byte rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...contracts.linear import relu_mask_bytes

__all__ = [
    "BGRADA", "BGRADB", "DEFAULT", "Epilogue",
    "forward_epilogue", "relu_mask_bytes", "unsupported",
]


@dataclass(frozen=True)
class Epilogue:
    """One ``cublasLtEpilogue_t``: ``bias`` and ``aux`` are None, "in" or "out"."""

    name: str
    value: int
    bias: str | None = None
    aux: str | None = None

    @property
    def aux_is_mask(self) -> bool:
        return "RELU" in self.name


_ALL = (
    Epilogue("DEFAULT", 1),
    Epilogue("RELU", 2),
    Epilogue("RELU_AUX", 130, aux="out"),
    Epilogue("BIAS", 4, bias="in"),
    Epilogue("RELU_BIAS", 6, bias="in"),
    Epilogue("RELU_AUX_BIAS", 134, bias="in", aux="out"),
    Epilogue("DRELU", 136, aux="in"),
    Epilogue("DRELU_BGRAD", 152, bias="out", aux="in"),
    Epilogue("GELU", 32),
    Epilogue("GELU_AUX", 160, aux="out"),
    Epilogue("GELU_BIAS", 36, bias="in"),
    Epilogue("GELU_AUX_BIAS", 164, bias="in", aux="out"),
    Epilogue("DGELU", 192, aux="in"),
    Epilogue("DGELU_BGRAD", 208, bias="out", aux="in"),
    Epilogue("BGRADA", 256, bias="out"),
    Epilogue("BGRADB", 512, bias="out"),
)
EPILOGUES = {e.name: e for e in _ALL}
DEFAULT, BGRADA, BGRADB = EPILOGUES["DEFAULT"], EPILOGUES["BGRADA"], EPILOGUES["BGRADB"]

_ACTIVATION_PREFIX = {"none": "", "relu": "RELU", "gelu_tanh": "GELU"}
_UNSUPPORTED = {
    "gelu_erf": "cuBLASLt's GELU epilogues use the tanh approximation; it has none for the "
                "exact (erf) GELU",
    "silu": "cuBLASLt has no SiLU epilogue",
}


def unsupported(activation: str) -> str | None:
    """Why no cuBLASLt epilogue computes ``activation``, or None."""
    return _UNSUPPORTED.get(activation)


def forward_epilogue(activation: str, bias: bool, save_aux: bool) -> Epilogue:
    """The epilogue of ``out = activation(x @ W [+ bias] [+ residual])`` [saving the aux]."""
    prefix = _ACTIVATION_PREFIX[activation]
    if not prefix:
        return EPILOGUES["BIAS"] if bias else DEFAULT
    return EPILOGUES[prefix + ("_AUX" if save_aux else "") + ("_BIAS" if bias else "")]
