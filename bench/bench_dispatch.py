"""Does running ahead pay? A paired whole-process comparison of --distrank-dispatch modes.

Runs in a plain Python process; each run is a pytest session in a subprocess over one generated
file of N world-size-4 tests (one all_reduce and one assert each). The two modes run in turn, P
pairs, the first of each pair alternating, so slow drifts of the machine's load hit both alike.
It prints each pair's wall times, the median paired ratio ahead/lockstep and a one-sided sign
test of "ahead is faster".

The decision rule was fixed before the first run (issue #24): keep ``ahead`` only if the median
paired wall ratio is <= 0.97 and the sign test gives p < 0.05.

Running ahead was removed after this comparison (docs/performance.md), so the option exists only
in the version measured. To repeat it, check that version out beside this one and point the runs
at it (from the repository root, with the project installed):

    git worktree add ../distrank-74fcbe4 74fcbe4
    python bench/bench_dispatch.py --pythonpath ../distrank-74fcbe4       # N=2000, P=10
    python bench/bench_dispatch.py --pythonpath ../distrank-74fcbe4 --n 200 --pairs 2
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = """
@pytest.mark.world_size(4)
def test_{i}(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 4
"""


def write_suite(folder: Path, n: int) -> None:
    body = "".join(TEST.format(i=i) for i in range(n))
    (folder / "test_many.py").write_text("import pytest, torch, torch.distributed as dist\n" + body)
    (folder / "pytest.ini").write_text("[pytest]\n")


def run_once(folder: Path, mode: str, pythonpath: str) -> float:
    """Wall seconds of one whole pytest run."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "distrank",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--distrank-dispatch={mode}",
            "test_many.py",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return wall


def sign_test_p(wins: int, n: int) -> float:
    """One-sided p of at least ``wins`` successes in ``n`` fair coin flips."""
    return float(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="tests per run")
    parser.add_argument("--pairs", type=int, default=10, help="ahead/lockstep pairs")
    parser.add_argument(
        "--pythonpath", default="", help="a checkout of a version that has --distrank-dispatch"
    )
    args = parser.parse_args()
    pythonpath = str(Path(args.pythonpath).resolve()) if args.pythonpath else ""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_suite(folder, args.n)
        print(f"{args.n} ws4 tests per run, {args.pairs} pairs, load {os.getloadavg()[0]:.2f}")
        print(f"{'pair':>4}  {'ahead s':>8}  {'lockstep s':>10}  {'ratio':>6}")
        ratios: list[float] = []
        for pair in range(args.pairs):
            order = ("ahead", "lockstep") if pair % 2 == 0 else ("lockstep", "ahead")
            result = {mode: run_once(folder, mode, pythonpath) for mode in order}
            wa, wl = result["ahead"], result["lockstep"]
            ratios.append(wa / wl)
            print(f"{pair:>4}  {wa:>8.2f}  {wl:>10.2f}  {wa / wl:>6.3f}", flush=True)
        wins = sum(r < 1 for r in ratios)
        median = statistics.median(ratios)
        p = sign_test_p(wins, len(ratios))
        print(
            f"median paired wall ratio ahead/lockstep: {median:.3f}; ahead faster in {wins} of "
            f"{len(ratios)} pairs, sign test p = {p:.4f}; load now {os.getloadavg()[0]:.2f}"
        )
        keep = median <= 0.97 and p < 0.05
        print(
            "decision: keep ahead as default"
            if keep
            else "decision: no measurable gain; running ahead goes"
        )


if __name__ == "__main__":
    main()
