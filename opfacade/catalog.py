"""The SKU catalog, generated from the code: every op's candidates as JSON and as a table.

SKU definitions live beside their implementations; catalog/skus.json and catalog/skus.md in the
repository are generated from them (`python -m opfacade.catalog --write catalog`), and a test fails
when they drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ._registry import all_ops
from .types import KernelSku

__all__ = ["all_skus", "catalog_json", "catalog_table", "write_catalog"]

JSON_NAME = "skus.json"
TABLE_NAME = "skus.md"


def all_skus(op: str | None = None) -> list[KernelSku]:
    """Every SKU of every op (or of ``op``), in each op's candidate order."""
    return [impl.sku for spec in all_ops() if op in (None, spec.name) for impl in spec.skus]


def catalog_json(op: str | None = None) -> str:
    return json.dumps([sku.catalog_row() for sku in all_skus(op)], indent=2) + "\n"


def catalog_table(op: str | None = None, *, markdown: bool = True) -> str:
    """One row per SKU: what it computes, where it runs and what it guarantees."""
    header = ("id", "op", "element", "backend", "arch", "math", "accumulator", "deterministic",
              "bit_stable", "batch_invariant", "max_rel_error")
    rows = []
    for sku in all_skus(op):
        g = sku.precision_guarantee
        rows.append((sku.id, sku.op, sku.element.value, sku.backend.value,
                     sku.arch.value if sku.arch else "host", g.math_precision.value,
                     g.accumulator.value, "yes" if g.deterministic else "no",
                     "yes" if g.bit_stable else "no", "yes" if g.batch_invariant else "no",
                     f"{g.max_rel_error:.3g}"))
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines) + "\n"
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in (header, *rows)) + "\n"


def generated_files() -> dict[str, str]:
    title = "# opfacade SKU catalog\n\nGenerated from the code by `python -m opfacade.catalog " \
            "--write catalog`; do not edit.\n\n"
    return {JSON_NAME: catalog_json(), TABLE_NAME: title + catalog_table()}


def write_catalog(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in generated_files().items():
        (directory / name).write_text(text)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write_catalog(Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m opfacade.catalog --write DIRECTORY")
