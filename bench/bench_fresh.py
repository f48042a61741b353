"""What a test on fresh ranks costs: forked from rank templates against started from nothing.

Runs in a plain Python process; every run is a whole pytest session in a subprocess, over one
generated file of K world-size-4 tests (one ``all_reduce`` and one assert each), with
``--distrank-isolate`` (every test on fresh ranks). Each mode runs with a small and a large K,
and a test's cost is the difference of the two wall times over the difference of K (interpreter
start, imports and the fork server cancel out). CPU is the whole tree's (``RUSAGE_CHILDREN``
around each run: every process of the run is reaped by the end). The modes run in turn, A B A B,
so that drifts of the machine's load hit both alike; medians over the rounds.

    python bench/bench_fresh.py                      # K = 2 and 12, 5 rounds
    python bench/bench_fresh.py --small 2 --large 22 --rounds 3
    python bench/bench_fresh.py --other ../main      # and the fork mode of another checkout

Modes: ``--distrank-fresh-ranks=fork`` (the default: templates that ran no user code,
pool/pools/templates.py), ``start`` (each fresh rank starts its own pytest session), and with
``--other PATH`` the ``fork`` mode of the checkout at PATH (first on ``PYTHONPATH``), in turn.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("fork", "start")


def write_tests(folder: Path, count: int, world_size: int = 4) -> Path:
    lines = ["import pytest, torch, torch.distributed as dist", ""]
    for index in range(count):
        lines += [
            f"@pytest.mark.world_size({world_size})",
            f"def test_{index}(rank):",
            "    t = torch.ones(1)",
            "    dist.all_reduce(t)",
            f"    assert t.item() == {world_size}",
            "",
        ]
    path = folder / f"test_fresh_{count}.py"
    path.write_text("\n".join(lines))
    return path


def run(path: Path, mode: str, other: str) -> tuple[float, float]:
    """Wall and CPU seconds (the whole process tree) of one session."""
    env = dict(os.environ)
    if mode == "other":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (other, env.get("PYTHONPATH")) if p)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "no:cacheprovider", "-q",
         "--distrank-isolate", f"--distrank-fresh-ranks={'fork' if mode == 'other' else mode}",
         str(path)],
        cwd=path.parent, capture_output=True, text=True, env=env,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{mode} {path.name} failed:\n{done.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2)
    parser.add_argument("--large", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--other", default="", help="a checkout whose fork mode runs too")
    args = parser.parse_args()
    modes = (*MODES, "other") if args.other else MODES
    per_test: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        small, large = write_tests(folder, args.small), write_tests(folder, args.large)
        for round_ in range(args.rounds):
            order = modes if round_ % 2 == 0 else modes[::-1]
            for mode in order:
                wall_s, cpu_s = run(small, mode, args.other)
                wall_l, cpu_l = run(large, mode, args.other)
                n = args.large - args.small
                per_test[mode].append(((wall_l - wall_s) / n, (cpu_l - cpu_s) / n))
                print(
                    f"round {round_ + 1} {mode:5}: {args.small} tests {wall_s:.2f} s, "
                    f"{args.large} tests {wall_l:.2f} s wall ({cpu_l:.2f} s CPU): "
                    f"{per_test[mode][-1][0] * 1000:.0f} ms wall, "
                    f"{per_test[mode][-1][1] * 1000:.0f} ms CPU per test",
                    flush=True,
                )
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"\nper fresh-rank ws4 test, medians of {args.rounds} rounds (A B A B):")
    medians = {
        mode: (statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows))
        for mode, rows in per_test.items()
    }
    for mode, (wall, cpu) in medians.items():
        print(f"  {mode:5}  {wall * 1000:7.0f} ms wall  {cpu * 1000:7.0f} ms CPU")
    ratios = [f[0] / s[0] for f, s in zip(per_test["fork"], per_test["start"], strict=True)]
    print(f"  fork/start wall: median of per-round ratios {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
