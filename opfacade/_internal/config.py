"""Configuration, in one place: the environment, read when first asked for (not at import), and
the install extra that brings the GPU stack, named once for every "cannot load" message."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_DIR_VARIABLE", "GPU_EXTRA", "cache_dir", "with_install_hint"]

CACHE_DIR_VARIABLE = "OPFACADE_CACHE_DIR"

# The base install (numpy, pydantic) serves the catalog, explain and the float64 host reference;
# this extra brings the CUDA 13 libraries, CuPy, cuda-python, the cuDNN frontend and nvmath-python.
GPU_EXTRA = "opfacade[cu13]"


def with_install_hint(reason: str) -> str:
    """``reason`` (why a GPU backend cannot load) followed by the command that installs it."""
    return f"{reason}; the GPU stack comes with: pip install '{GPU_EXTRA}'"


def cache_dir() -> Path:
    """Where compiled kernels live: $OPFACADE_CACHE_DIR, else $XDG_CACHE_HOME/opfacade, else
    ~/.cache/opfacade. Never inside the package, which may be read-only."""
    explicit = os.environ.get(CACHE_DIR_VARIABLE)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opfacade"
