"""What finding a polluter costs: replays of an order-dependent failure in a 50-test pool.

Runs in a plain Python process; every measurement is a pytest session in a subprocess, in a fresh
temporary folder, over one generated file of N world-size-2 tests in one pool: test P (the
polluter) sets a module global, the last test fails only after it, the others do an all_reduce.
For each polluter position the script runs the session with ``--distrank-replay=on`` and
``--distrank-replay=off``, alternately, ``--repeat`` times each, and prints the replays the
search took (against its bound, ceil(log2(N - 1)) + 3), their seconds as the summary's cost
line reports them, the median session wall times and their ratio. The session's outcome must be
the same either way (the script exits non-zero otherwise), and the polluter must be found.

Usage (from the repository root, with the project installed):

    python bench/bench_replay.py                  # N=50, polluters at 0, 24, 48; 3 repeats
    python bench/bench_replay.py --n 200 --repeat 1
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-p", "distrank", "-q", "-p", "no:cacheprovider"]
TEST = """
@pytest.mark.world_size(2)
def test_{i:03d}(rank, pg):
    {body}
"""
COST = re.compile(r"^(\d+) replays? to find a polluter, ([\d.]+) s$", re.M)
POLLUTER = re.compile(r"polluter: \S+::(test_\d+) ")


def write_suite(folder: Path, n: int, polluter: int) -> None:
    bodies = ["t = torch.ones(1); dist.all_reduce(t, group=pg)"] * (n - 1)
    bodies[polluter] = "STATE.add('polluted')"
    bodies.append("assert not STATE, 'polluted'")
    body = "".join(TEST.format(i=i, body=b) for i, b in enumerate(bodies))
    header = "import pytest, torch, torch.distributed as dist\n\nSTATE = set()\n"
    (folder / "test_pool.py").write_text(header + body)
    (folder / "pytest.ini").write_text("[pytest]\n")


def run_once(folder: Path, replay: str) -> tuple[float, str]:
    """Wall seconds and output of one whole pytest run."""
    start = time.perf_counter()
    done = subprocess.run(
        [*PYTEST, f"--distrank-replay={replay}", "test_pool.py"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 1:
        sys.exit(f"replay={replay}: exit code {done.returncode}, not 1:\n{done.stdout[-3000:]}")
    return wall, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="tests in the pool")
    parser.add_argument("--repeat", type=int, default=3, help="sessions per mode and position")
    parser.add_argument(
        "--polluters", default="", help="positions, e.g. 0,24 (default: 0, middle, last)"
    )
    args = parser.parse_args()
    n = args.n
    positions = [int(p) for p in args.polluters.split(",") if p] or [0, (n - 2) // 2, n - 2]
    bound = math.ceil(math.log2(n - 1)) + 3
    print(f"{n} tests of world size 2 in one pool; the last fails after the polluter")
    print(f"{'polluter':>8} {'replays':>7} {'bound':>5} {'replay s':>8} {'on s':>6} {'off s':>6}")
    for position in positions:
        walls: dict[str, list[float]] = {"on": [], "off": []}
        costs: list[tuple[int, float]] = []
        with tempfile.TemporaryDirectory(prefix="bench-replay-") as cwd:
            folder = Path(cwd)
            write_suite(folder, n, position)
            for i in range(args.repeat):
                for replay in ("on", "off") if i % 2 == 0 else ("off", "on"):
                    wall, out = run_once(folder, replay)
                    walls[replay].append(wall)
                    if replay == "off":
                        continue
                    cost, found = COST.search(out), POLLUTER.search(out)
                    if cost is None or found is None or found[1] != f"test_{position:03d}":
                        sys.exit(f"polluter test_{position:03d} not found:\n{out[-3000:]}")
                    costs.append((int(cost[1]), float(cost[2])))
        runs = max(c[0] for c in costs)
        seconds = statistics.median(c[1] for c in costs)
        on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
        print(
            f"{position:>8} {runs:>7} {bound:>5} {seconds:>8.2f} {on:>6.2f} {off:>6.2f}"
            f"   on/off {on / off:.2f}"
        )


if __name__ == "__main__":
    main()
