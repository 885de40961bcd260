"""Where the device probes of this folder leave their records: ``$OUT``, the folder whose files
the device tool brings back (``/tmp/out`` where it is not set), or the path a probe was given
on its command line. A probe run as ``python3 scripts/<probe>.py`` finds this module beside it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def write(name: str, record: object) -> Path:
    """``record`` as ``$OUT/<name>.json``; returns the path."""
    folder = Path(os.environ.get("OUT") or "/tmp/out")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(record, indent=1))
    return path


def write_to_argument(record: object) -> Path | None:
    """``record`` at the first command-line argument that is not a ``--`` flag, if there is
    one (the decode probes' ``probe.py [out.json] [--flags]``); returns the path."""
    paths = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    if not paths:
        return None
    path = Path(paths[0])
    path.write_text(json.dumps(record, indent=1))
    return path
