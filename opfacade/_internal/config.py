"""Configuration read from the environment, in one place, when first asked for (not at import)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VARIABLE = "OPFACADE_CACHE_DIR"


def cache_dir() -> Path:
    """Where compiled kernels live: $OPFACADE_CACHE_DIR, else $XDG_CACHE_HOME/opfacade, else
    ~/.cache/opfacade. Never inside the package, which may be read-only."""
    explicit = os.environ.get(CACHE_DIR_VARIABLE)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opfacade"
