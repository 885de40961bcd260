"""The PTX NVRTC makes of a native/ source for sm_90, read on a machine without a GPU: each
kernel's parameter types (what the tests of a launcher compare its packed arguments with) and
each kernel's body (what NVVM made of it, for tests of its loads)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from opfacade._backends.nvrtc import compiler

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
