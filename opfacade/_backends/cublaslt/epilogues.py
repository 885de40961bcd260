"""Which cuBLASLt epilogue serves which (activation, bias, aux) and what each one reads or writes.

One table (nvmath's ``epilog_protocol.py`` idea, much smaller): every epilogue we use, with its
``cublasLtEpilogue_t`` value, whether it reads or writes the bias vector and whether it reads or
writes the aux matrix. Which activation has which epilogue prefix (cuBLASLt has GELU only in its
tanh approximation, and no SiLU), and the layouts of the aux each saves, are the linear
contract's activation table (``opfacade/contracts/linear_activations.py``); this module only
spells the epilogue out.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BGRADA", "BGRADB", "DEFAULT", "EPILOGUES", "Epilogue", "forward_epilogue"]


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

    @property
    def aux_ld_scale(self) -> int:
        """What the aux's leading dimension and batch stride count per stored unit: 8 bits per
        byte of the ReLU mask, else 1 element."""
        return 8 if self.aux_is_mask else 1


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


def forward_epilogue(prefix: str, bias: bool, save_aux: bool) -> Epilogue:
    """The epilogue of ``out = activation(x @ W [+ bias] [+ residual])`` [saving the aux], for
    the activation's epilogue prefix (``ActivationSpec.epilogue``; "" for none)."""
    if not prefix:
        return EPILOGUES["BIAS"] if bias else DEFAULT
    return EPILOGUES[prefix + ("_AUX" if save_aux else "") + ("_BIAS" if bias else "")]
