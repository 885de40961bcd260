"""Which pipe or memory level bounds each kernel of an ncu report: reads the report's raw page
(`ncu --import R --page raw --csv > raw.csv`) and prints, per kernel, its duration, the pipes'
utilisation and instruction shares, the memory throughputs, and its warp-stall reasons, largest
first. Used by scripts/gpu_f32.sh's stalls stage.

    python3 scripts/ncu_pipes.py raw.csv [--all REGEX]   # --all: every metric matching REGEX
"""

from __future__ import annotations

import argparse
import csv
import re

# Metric name patterns worth reading for a compute-bound kernel, in print order.
SECTIONS = (
    ("time", r"^gpu__time_duration\.sum$|^sm__cycles_elapsed\.avg$|^smsp__cycles_active\.avg$"),
    ("pipe cycles active, % of peak", r"^sm__pipe_.*cycles_active.*pct_of_peak_sustained_active$"),
    ("instructions by pipe, % of peak", r"^sm__inst_executed_pipe_.*pct_of_peak_sustained_active$"),
    ("issue", r"^smsp__issue_active.*pct|^sm__warps_active.*pct|^smsp__inst_executed\.sum$"),
    ("memory, % of peak", r"(l1tex__throughput|lts__throughput|dram__throughput|"
                          r"l1tex__data_pipe_lsu_wavefronts_mem_shared).*pct_of_peak"),
    ("stalls, cycles per issued instruction",
     r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"),
)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read(path: str) -> tuple[list[str], list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)  # skip ncu's log lines
    return rows[start], rows[start + 1], rows[start + 2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw_csv")
    parser.add_argument("--all", default=None, help="also print every metric matching this")
    args = parser.parse_args()
    header, units, kernels = read(args.raw_csv)
    name_at = header.index("Kernel Name")
    for row in kernels:
        print(f"### {row[name_at][:90]}")
        sections = list(SECTIONS) + ([("matching --all", args.all)] if args.all else [])
        for title, pattern in sections:
            found = []
            for i, metric in enumerate(header):
                if i < len(row) and re.search(pattern, metric):
                    value = _number(row[i])
                    if value:
                        found.append((value, metric, units[i] if i < len(units) else ""))
            if title != "time":
                found.sort(reverse=True)
            print(f"  {title}:")
            for value, metric, unit in found[:14]:
                print(f"    {value:12.3f} {unit:8s} {metric}")


if __name__ == "__main__":
    main()
