"""Builds of native/decode_attention.cu for the decode probes (decode_variants.py,
decode_b1_neighbours_probe.py, beside this file): compiled with other options and loaded, then
launched by the decode plans in place of the package's own build."""

from __future__ import annotations

from pathlib import Path

from opfacade._backends.nvrtc import compiler, launch
from opfacade._backends.nvrtc import decode as kernels
from opfacade.types import ArchSku


def load_build(options: tuple[str, ...], name: str = kernels.SOURCE):
    """native/``name`` (decode_attention.cu, or decode_wg.cu for sm_90a) compiled for sm_90 with
    ``options`` (-D flags; "source=PATH" compiles that file instead; "root=PATH" takes the
    kernel file and its headers from another copy of native/), loaded as a CuPy module."""
    import cupy

    source = next((Path(o[len("source="):]).read_text() for o in options
                   if o.startswith("source=")), None)
    root = next((Path(o[len("root="):]) for o in options if o.startswith("root=")), None)
    flags = tuple(o for o in options if not o.startswith(("source=", "root=")))
    native_root = compiler._native_root
    if root is not None:
        compiler._native_root = lambda: root
        source = (root / name).read_text()
    try:
        cubin = compiler.compile_cubin(name, ArchSku.sm90, source=source,
                                       extra_options=flags).cubin
    finally:
        compiler._native_root = native_root
    module = cupy.cuda.function.Module()
    module.load(cubin)
    return module


def use_module(module, wg_module=None) -> None:
    """Makes the decode plans launch ``module``'s kernels of decode_attention.cu and, if given,
    ``wg_module``'s of decode_wg.cu (plans made from here on: the kernel cache's memos are keyed
    by kernel handle, and a module loaded here may reuse a freed one's addresses, so they are
    cleared). Other sources stay the package's own."""
    launch.KERNELS.clear()
    modules = {kernels.SOURCE: module, kernels.WG_SOURCE: wg_module}
    package = launch.get_kernel
    kernels.get_kernel = lambda source, kernel, device: (
        modules[source].get_function(kernel) if modules.get(source) is not None
        else package(source, kernel, device))
