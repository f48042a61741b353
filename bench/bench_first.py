"""The first test: a whole 1-test session against a plain pytest session that imports torch.

Runs in a plain Python process; every run is a whole pytest session in a subprocess, in a fresh
temporary folder:

  distrank   one world-size-4 test (one ``all_reduce``) with ``-p distrank``: pytest's start,
             collection, the fork server, the pool's start, the test, the pool's stop
  late       the same with ``--distrank-start-method=forkserver-late``: a fork server that
             imports torch itself, beside collection (what ``distrank`` did before its fork
             server was forked from pytest at its start, pool/pools/earlyfork.py)
  plain      one ordinary test whose module imports torch, with ``-p no:distrank``: the floor

The three run in turn (A B C, then C B A, ...), ``--pairs`` times, so that drifts of the
machine's load hit all alike; it prints each run, the medians of wall and whole-tree CPU
(``RUSAGE_CHILDREN``: every process of a run is reaped by its end), the ratio of the medians and
the median of the per-round ratios (issue #40's target for the first test: at most 1.3x).

    python bench/bench_first.py              # 5 pairs
    python bench/bench_first.py --pairs 9
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILES = {
    "distrank": (
        "import pytest, torch, torch.distributed as dist\n\n"
        "@pytest.mark.world_size(4)\n"
        "def test_one(rank):\n"
        "    t = torch.ones(1)\n"
        "    dist.all_reduce(t)\n"
        "    assert t.item() == 4\n"
    ),
    "plain": "import torch\n\ndef test_plain():\n    assert torch.ones(1).item() == 1\n",
}
#: Each run: its test file and its pytest arguments.
RUNS = {
    "distrank": ("distrank", ["-p", "distrank"]),
    "late": ("distrank", ["-p", "distrank", "--distrank-start-method=forkserver-late"]),
    "plain": ("plain", ["-p", "no:distrank"]),
}


def run(folder: Path, name: str) -> tuple[float, float]:
    """Wall and CPU seconds of one whole session."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *RUNS[name][1],
         f"test_{RUNS[name][0]}.py"],
        cwd=folder, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stdout[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in RUNS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, source in FILES.items():
            (folder / f"test_{name}.py").write_text(source)
        for pair in range(args.pairs):
            order = list(RUNS) if pair % 2 == 0 else list(RUNS)[::-1]
            for name in order:
                wall, cpu = run(folder, name)
                rows[name].append((wall, cpu))
                print(f"pair {pair + 1} {name:8}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    medians = {
        name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
        for name, r in rows.items()
    }
    print(f"\nmedians of {args.pairs} rounds (A B C C B A ...):")
    for name, (wall, cpu) in medians.items():
        print(f"  {name:8}  {wall:5.2f} s wall  {cpu:5.2f} s CPU")
    for name in ("distrank", "late"):
        per_pair = [a[0] / b[0] for a, b in zip(rows[name], rows["plain"], strict=True)]
        ratio = medians[name][0] / medians["plain"][0]
        cpu = medians[name][1] / medians["plain"][1]
        print(
            f"  {name}/plain: wall ratio of medians {ratio:.2f}x, median of per-round ratios "
            f"{statistics.median(per_pair):.2f}x (target <= 1.3x); CPU {cpu:.2f}x"
        )


if __name__ == "__main__":
    main()
