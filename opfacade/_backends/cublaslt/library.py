"""The one place opfacade touches ``nvmath.bindings.cublasLt``: lazy import, handles, errors.

nvmath takes most of a second to import, so nothing here imports it before a GPU plan needs it.
Handles are per (thread, device), as cuBLASLt recommends; each is created with its device current
and destroyed when its thread ends. The constants are the C enums' values (the stable cuBLASLt
ABI), so that tables can be written and tested without importing nvmath;
``tests/test_linear.py`` checks them against nvmath's enums.
"""

from __future__ import annotations

from functools import cache

from ..._internal.config import with_install_hint
from ..._internal.device import on_device
from ..._internal.handles import PerThreadHandles
from ...errors import BackendUnavailable, LaunchFailed, Unsupported
from ...types import ElementKind

__all__ = [
    "CUDA_R_16BF", "CUDA_R_16F", "CUDA_R_32F", "COMPUTE_32F", "COMPUTE_32F_FAST_TF32",
    "NotSupportedStatus", "Types", "available", "binding", "checked", "handle", "types_for",
]

# cudaDataType_t
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
# cublasComputeType_t
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
# cublasStatus_t values that mean "valid, but not served", not "failed"
_NOT_SUPPORTED, _ARCH_MISMATCH = 15, 8


class NotSupportedStatus(Unsupported):
    """cuBLASLt answered NOT_SUPPORTED or ARCH_MISMATCH for a configuration."""


class Types:
    """Compute type, scale type and the element type of A, B, C and D for one SKU element."""

    __slots__ = ("compute", "scale", "data", "itemsize")

    def __init__(self, compute: int, data: int, itemsize: int):
        self.compute, self.scale, self.data, self.itemsize = compute, CUDA_R_32F, data, itemsize


def types_for(element: ElementKind) -> Types:
    """bf16/f16 on tensor cores with f32 accumulation; f32 in true f32; tf32 in TF32."""
    return {
        ElementKind.bf16: Types(COMPUTE_32F, CUDA_R_16BF, 2),
        ElementKind.f16: Types(COMPUTE_32F, CUDA_R_16F, 2),
        ElementKind.f32: Types(COMPUTE_32F, CUDA_R_32F, 4),
        ElementKind.tf32: Types(COMPUTE_32F_FAST_TF32, CUDA_R_32F, 4),
    }[element]


@cache
def _import_error() -> str | None:
    try:
        import nvmath.bindings.cublasLt  # noqa: F401
    except Exception as error:  # ImportError, or a broken install raising anything else
        return f"nvmath-python's cuBLASLt binding failed to import: {error}"
    return None


def available() -> str | None:
    """Why cuBLASLt cannot be used in this process (with what to install), or None. Loads
    nothing on the GPU."""
    why = _import_error()
    return None if why is None else with_install_hint(why)


def binding():
    """The ``nvmath.bindings.cublasLt`` module (imported on first use)."""
    missing = _import_error()
    if missing is not None:
        raise BackendUnavailable(missing)
    import nvmath.bindings.cublasLt as cublaslt

    return cublaslt


def checked(what: str, call, *args):
    """Runs one binding call; library errors become opfacade's typed errors naming ``what``."""
    try:
        return call(*args)
    except Exception as error:
        status = getattr(error, "status", None)
        if type(error).__name__ == "cuBLASLtError":
            if status in (_NOT_SUPPORTED, _ARCH_MISMATCH) or any(
                    name in str(error) for name in ("NOT_SUPPORTED", "ARCH_MISMATCH")):
                raise NotSupportedStatus(f"{what}: cuBLASLt does not support this "
                                         f"configuration ({error})") from error
            raise LaunchFailed(f"{what} failed: {error}") from error
        if type(error).__name__ == "NotSupportedError":  # the library or driver cannot load
            raise BackendUnavailable(f"{what}: cuBLASLt cannot be loaded ({error})") from error
        raise


def _create(device: int) -> int:
    with on_device(device):
        return checked(f"cublasLtCreate on cuda:{device}", binding().create)


def _destroy(device: int, lt_handle: int) -> None:
    with on_device(device):  # cublasLtDestroy synchronises the device
        binding().destroy(lt_handle)


_handles: PerThreadHandles[int] = PerThreadHandles(_create, _destroy)


def handle(device: int) -> int:
    """This thread's cuBLASLt handle for ``device``, created on first use."""
    return _handles.get(device)
