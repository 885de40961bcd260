"""How the bench's host rows launch (issue 14 §3): the rows of ``opfacade bench --op host``,
with each library call counted as a direct launch (cuDNN's execute, cuBLASLt's matmul) or a
CUDA-graph replay, per row. run()'s memo keeps a prepared call per tensor addresses, captured at
its ``LIBRARY_CAPTURE_AT``-th call; a row whose outputs land at new addresses keeps launching
directly. ``--capture-at N`` sets that count for the run (2: every repeat replays).

    python3 scripts/host_rows_launch_probe.py [--capture-at N] [out.json]
"""

from __future__ import annotations

import argparse
import collections
import sys

from gpt_profile import write_report  # this directory is on sys.path

from opfacade._bench import common, host
from opfacade._internal import graph_replay

COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
ROW = ["(setup)"]


def count_launches() -> None:
    launches = graph_replay.GraphedLaunches
    direct, call = launches._launch_direct, launches.__call__

    def counted_direct(self):
        COUNTS[ROW[0]]["direct"] += 1
        direct(self)

    def counted_call(self):
        COUNTS[ROW[0]]["calls"] += 1
        call(self)

    launches._launch_direct, launches.__call__ = counted_direct, counted_call


def tag_rows() -> None:
    interleaved = common.host_us_interleaved

    def tagged(fns, *args, **kwargs):
        def tag(name, fn):
            def run():
                ROW[0] = name
                return fn()
            return run
        return interleaved({name: tag(name, fn) for name, fn in fns.items()}, *args, **kwargs)

    host.host_us_interleaved = tagged


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capture-at", type=int)
    parser.add_argument("json", nargs="?")
    options = parser.parse_args()
    if options.capture_at:
        graph_replay.LIBRARY_CAPTURE_AT = options.capture_at
    count_launches()
    tag_rows()
    rows = host.run()
    print(common.format_rows(rows))
    launches = {row: dict(counts) for row, counts in COUNTS.items()}
    for row, counts in launches.items():
        print(f"{row:32s} {counts.get('direct', 0):6d} direct of {counts.get('calls', 0):6d}")
    write_report({"capture_at": graph_replay.LIBRARY_CAPTURE_AT,
                  "rows": {r.case: {"ours_us": r.ours_ms * 1e3,
                                    "peers_us": {p: ms * 1e3 for p, ms in r.peers_ms.items()}}
                           for r in rows},
                  "launches": launches})
    return 0


if __name__ == "__main__":
    sys.exit(main())
