"""The NVRTC pipeline needs no GPU: every kernel in native/ compiles for sm_80 and sm_90, the disk
cache hits, misses on any change, survives corruption, and compile errors carry what was asked."""

from __future__ import annotations

import pytest

from opfacade._backends.nvrtc import compiler
from opfacade.errors import CompileError
from opfacade.types import ArchSku


@pytest.mark.parametrize("arch", [ArchSku.sm80, ArchSku.sm90])
@pytest.mark.parametrize("source", compiler.native_sources())
def test_every_native_kernel_compiles(source, arch):
    kernel = compiler.compile_cubin(source, arch, use_cache=False)
    assert kernel.cubin[:4] == b"\x7fELF"


def test_compiling_leaves_python_constants_alone():
    """Regression: NVRTC once wrote an empty log's NUL into CPython's shared b" " object."""
    compiler.compile_cubin("alibi.cu", ArchSku.sm90, use_cache=False)
    assert b" "[0] == 0x20 and b" "[0] == 0x20


def test_native_sources_are_found():
    assert "alibi.cu" in compiler.native_sources()


def test_cache_hits_and_keys_cover_options_and_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFACADE_CACHE_DIR", str(tmp_path))
    first = compiler.compile_cubin("alibi.cu", ArchSku.sm90)
    again = compiler.compile_cubin("alibi.cu", ArchSku.sm90)
    assert not first.from_cache and again.from_cache and again.cubin == first.cubin
    other_arch = compiler.compile_cubin("alibi.cu", ArchSku.sm80)
    other_options = compiler.compile_cubin("alibi.cu", ArchSku.sm90, extra_options=("-DX=1",))
    assert len({first.key, other_arch.key, other_options.key}) == 3
    assert not other_options.from_cache
    assert len(list((tmp_path / "nvrtc").glob("*.cubin"))) == 3
    assert not list((tmp_path / "nvrtc").glob(".tmp-*"))  # atomic writes leave nothing behind


def test_corrupt_cache_file_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFACADE_CACHE_DIR", str(tmp_path))
    first = compiler.compile_cubin("alibi.cu", ArchSku.sm90)
    (path,) = (tmp_path / "nvrtc").glob("*.cubin")
    path.write_bytes(path.read_bytes()[:1000])  # torn write
    again = compiler.compile_cubin("alibi.cu", ArchSku.sm90)
    assert not again.from_cache and again.cubin == first.cubin


def test_compile_error_carries_source_options_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFACADE_CACHE_DIR", str(tmp_path))
    source = '#include "common.cuh"\nextern "C" __global__ void broken() { undeclared(); }\n'
    with pytest.raises(CompileError) as caught:
        compiler.compile_cubin("broken.cu", ArchSku.sm90, source=source)
    error = caught.value
    assert "undeclared" in error.log and error.source == source
    assert "-arch=sm_90" in error.options
    assert "2 | extern" in error.numbered_source()
    assert not (tmp_path / "nvrtc").exists() or not list((tmp_path / "nvrtc").iterdir())
