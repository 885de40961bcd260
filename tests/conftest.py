"""Shared fixtures: the gpu marker skips without a GPU; caches live in a temporary directory."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opfacade._backends.nvrtc import compiler
from opfacade._internal.config import cache_dir
from opfacade._internal.device import device_count

HAS_GPU = device_count() > 0


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A directory whose nvrtc/ holds cubins compiled ahead (a device call's carried cache): each test
# session's private cache starts with a copy of them, so a session on a freshly started GPU
# machine does not spend its first minute recompiling what the call carried. Cubins are keyed by
# source, options, arch and NVRTC version and checked on load, so a stale one is only a miss;
# cuDNN plans are never copied (tests count what they build and load).
CUBIN_SEED_VARIABLE = "OPFACADE_TEST_CUBIN_SEED"


# The session's cache and the cubins it was seeded with, for the summary line below.
_SESSION_CUBINS: dict[str, Path | set[str]] = {}


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.getbasetemp() / "opfacade-cache"
    seed = os.environ.get(CUBIN_SEED_VARIABLE)
    cubins = compiler.directory().relative_to(cache_dir())  # the compiler's folder in a cache
    if seed and (Path(seed) / cubins).is_dir():
        shutil.copytree(Path(seed) / cubins, cache / cubins, dirs_exist_ok=True)
    _SESSION_CUBINS.update(folder=cache / cubins, seeded=_cubin_names(cache / cubins))
    return cache


def _cubin_names(folder: Path) -> set[str]:
    return {path.name for path in folder.glob(f"*{compiler.CUBIN_SUFFIX}")}


def pytest_terminal_summary(terminalreporter):
    """One line on what the session's NVRTC kernels cost: how many cubins came from the seed
    and how many the session compiled (a device call's log shows whether the seed served)."""
    if "folder" not in _SESSION_CUBINS:
        return
    seeded = _SESSION_CUBINS["seeded"]
    compiled = _cubin_names(_SESSION_CUBINS["folder"]) - seeded
    terminalreporter.write_line(f"opfacade cubins: {len(seeded)} from the seed "
                                f"({CUBIN_SEED_VARIABLE}), {len(compiled)} compiled here")


@pytest.fixture(autouse=True)
def _private_kernel_cache(_session_cache, monkeypatch):
    """Each test session compiles into its own cache directory, never the user's."""
    monkeypatch.setenv("OPFACADE_CACHE_DIR", str(_session_cache))
    yield _session_cache


@pytest.fixture(scope="session")
def gpt_example():
    """examples/gpt.py as a module (it is a script, not part of the package)."""
    pytest.importorskip("torch")
    path = Path(__file__).parent.parent / "examples" / "gpt.py"
    spec = importlib.util.spec_from_file_location("example_gpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def libcuda_stand_in(tmp_path_factory) -> Path:
    """tests/data/libcuda_stand_in.c built as ``libcuda.so.1`` in a folder of its own (so a child
    process can find it by libcuda's name through LD_LIBRARY_PATH); skipped without a C
    compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the libcuda stand-in")
    source = Path(__file__).parent / "data" / "libcuda_stand_in.c"
    library = tmp_path_factory.mktemp("libcuda_stand_in") / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                   check=True)
    return library
