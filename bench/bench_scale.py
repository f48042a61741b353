"""Pool start time and memory by world size, pool replacement after a crash, and rank start time
beside many unrelated test files.

Runs in a plain Python process; every measurement is a pytest session in a subprocess, and the
plugin's own numbers come from the JSON it writes when ``DISTRANK_STATS_FILE`` is set.

Usage (from the repository root, with the project installed):

    python bench/bench_scale.py                 # world sizes 2 4 8 16 32, 3 repetitions
    python bench/bench_scale.py --sizes 2 4 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_overhead import timed_run

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "distrank"]

SLEEPER = """
import time, pytest

@pytest.mark.world_size({ws})
def test_hold(rank):
    time.sleep(2.0)  # every rank alive while the memory sampler looks
"""
CRASH = """
import os, pytest

@pytest.mark.world_size(4)
def test_crash(rank):
    if rank == 1:
        os._exit(3)

@pytest.mark.world_size(4)
def test_after(rank):
    pass
"""
ONE = """
import pytest

@pytest.mark.world_size(4)
def test_one(rank):
    pass
"""
UNRELATED = """
def test_plain_{i}():
    assert {i} >= 0
"""


def session(
    folder: Path, args: list[str], memory: bool = False, expect_failures: bool = False
) -> tuple[float, int, dict]:
    """Run one pytest session; its wall time, peak PSS and the plugin's stats."""
    stats_path = folder / "stats.json"
    os.environ["DISTRANK_STATS_FILE"] = str(stats_path)
    wall, peak = timed_run([*PYTEST, *args], folder, memory, expect_failures)
    stats = json.loads(stats_path.read_text())
    stats_path.unlink()
    return wall, peak, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--unrelated", type=int, default=200)
    args = parser.parse_args()
    os.environ.pop("PYTEST_ADDOPTS", None)

    print(f"{'pool start by world size':<34}{'start s':>9}{'peak PSS MiB':>14}")
    for ws in args.sizes:
        starts, peaks = [], []
        with tempfile.TemporaryDirectory(prefix="distrank-scale-") as tmp:
            folder = Path(tmp)
            (folder / "test_hold.py").write_text(SLEEPER.format(ws=ws))
            for _ in range(args.repeat):
                _, peak, stats = session(folder, ["test_hold.py"], memory=True)
                starts.append(stats["pools"][0]["start_seconds"])
                peaks.append(peak)
        label = f"  world size {ws}"
        start, peak = statistics.median(starts), statistics.median(peaks) / 2**20
        note = ""
        if ws == 32:
            ok = start < 5.0 and peak < 4096
            note = f"   target < 5 s and < 4096 MiB: {'met' if ok else 'MISSED'}"
        print(f"{label:<34}{start:>9.2f}{peak:>14.0f}{note}")

    replaced = []
    with tempfile.TemporaryDirectory(prefix="distrank-scale-") as tmp:
        folder = Path(tmp)
        (folder / "test_crash.py").write_text(CRASH)
        for _ in range(args.repeat):
            _, _, stats = session(
                folder, ["test_crash.py", "--distrank-failure-grace=1"], expect_failures=True
            )
            replaced += [p["start_seconds"] for p in stats["pools"] if p["after_fault"]]
    replace = statistics.median(replaced)
    note = "met" if replace < 0.5 else f"MISSED by {replace - 0.5:.2f} s"
    print(f"{'replacing a pool after a crash':<34}{replace:>9.2f}   target < 0.5 s: {note}")

    ready: dict[int, float] = {}
    for count in (0, args.unrelated):
        starts = []
        with tempfile.TemporaryDirectory(prefix="distrank-scale-") as tmp:
            folder = Path(tmp)
            (folder / "test_dist.py").write_text(ONE)
            for i in range(count):
                (folder / f"test_unrelated_{i}.py").write_text(UNRELATED.format(i=i))
            for _ in range(args.repeat):
                _, _, stats = session(folder, [])
                starts.append(stats["pools"][0]["ready_seconds"])
        ready[count] = statistics.median(starts)
        label = f"rank start, {count} unrelated files"
        print(f"{label:<34}{ready[count]:>9.2f}")
    ratio = ready[args.unrelated] / ready[0]
    verdict = "met" if ratio <= 1.2 else "MISSED"
    print(f"{'  with / without':<34}{ratio:>9.2f}   target <= 1.20: {verdict}")


if __name__ == "__main__":
    main()
