"""The PTX NVRTC makes of a native/ source for sm_90, read on a machine without a GPU: each
kernel's parameter types (what the tests of a launcher compare its packed arguments with) and
each kernel's body (what NVVM made of it, for tests of its loads). Where nvdisasm is installed
(the test extra's nvidia-cuda-nvdisasm), also each kernel's SASS: what ptxas made of the PTX,
for tests of where it placed a load."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from opfacade._backends.nvrtc import compiler
from opfacade.types import ArchSku

NATIVE = Path(__file__).resolve().parents[1] / "native"
# What each PTX parameter type holds, as the numpy scalar a launcher packs for it (PTX declares
# 64-bit parameters .u64 or .s64 whether the kernel's type is signed or not).
PTX_TYPES = {"u64": (np.uint64, np.int64), "s64": (np.uint64, np.int64),
             "u32": (np.int32,), "s32": (np.int32,), "f32": (np.float32,)}


def kernel_parameters(source_name: str) -> dict[str, list[str]]:
    """{kernel name: [PTX parameter type, ...]} for every entry of native/<source_name>."""
    return {name: re.findall(r"\.param \.(\w+) ", params)
            for name, (params, _) in kernel_ptx(source_name).items()}


@functools.cache
def kernel_ptx(source_name: str) -> dict[str, tuple[str, str]]:
    """{kernel name: (its PTX parameter list, its PTX body)} for every entry of
    native/<source_name>."""
    from cuda.bindings import nvrtc

    source = (NATIVE / source_name).read_text()
    headers = {p.name: p.read_text() for p in sorted(NATIVE.glob("*.cuh"))}
    _, program = nvrtc.nvrtcCreateProgram(source.encode(), source_name.encode(), len(headers),
                                          [t.encode() for t in headers.values()],
                                          [n.encode() for n in headers])
    options = [*compiler.BASE_OPTIONS, "-arch=compute_90"]
    try:
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS
        _, size = nvrtc.nvrtcGetPTXSize(program)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(program, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    text = bytes(ptx).rstrip(b"\0").decode()
    starts = list(re.finditer(r"\.entry (\w+)\((.*?)\)", text, re.S))
    ends = [match.start() for match in starts[1:]] + [len(text)]
    return {match.group(1): (match.group(2), text[match.end():end])
            for match, end in zip(starts, ends, strict=True)}


def assert_packed_like_declared(name: str, args: tuple, parameters: dict[str, list[str]]) -> None:
    """``args`` has one scalar per parameter of kernel ``name``, each of a type it may hold."""
    assert len(args) == len(parameters[name]), name
    for i, (arg, ptx_type) in enumerate(zip(args, parameters[name], strict=True)):
        assert type(arg) in PTX_TYPES[ptx_type], (name, i, type(arg), ptx_type)


def nvdisasm() -> str | None:
    """nvdisasm's path: the nvidia-cuda-nvdisasm wheel's, else one on PATH, else None."""
    try:
        import nvidia
    except ImportError:
        return shutil.which("nvdisasm")
    found = [str(path) for root in nvidia.__path__ for path in Path(root).glob("*/bin/nvdisasm")]
    return found[0] if found else shutil.which("nvdisasm")


@functools.cache
def kernel_sass(source_name: str) -> dict[str, list[str]]:
    """{kernel name: [its SASS instructions, in order]} for every entry of native/<source_name>
    compiled for sm_90 (the cubin a device loads). Needs nvdisasm (the caller skips without)."""
    cubin = compiler.compile_cubin(source_name, ArchSku.sm90,
                                   source=(NATIVE / source_name).read_text(), use_cache=False).cubin
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "kernels.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([nvdisasm(), "-c", str(path)], check=True, capture_output=True,
                              text=True).stdout
    kernels: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if match := re.match(r"^\.text\.(\w+):", line):
            name = match.group(1)
            kernels[name] = []
        elif name and (match := re.match(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)):
            kernels[name].append(match.group(1))
    return kernels
