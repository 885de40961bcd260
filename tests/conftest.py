"""Shared fixtures: the gpu marker skips without a GPU; caches live in a temporary directory."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from opfacade._internal.device import device_count

HAS_GPU = device_count() > 0


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_kernel_cache(tmp_path_factory, monkeypatch):
    """Each test session compiles into its own cache directory, never the user's."""
    cache = tmp_path_factory.getbasetemp() / "opfacade-cache"
    monkeypatch.setenv("OPFACADE_CACHE_DIR", str(cache))
    yield cache


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
