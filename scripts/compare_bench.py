"""Compares two `opfacade bench --json` records row by row: each peer's ratio (peer ms / ours)
before and after a change, so a refactor can show that no GPU figure got worse.

    python3 scripts/compare_bench.py before.json after.json [--markdown]
"""

from __future__ import annotations

import json
import sys


def _rows(path: str) -> dict[tuple[str, str], dict]:
    with open(path) as f:
        return {(row["op"], row["case"]): row for row in json.load(f)["rows"]}


def main(argv: list[str]) -> int:
    before, after = _rows(argv[0]), _rows(argv[1])
    markdown = "--markdown" in argv
    lines = [("op", "case", "peer", "ratio before", "ratio after", "change")]
    worst = 0.0
    for key, row in after.items():
        old = before.get(key)
        if old is None:
            lines.append((*key, "-", "-", "new row", ""))
            continue
        for peer, peer_ms in row["peers_ms"].items():
            old_peer = old["peers_ms"].get(peer)
            if not old_peer or not peer_ms or not row["ours_ms"] or not old["ours_ms"]:
                continue
            r_old, r_new = old_peer / old["ours_ms"], peer_ms / row["ours_ms"]
            change = r_new / r_old - 1
            worst = min(worst, change)
            lines.append((*key, peer, f"{r_old:.3f}", f"{r_new:.3f}", f"{change:+.1%}"))
        graph = row.get("graph_ms") or {}
        for peer, peer_ms in graph.items():  # a host-bound row: the CUDA-graph replay ratios
            if peer != "ours" and "ours" in graph:
                lines.append((*key, f"{peer} (graph)", "-", f"{peer_ms / graph['ours']:.3f}",
                              "host-bound: " + ", ".join(row.get("host_bound", []))))
    widths = [max(len(str(line[i])) for line in lines) for i in range(6)]
    for line in lines:
        cells = [str(c).ljust(w) for c, w in zip(line, widths, strict=True)]
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))
    print(f"worst ratio change: {worst:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
