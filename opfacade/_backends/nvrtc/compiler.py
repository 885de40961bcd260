"""NVRTC: CUDA C++ in native/ to cubin for one architecture, cached on disk.

Compilation needs no GPU (only the NVRTC library), so CI compiles every kernel for sm_80 and sm_90.
The cache key covers everything that changes the binary: the source, every header in native/, the
options, the target arch, the NVRTC version and opfacade's version. Files are written atomically
and carry a digest of their payload, so a torn or corrupted file is a miss, never a bad load.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from ..._internal.config import cache_dir
from ..._internal.disk_cache import read_checked, write_atomically
from ..._internal.log import LOG, timed
from ...errors import BackendUnavailable, CompileError
from ...types import ArchSku

__all__ = ["CUBIN_SUFFIX", "CompiledKernel", "compile_cubin", "directory", "native_sources",
           "nvrtc_version", "read_native"]

# Every kernel is built with these; -lineinfo costs nothing at run time and lets
# compute-sanitizer and Nsight point at source lines.
BASE_OPTIONS = ("-std=c++17", "-lineinfo", "-default-device")
CUBIN_SUFFIX = ".cubin"
# Sources that use an architecture's own features (decode_wg.cu: sm_90a's wgmma), compiled for
# that variant there (a cubin that loads on compute capability 9.0 alone, every sm90 device)
# and plainly elsewhere, where their kernels trap and no plan launches them.
ARCH_SPECIFIC = {"decode_wg.cu": ArchSku.sm90}


def arch_option(name: str, arch: ArchSku) -> str:
    """NVRTC's -arch value for native/<name> on ``arch``."""
    return arch.nvrtc_arch + ("a" if ARCH_SPECIFIC.get(name) == arch else "")


def _native_root() -> Path:
    """native/ as installed (opfacade.native) or, in a source checkout, beside the package."""
    try:
        root = Path(str(resources.files("opfacade.native")))
        if root.is_dir():
            return root
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[3] / "native"


def native_sources() -> list[str]:
    """The kernel files (``*.cu``) in native/, each compiled as one NVRTC program."""
    return sorted(p.name for p in _native_root().glob("*.cu"))


def read_native(name: str) -> str:
    return (_native_root() / name).read_text()


def _native_headers() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(_native_root().glob("*.cuh"))}


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:  # pragma: no cover - cuda-python is a hard dependency
        raise BackendUnavailable(
            f"NVRTC is unavailable: cuda-python failed to import ({error})") from None
    return nvrtc


def _check(result, what: str):
    """cuda.bindings returns (status, *values); raise on a bad status, return the values."""
    status, *values = result if isinstance(result, tuple) else (result,)
    nvrtc = _nvrtc()
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BackendUnavailable(f"NVRTC {what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


@cache
def nvrtc_version() -> tuple[int, int]:
    try:
        major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    except RuntimeError as error:  # the shared library itself could not be found
        raise BackendUnavailable(f"NVRTC is unavailable: {error}") from error
    return int(major), int(minor)


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin and where it came from."""

    name: str
    arch: ArchSku
    cubin: bytes
    key: str
    from_cache: bool


def _package_version() -> str:
    from ... import __version__

    return __version__


def cache_key(source: str, headers: dict[str, str], options: tuple[str, ...], arch: ArchSku) -> str:
    digest = hashlib.sha256()
    for part in (
        source,
        *(f"{name}\0{text}" for name, text in sorted(headers.items())),
        "\0".join(options),
        arch.value,
        "nvrtc {}.{}".format(*nvrtc_version()),
        "opfacade " + _package_version(),
    ):
        digest.update(part.encode())
        digest.update(b"\x1e")
    return digest.hexdigest()


def directory() -> Path:
    """Where compiled cubins are cached (``opfacade cache`` lists and clears it)."""
    return cache_dir() / "nvrtc"


def _cache_path(name: str, arch: ArchSku, key: str) -> Path:
    stem = Path(name).stem
    return directory() / f"{stem}-{arch.value}-{key[:40]}{CUBIN_SUFFIX}"


def _nvrtc_compile(name: str, source: str, headers: dict[str, str], options: tuple[str, ...]):
    nvrtc = _nvrtc()
    header_names = list(headers)
    program = _check(
        nvrtc.nvrtcCreateProgram(
            source.encode(),
            name.encode(),
            len(header_names),
            [headers[h].encode() for h in header_names],
            [h.encode() for h in header_names],
        ),
        "nvrtcCreateProgram",
    )
    try:
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        # NVRTC writes into these buffers, so they must be fresh mutable memory: `b" " * 1` is
        # CPython's shared one-byte b" ", and writing a log's NUL into it corrupts the process.
        size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        log = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
        log_text = bytes(log).rstrip(b"\0 ").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(name, source, options, log_text or repr(status))
        size = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def compile_cubin(
    name: str,
    arch: ArchSku,
    *,
    source: str | None = None,
    extra_options: tuple[str, ...] = (),
    use_cache: bool = True,
) -> CompiledKernel:
    """Compiles native/<name> (or ``source``, named ``name``) to a cubin for ``arch``."""
    text = read_native(name) if source is None else source
    headers = _native_headers()
    options = (*BASE_OPTIONS, f"-arch={arch_option(name, arch)}", *extra_options)
    key = cache_key(text, headers, options, arch)
    path = _cache_path(name, arch, key)
    if use_cache and (cubin := read_checked(path)) is not None:
        LOG.debug("cubin cache hit: %s for %s", name, arch)
        return CompiledKernel(name, arch, cubin, key, from_cache=True)
    LOG.debug("cubin cache miss: %s for %s", name, arch)
    with timed("NVRTC compile of %s for %s", name, arch):
        cubin = _nvrtc_compile(name, text, headers, options)
    if use_cache:
        write_atomically(path, cubin)
    return CompiledKernel(name, arch, cubin, key, from_cache=False)
