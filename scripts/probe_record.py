"""Where the device probes of this folder leave their records: ``$OUT``, the folder whose files
the device tool brings back (``/tmp/out`` where it is not set). A probe run as
``python3 scripts/<probe>.py`` finds this module beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write(name: str, record: object) -> Path:
    """``record`` as ``$OUT/<name>.json``; returns the path."""
    folder = Path(os.environ.get("OUT") or "/tmp/out")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(record, indent=1))
    return path
