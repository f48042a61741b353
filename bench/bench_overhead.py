"""Per-test cost of pytest-distrank against PyTorch's own harnesses, measured in one run.

Runs in a plain Python process; every workload is a pytest session in a subprocess. For each
workload the script writes K generated tests into a temporary folder, runs them with a small and a
large K, and derives the steady-state cost of one test as the difference of the two wall times
divided by the difference of the test counts (so interpreter start, imports and pool start cancel
out). It also samples the proportional set size (PSS) of the whole process tree while the large run
goes, and reports the peak.

Usage (from the repository root, with the project installed):

    python bench/bench_overhead.py               # K=200, 3 repetitions, medians
    python bench/bench_overhead.py --k 50 --repeat 1   # quick look

Workloads:
  distrank ws2/ws4      one all_reduce of a 1-element tensor and one assert, world size 2 and 4
  distrank ws4 empty    a 4-rank test whose body does nothing (the plugin's own overhead)
  distrank ws4 FR off   ws4 with PyTorch's flight recorder off (TORCH_FR_BUFFER_SIZE=0)
  pytest plain          the same assert without ranks: the floor of pytest itself
  MultiProcessTestCase  PyTorch's harness (spawns every rank anew for every test), smaller K
  MultiProcContinuous   PyTorch's harness that keeps its ranks for a class
  MultiThreadedTestCase PyTorch's harness with threads as ranks (one process, a threaded group)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

DISTRANK = """
import pytest, torch, torch.distributed as dist

{tests}
"""
DISTRANK_TEST = """
@pytest.mark.world_size({ws})
def test_{i}(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == {ws}
"""
EMPTY_TEST = """
@pytest.mark.world_size({ws})
def test_{i}(rank):
    pass
"""
PLAIN_TEST = """
def test_{i}():
    t = torch.ones(1)
    assert t.item() == 1
"""
MPTC = """
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class TestReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return {ws}

    def setUp(self):
        super().setUp()
        self._spawn_processes()

{tests}
"""
MPTC_TEST = """
    def test_{i}(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == {ws}
        dist.destroy_process_group()
"""
CONTINUOUS = """
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest
from torch.testing._internal.common_utils import run_tests


class TestReduce(MultiProcContinuousTest):
    world_size = {ws}

    @classmethod
    def backend_str(cls):
        return "gloo"

{tests}


if __name__ == "__main__":
    run_tests()
"""
CONTINUOUS_TEST = """
    def test_{i}(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == {ws}
"""

THREADED = """
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiThreadedTestCase


class TestReduce(MultiThreadedTestCase):
    @property
    def world_size(self):
        return {ws}

    def setUp(self):
        super().setUp()
        self._spawn_threads()

{tests}
"""
THREADED_TEST = """
    def test_{i}(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == {ws}
"""


def pss_of_tree(root: int) -> int:
    """Summed PSS in bytes of ``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def timed_run(
    cmd: list[str], cwd: Path, sample_memory: bool = False, expect_failures: bool = False
) -> tuple[float, int]:
    """Wall seconds of one command; with ``sample_memory``, also the peak PSS of its tree.

    Sampling walks /proc and costs CPU, so timed runs do not sample.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while sample_memory and not done.is_set():
            peak = max(peak, pss_of_tree(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode not in ((0, 1) if expect_failures else (0,)):
        sys.exit(f"benchmark run failed ({proc.returncode}): {' '.join(cmd)}\n{output.decode()}")
    return wall, peak


Workload = tuple[str, Callable[[int], str], list[str], str]


def workloads() -> list[Workload]:
    py = sys.executable

    def harness(template: str, test: str, ws: int) -> Callable[[int], str]:
        """A test file of ``k`` tests: ``template`` around ``k`` copies of ``test``."""
        return lambda k: template.format(
            ws=ws, tests="".join(test.format(i=i, ws=ws) for i in range(k))
        )

    pytest_cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    plain = [*pytest_cmd, "-p", "no:distrank"]
    plugin = [*pytest_cmd, "-p", "distrank"]
    return [
        ("distrank ws2", harness(DISTRANK, DISTRANK_TEST, 2), plugin, "big"),
        ("distrank ws4", harness(DISTRANK, DISTRANK_TEST, 4), plugin, "big"),
        ("distrank ws4 empty", harness(DISTRANK, EMPTY_TEST, 4), plugin, "big"),
        # PyTorch's flight recorder off (it records every collective; the hang reports read it).
        (
            "distrank ws4 FR off",
            harness(DISTRANK, DISTRANK_TEST, 4),
            ["env", "TORCH_FR_BUFFER_SIZE=0", *pytest_cmd, "-p", "distrank"],
            "big",
        ),
        ("pytest plain", harness(DISTRANK, PLAIN_TEST, 1), plain, "big"),
        ("MultiProcContinuous ws2", harness(CONTINUOUS, CONTINUOUS_TEST, 2), plain, "big"),
        ("MultiProcContinuous ws4", harness(CONTINUOUS, CONTINUOUS_TEST, 4), plain, "big"),
        ("MultiThreadedTestCase ws4", harness(THREADED, THREADED_TEST, 4), plain, "big"),
        ("MultiProcessTestCase ws2", harness(MPTC, MPTC_TEST, 2), plain, "small"),
        ("MultiProcessTestCase ws4", harness(MPTC, MPTC_TEST, 4), plain, "small"),
    ]


def measure(
    name: str, make: Callable[[int], str], cmd: list[str], k_small: int, k_big: int, repeat: int
) -> dict[str, float]:
    per_test, first, totals, peaks, dispatch = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="distrank-bench-") as tmp:
        folder = Path(tmp)
        for _ in range(repeat):
            (folder / "test_one.py").write_text(make(1))
            one, _ = timed_run([*cmd, "test_one.py"], folder)
            (folder / "test_one.py").unlink()
            (folder / "test_small.py").write_text(make(k_small))
            small, _ = timed_run([*cmd, "test_small.py"], folder)
            (folder / "test_small.py").unlink()
            (folder / "test_big.py").write_text(make(k_big))
            os.environ["DISTRANK_STATS_FILE"] = str(folder / "stats.json")
            big, _ = timed_run([*cmd, "test_big.py"], folder)
            os.environ.pop("DISTRANK_STATS_FILE")
            if (folder / "stats.json").exists():
                seconds = json.loads((folder / "stats.json").read_text())["test_seconds"]
                dispatch.append(statistics.median(seconds[1:] or seconds))
            _, peak = timed_run([*cmd, "test_big.py"], folder, sample_memory=True)
            (folder / "test_big.py").unlink()
            per_test.append((big - small) / (k_big - k_small))
            first.append(one)
            totals.append(big)
            peaks.append(peak)
    return {
        "per_test": statistics.median(per_test),
        "first": statistics.median(first),
        "total": statistics.median(totals),
        "peak": statistics.median(peaks),
        "k": k_big,
        # The plugin's own number: controller wall time per test, dispatch to merged report.
        "dispatch": statistics.median(dispatch) if dispatch else float("nan"),
    }


#: Targets of the speed issue (2-core machine, gloo): steady-state per-test milliseconds.
PER_TEST_TARGET_MS = {"distrank ws2": 3.0, "distrank ws4": 4.0, "distrank ws4 empty": 2.5}
#: A whole one-test session at world size 4, fork server start included, in seconds.
FIRST_TEST_TARGET_S = 2.5


def verdict(value: float, target: float) -> str:
    if value <= target:
        return f"met ({value:.2f} <= {target:g})"
    return f"MISSED by {value - target:.2f} ({value / target:.1f}x the target {target:g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=200, help="tests per large run (default 200)")
    parser.add_argument("--k-ref", type=int, default=4, help="tests per MultiProcessTestCase run")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; medians reported")
    parser.add_argument("--only", default="", help="comma-separated workload name filter")
    args = parser.parse_args()
    os.environ.pop("PYTEST_ADDOPTS", None)
    results = {}
    for name, make, cmd, size in workloads():
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        k_small, k_big = (max(2, args.k // 10), args.k) if size == "big" else (1, args.k_ref)
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = measure(name, make, cmd, k_small, k_big, args.repeat)
    reference = {ws: results.get(f"MultiProcessTestCase ws{ws}") for ws in (2, 4)}
    header = (
        f"{'workload':<26}{'K':>5}{'total s':>9}{'per test ms':>13}{'1-test session s':>18}"
        f"{'peak PSS MiB':>14}{'MPTC / this':>13}{'in-plugin ms':>14}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        ws = 4 if "ws4" in name else 2
        ref = reference[ws]
        ratio = f"{ref['per_test'] / r['per_test']:.0f}x" if ref and r["per_test"] > 0 else "-"
        print(
            f"{name:<26}{r['k']:>5.0f}{r['total']:>9.2f}{r['per_test'] * 1000:>13.2f}"
            f"{r['first']:>18.2f}{r['peak'] / 2**20:>14.0f}{ratio:>13}"
            f"{r['dispatch'] * 1000:>14.2f}"
        )
    print("\ntargets")
    for name, target in PER_TEST_TARGET_MS.items():
        if name in results:
            per_test = results[name]["per_test"] * 1000
            print(f"  {name + ' per test ms':<34}{verdict(per_test, target)}")
    if "distrank ws4" in results:
        first = results["distrank ws4"]["first"]
        print(f"  {'1-test session ws4 s':<34}{verdict(first, FIRST_TEST_TARGET_S)}")
    ref = reference[4]
    if ref and "distrank ws4" in results:
        ratio_4 = ref["per_test"] / results["distrank ws4"]["per_test"]
        print(
            f"  {'MPTC / distrank ws4':<34}{'met' if ratio_4 >= 1000 else 'MISSED'} "
            f"({ratio_4:.0f}x, target >= 1000x)"
        )


if __name__ == "__main__":
    main()
