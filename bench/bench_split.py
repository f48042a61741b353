"""Shards by measured cost: pytest-split's estimates against the shards' real wall times.

Runs in a plain Python process; every measurement is a pytest session in a subprocess, in one
temporary folder. The script writes a mixed suite of distributed tests (world sizes 1 to 4, a
few slow tests), runs it once whole with ``--store-durations`` (the pool starts charged to the
setup of each pool's first test: pool/ownreports.charge_pool_start), then runs each of N shards
(``--splits N --group k``, pytest-split's default algorithm, which keeps collection order and so
pools together) and prints, per shard, pytest-split's estimate, the shard's wall time, the
session start (a ``--collect-only`` run of the shard: interpreter, imports, collection) and the
ratio of the wall time to estimate plus session start. It checks that the shards' tests, put
together, are the whole suite, each once.

Usage (from the repository root, with the project and pytest-split installed):

    python bench/bench_split.py                     # 200 tests, 4 shards
    python bench/bench_split.py --tests 120 --splits 3
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "no:cacheprovider", "-q"]
ESTIMATE = re.compile(r"estimated duration: ([\d.]+)s")


def suite(tests: int, slow: float) -> str:
    """``tests`` tests of world sizes 1 to 4; one in ten sleeps ``slow`` seconds (so that each
    shard runs for a minute or more), the rest do one collective (a pool start is then a visible
    part of a shard's time)."""
    per_size = tests // 4
    body = ["import time, pytest, torch, torch.distributed as dist", ""]
    for ws in (1, 2, 3, 4):
        body += [
            f"@pytest.mark.parametrize('i', range({per_size}))",
            f"@pytest.mark.world_size({ws})",
            f"def test_ws{ws}(rank, pg, i):",
            "    if i % 10 == 7:",
            f"        time.sleep({slow})",
            "    t = torch.ones(4)",
            "    dist.all_reduce(t)",
            f"    assert t[0].item() == {ws}",
            "",
        ]
    return "\n".join(body)


def run(args: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([*PYTEST, *args], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"pytest {' '.join(args)} ended with {done.returncode}:\n{done.stdout[-3000:]}")
    return wall, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--slow", type=float, default=12.0, help="seconds of each slow test")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-split-") as folder:
        cwd = Path(folder)
        (cwd / "test_mixed.py").write_text(suite(opts.tests, opts.slow))
        durations = ["--durations-path=durations.json"]
        whole, _ = run(["--store-durations", *durations], cwd)
        stored = json.loads((cwd / "durations.json").read_text())
        total = sum(stored.values())
        print(f"whole suite: {len(stored)} tests, {whole:.1f} s wall, {total:.1f} s stored")
        seen: list[str] = []
        print("shard  estimate   start    wall  wall/(estimate+start)")
        for group in range(1, opts.splits + 1):
            shard = [f"--splits={opts.splits}", f"--group={group}", *durations]
            start, listing = run([*shard, "--collect-only"], cwd)
            seen += [line for line in listing.splitlines() if "::" in line]
            wall, out = run(shard, cwd)
            found = ESTIMATE.search(out)
            estimate = float(found.group(1)) if found else float("nan")
            ratio = wall / (estimate + start)
            print(f"{group:>5} {estimate:8.1f}s {start:6.1f}s {wall:6.1f}s {ratio:21.2f}")
        whole_ids = sorted(stored)
        print(
            f"shards together: {len(seen)} tests, {len(set(seen))} distinct, "
            f"{'the whole suite' if sorted(seen) == whole_ids else 'NOT the whole suite'}"
        )
        if sorted(seen) != whole_ids:
            sys.exit(1)


if __name__ == "__main__":
    main()
