"""Which tests of a GPU test file leave a process that aborts at interpreter exit (glibc's
"free(): invalid pointer" / "double free or corruption" after pytest's summary, exit status
134). Halves the file's test ids while one half alone still aborts. Where neither half does
(the abort needs tests from both), looks for one test of each half that abort together. Each
step is a fresh pytest process.

    python3 scripts/exit_crash_bisect.py tests/test_torch_gpu.py [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def collect(path: str) -> list[str]:
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                             "-p", "no:cacheprovider", path], capture_output=True, text=True)
    return [line.strip() for line in listed.stdout.splitlines() if "::" in line]


def aborts(ids: list[str]) -> bool:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", *ids], capture_output=True, text=True)
    tail = [line for line in (done.stdout + done.stderr).splitlines()
            if "passed" in line or "failed" in line or "free" in line or "corrupt" in line]
    print(f"  {len(ids)} tests ({ids[0].split('::')[-1]} .. {ids[-1].split('::')[-1]}): "
          f"rc={done.returncode} in {time.perf_counter() - start:.0f} s; {tail[-2:]}",
          flush=True)
    return done.returncode == -6 or done.returncode == 134


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--budget", type=float, default=360.0)
    args = parser.parse_args()
    deadline = time.perf_counter() + args.budget
    ids = collect(args.path)
    print(f"{len(ids)} tests in {args.path}", flush=True)
    while len(ids) > 1 and time.perf_counter() < deadline:
        half = len(ids) // 2
        first, second = ids[:half], ids[half:]
        if aborts(first):
            ids = first
        elif time.perf_counter() < deadline and aborts(second):
            ids = second
        else:
            print("neither half aborts alone: the abort needs tests from both", flush=True)
            ids = pair(first, second, deadline) or ids
            break
    print("smallest aborting set found:", *ids, sep="\n  ", flush=True)


def pair(first: list[str], second: list[str], deadline: float) -> list[str] | None:
    """Where the abort needs both halves: the first test of ``second`` that aborts beside all
    of ``first``, then the first test of ``first`` that aborts beside that one (two tests, if
    two are enough; None if the budget runs out or no single test will do)."""
    for other in second:
        if time.perf_counter() > deadline:
            return None
        if aborts([*first, other]):
            for one in first:
                if time.perf_counter() > deadline:
                    return None
                if aborts([one, other]):
                    return [one, other]
            return [*first, other]
    return None


if __name__ == "__main__":
    main()
