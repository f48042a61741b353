"""Existing test files: their own harness against pytest-distrank's warm pools, in one run.

Runs in a plain Python process; every measurement is a separate pytest session in a subprocess,
started in a fresh temporary folder. For each test file given on the command line the script runs

  own harness   python -m pytest -p no:distrank FILE   (each test spawns its processes)
  distrank      python -m pytest -p distrank FILE      (the same file, unmodified, on warm pools)

alternately, ``--repeat`` times each, and prints for each file the median wall times, the outcome
counts of both (which must agree: the script exits non-zero when they differ), and the ratio;
then the totals (sums of the medians) and their ratio.

Usage (from the repository root, with the project installed):

    python bench/bench_suites.py path/to/test_a.py path/to/test_b.py
    python bench/bench_suites.py --repeat 3 path/to/test_a.py

The files stay where they are; nothing is copied into the project.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
RUNS = {"own harness": ["-p", "no:distrank"], "distrank": ["-p", "distrank"]}
OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)")


def run(args: list[str], test_file: Path) -> tuple[float, dict[str, int], str]:
    """Wall seconds, outcome counts and the summary line of one pytest session."""
    with tempfile.TemporaryDirectory(prefix="bench-suites-") as cwd:
        start = time.perf_counter()
        done = subprocess.run(
            [*PYTEST, *args, str(test_file)], cwd=cwd, capture_output=True, text=True
        )
        wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    counts = {
        kind.rstrip("s") if kind.startswith("error") else kind: int(n)
        for n, kind in OUTCOME.findall(summary)
    }
    if done.returncode not in (0, 1):
        sys.exit(
            f"pytest {' '.join(args)} {test_file} ended with {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return wall, counts, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    opts = parser.parse_args()
    totals = {name: 0.0 for name in RUNS}
    mismatch = False
    rows = []
    for test_file in opts.files:
        walls: dict[str, list[float]] = {name: [] for name in RUNS}
        outcomes: dict[str, dict[str, int]] = {}
        for _ in range(opts.repeat):
            for name, args in RUNS.items():
                wall, counts, summary = run(args, test_file.resolve())
                walls[name].append(wall)
                outcomes[name] = counts
                print(f"  {test_file.name} [{name}] {summary} ({wall:.1f} s)", flush=True)
        medians = {name: statistics.median(w) for name, w in walls.items()}
        for name, value in medians.items():
            totals[name] += value
        same = outcomes["own harness"] == outcomes["distrank"]
        mismatch = mismatch or not same
        rows.append((test_file.name, medians, outcomes["distrank"], same))
    print()
    print(f"{'file':44} {'own harness':>12} {'distrank':>9} {'ratio':>7}  outcomes")
    for name, medians, counts, same in rows:
        ratio = medians["own harness"] / medians["distrank"]
        text = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        flag = "" if same else "  (DIFFERENT from the own harness's)"
        print(
            f"{name:44} {medians['own harness']:10.1f} s {medians['distrank']:7.1f} s "
            f"{ratio:6.1f}x  {text}{flag}"
        )
    ratio = totals["own harness"] / totals["distrank"]
    print(f"{'total':44} {totals['own harness']:10.1f} s {totals['distrank']:7.1f} s {ratio:6.1f}x")
    print(f"(medians of {opts.repeat} run(s) each; python {sys.version.split()[0]})")
    if mismatch:
        sys.exit("the outcomes differ between the two harnesses")


if __name__ == "__main__":
    main()
