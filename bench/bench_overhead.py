"""Per-test cost of pytest-distrank against PyTorch's own harnesses, measured in one run.

Runs in a plain Python process; every workload is a pytest session in a subprocess. For each
workload the script writes K generated tests into a temporary folder, runs them with a small and a
large K, and derives the steady-state cost of one test as the difference of the two wall times
divided by the difference of the test counts (so interpreter start, imports and pool start cancel
out). It also samples the proportional set size (PSS) of the whole process tree while the large run
goes, and reports the peak.

Usage (from the repository root, with the project installed):

    python bench/bench_overhead.py               # K=200, 5 repetitions, medians
    python bench/bench_overhead.py --k 50 --repeat 1   # quick look
    python bench/bench_overhead.py --paired "distrank ws4,MultiProcContinuous ws4" --pairs 5

``--paired A,B`` (issue #40 item 2) runs the two workloads as whole processes in turn (A B A B,
the first of each pair alternating), each with K/10 and K tests, and prints per pair and as
medians the cost per test in wall time and in CPU time of every process of the run (the
session's whole tree, reaped: ``RUSAGE_CHILDREN``, this script adopting orphans), and A/B.

Workloads:
  distrank ws2/ws4      one all_reduce of a 1-element tensor and one assert, world size 2 and 4
  distrank ws4 empty    a 4-rank test whose body does nothing (the plugin's own overhead)
  ... no checks/no seed the same with --distrank-leftovers=off / --distrank-seed=off: the rank CPU
                        of the leftover checks and of seeding each test is the difference
  ... deadlocks wait    ws4 with --distrank-deadlocks=wait: the cost of the deadlock watch
  torchrun ws2          launcher mode: the same tests under torchrun --standalone, 2 ranks, and
                        with --distrank-deadlocks=wait (the cost of launcher mode's watch)
  distrank ws4 FR off   ws4 with PyTorch's flight recorder off (TORCH_FR_BUFFER_SIZE=0)
  pytest plain          the same assert without ranks: the floor of pytest itself
  MultiProcessTestCase  PyTorch's harness (spawns every rank anew for every test), smaller K
  MultiProcContinuous   PyTorch's harness that keeps its ranks for a class
  MultiThreadedTestCase PyTorch's harness with threads as ranks (one process, a threaded group)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import resource
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
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    launched = [*torchrun, *pytest_cmd[1:], "-p", "distrank"]
    return [
        ("distrank ws2", harness(DISTRANK, DISTRANK_TEST, 2), plugin, "big"),
        ("distrank ws4", harness(DISTRANK, DISTRANK_TEST, 4), plugin, "big"),
        ("distrank ws4 empty", harness(DISTRANK, EMPTY_TEST, 4), plugin, "big"),
        # The same without the checks of what each test leaves behind (rank/leftovers.py) and
        # without per-test seeding (rank/seeding.py): their cost is the difference in rank CPU.
        (
            "distrank ws4 empty, no checks",
            harness(DISTRANK, EMPTY_TEST, 4),
            [*plugin, "--distrank-leftovers=off"],
            "big",
        ),
        (
            "distrank ws4 empty, no seed",
            harness(DISTRANK, EMPTY_TEST, 4),
            [*plugin, "--distrank-seed=off"],
            "big",
        ),
        # The deadlock watch off (pool/deadlock.py: it reads /proc between the ranks' messages).
        (
            "distrank ws4, deadlocks wait",
            harness(DISTRANK, DISTRANK_TEST, 4),
            [*plugin, "--distrank-deadlocks=wait"],
            "big",
        ),
        # The design's floor: the same test with every optional per-test check off (what each
        # test leaves behind, seeding, the deadlock watch): pytest's protocol on every rank.
        (
            "distrank ws4, checks off",
            harness(DISTRANK, DISTRANK_TEST, 4),
            [
                *plugin,
                "--distrank-leftovers=off",
                "--distrank-seed=off",
                "--distrank-deadlocks=wait",
            ],
            "big",
        ),
        # PyTorch's flight recorder off (it records every collective; the hang reports read it).
        (
            "distrank ws4 FR off",
            harness(DISTRANK, DISTRANK_TEST, 4),
            ["env", "TORCH_FR_BUFFER_SIZE=0", *plugin],
            "big",
        ),
        # Launcher mode (torchrun --standalone: a free port each run), with its deadlock watch
        # (launch/deadwatch.py: each rank reads its own /proc CPU time, rank 0 the store) off.
        ("torchrun ws2", harness(DISTRANK, DISTRANK_TEST, 2), launched, "big"),
        (
            "torchrun ws2, deadlocks wait",
            harness(DISTRANK, DISTRANK_TEST, 2),
            [*launched, "--distrank-deadlocks=wait"],
            "big",
        ),
        ("pytest plain", harness(DISTRANK, PLAIN_TEST, 1), plain, "big"),
        ("MultiProcContinuous ws2", harness(CONTINUOUS, CONTINUOUS_TEST, 2), plain, "big"),
        ("MultiProcContinuous ws4", harness(CONTINUOUS, CONTINUOUS_TEST, 4), plain, "big"),
        ("MultiThreadedTestCase ws4", harness(THREADED, THREADED_TEST, 4), plain, "big"),
        ("MultiProcessTestCase ws2", harness(MPTC, MPTC_TEST, 2), plain, "small"),
        ("MultiProcessTestCase ws4", harness(MPTC, MPTC_TEST, 4), plain, "small"),
    ]


@dataclasses.dataclass
class Samples:
    """One workload's numbers, one entry per repetition."""

    per_test: list[float] = dataclasses.field(default_factory=list)
    first: list[float] = dataclasses.field(default_factory=list)
    total: list[float] = dataclasses.field(default_factory=list)
    peak: list[int] = dataclasses.field(default_factory=list)
    #: The plugin's own numbers (DISTRANK_STATS_FILE), per repetition: the controller's seconds
    #: from the end of the 2nd test to the end of the last, per test between ("steady"), and
    #: medians over the tests.
    dispatch: list[float] = dataclasses.field(default_factory=list)
    rank_cpu: list[float] = dataclasses.field(default_factory=list)
    controller_cpu: list[float] = dataclasses.field(default_factory=list)
    #: Milliseconds between the first and the last rank's start of a test (median over tests).
    start_spread: list[float] = dataclasses.field(default_factory=list)


def measure_once(
    make: Callable[[int], str],
    cmd: list[str],
    k_small: int,
    k_big: int,
    folder: Path,
    samples: Samples,
    sample_memory: bool,
) -> None:
    """One repetition of one workload: a 1-test, a small and a large run (and the memory run)."""
    (folder / "test_one.py").write_text(make(1))
    one, _ = timed_run([*cmd, "test_one.py"], folder)
    (folder / "test_one.py").unlink()
    (folder / "test_small.py").write_text(make(k_small))
    small, _ = timed_run([*cmd, "test_small.py"], folder)
    (folder / "test_small.py").unlink()
    (folder / "test_big.py").write_text(make(k_big))
    stats_path = folder / "stats.json"
    os.environ["DISTRANK_STATS_FILE"] = str(stats_path)
    big, _ = timed_run([*cmd, "test_big.py"], folder)
    os.environ.pop("DISTRANK_STATS_FILE")
    if stats_path.exists():
        stats = json.loads(stats_path.read_text())
        stats_path.unlink()
        ended = stats["ended"]
        samples.dispatch.append((ended[-1] - ended[1]) / (len(ended) - 2))
        samples.controller_cpu.append(statistics.median(stats["controller_cpu"][1:]))
        if stats["start_spread"]:
            samples.start_spread.append(statistics.median(stats["start_spread"]))
        per_rank = [cpu / tests for cpu, tests in stats["rank_cpu"]]
        if per_rank:
            samples.rank_cpu.append(statistics.median(per_rank))
    if sample_memory:
        _, peak = timed_run([*cmd, "test_big.py"], folder, sample_memory=True)
        samples.peak.append(peak)
    (folder / "test_big.py").unlink()
    samples.per_test.append((big - small) / (k_big - k_small))
    samples.first.append(one)
    samples.total.append(big)


#: Targets of the speed issue (2-core machine, gloo): steady-state per-test milliseconds.
PER_TEST_TARGET_MS = {"distrank ws2": 2.5, "distrank ws4": 4.0, "distrank ws4 empty": 2.5}
#: Rank and controller CPU per trivial test (ws4), milliseconds.
RANK_CPU_TARGET_MS = 0.7
CONTROLLER_CPU_TARGET_MS = 1.0
#: A whole one-test session at world size 4, fork server start included, in seconds, and as a
#: multiple of ``python -c "import torch"`` measured in the same repetitions.
FIRST_TEST_TARGET_S = 2.5
FIRST_TEST_TARGET_RATIO = 1.2


def verdict(value: float, target: float) -> str:
    if value <= target:
        return f"met ({value:.2f} <= {target:g})"
    return f"MISSED by {value - target:.2f} ({value / target:.1f}x the target {target:g})"


def ms(values: list[float]) -> str:
    """Median in milliseconds, or '-'."""
    return f"{statistics.median(values) * 1000:.2f}" if values else "-"


def spread(values: list[float]) -> str:
    """min-max in milliseconds."""
    return f"{min(values) * 1000:.2f}-{max(values) * 1000:.2f}" if values else "-"


def tree_cpu() -> float:
    """CPU seconds of every process this script has reaped (orphans it adopted included)."""
    while True:  # reap what was adopted: its CPU counts only once it is reaped
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def workload_names(text: str) -> list[str]:
    """The workload names in a comma-separated ``text``; a name may hold a comma itself
    ("distrank ws4 empty, no checks"): the longest name that matches is taken first."""
    known = {w[0] for w in workloads()}
    parts = text.split(",")
    names: list[str] = []
    start = 0
    while start < len(parts):
        for end in range(len(parts), start, -1):
            name = ",".join(parts[start:end]).strip()
            if name in known:
                names.append(name)
                start = end
                break
        else:
            sys.exit(f"not a workload name: {parts[start].strip()!r} (known: {sorted(known)})")
    return names


def paired(names: list[str], k: int, pairs: int) -> None:
    """Per-test wall and whole-tree CPU of two workloads, run in turn (A B, then B A, ...)."""
    chosen = {w[0]: w for w in workloads() if w[0] in names}
    if len(chosen) != 2:
        sys.exit(f"--paired needs two workload names, exactly as listed: {names}")
    with contextlib.suppress(OSError):  # orphans of a run come to this script, to be reaped
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    small = max(2, k // 10)
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="distrank-bench-") as tmp:
        for pair in range(pairs):
            for name in names if pair % 2 == 0 else names[::-1]:
                _, make, cmd, _ = chosen[name]
                runs = []
                for count in (small, k):
                    (Path(tmp) / "test_p.py").write_text(make(count))
                    cpu = tree_cpu()
                    wall, _ = timed_run([*cmd, "test_p.py"], Path(tmp))
                    runs.append((wall, tree_cpu() - cpu))
                (wall_small, cpu_small), (wall_big, cpu_big) = runs
                tests = k - small
                wall, cpu = (wall_big - wall_small) / tests, (cpu_big - cpu_small) / tests
                rows[name].append((wall, cpu))
                print(
                    f"pair {pair + 1} {name:<28} {wall * 1e3:7.2f} ms wall "
                    f"{cpu * 1e3:7.2f} ms CPU per test",
                    flush=True,
                )
    a, b = (rows[name] for name in names)
    print(f"\nmedians of {pairs} pairs, K={k} - K={small}, whole processes in turn:")
    for name, r in rows.items():
        wall, cpu = (statistics.median(x[i] for x in r) * 1e3 for i in (0, 1))
        print(f"  {name:<28} {wall:7.2f} ms wall {cpu:7.2f} ms CPU per test")
    for i, what, target in ((0, "wall", 0.6), (1, "CPU", 0.7)):
        first, second = (statistics.median(x[i] for x in r) for r in (a, b))
        if min(first, second, *(y[i] for y in b)) <= 0:
            print(f"  {what:<4} no ratio: a start-up varied more than {k - small} tests cost")
            continue
        each = statistics.median(x[i] / y[i] for x, y in zip(a, b, strict=True))
        print(
            f"  {what:<4} {names[0]} / {names[1]}: ratio of medians {first / second:.2f}x, "
            f"median of per-pair ratios {each:.2f}x (issue #40 target <= {target}x)"
        )


#: prctl's option that makes this process adopt the orphans of its descendants.
PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=200, help="tests per large run (default 200)")
    parser.add_argument("--k-ref", type=int, default=4, help="tests per MultiProcessTestCase run")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions; medians reported")
    parser.add_argument("--only", default="", help="comma-separated workload name filter")
    parser.add_argument("--paired", default="", help="two workload names: A,B in turn")
    parser.add_argument("--pairs", type=int, default=5, help="pairs of --paired runs")
    args = parser.parse_args()
    os.environ.pop("PYTEST_ADDOPTS", None)
    if args.paired:
        paired(workload_names(args.paired), args.k, args.pairs)
        return
    chosen = [
        w
        for w in workloads()
        if not args.only or any(part in w[0] for part in args.only.split(","))
    ]
    results = {name: Samples() for name, *_ in chosen}
    import_torch: list[float] = []
    with tempfile.TemporaryDirectory(prefix="distrank-bench-") as tmp:
        # Repetitions outermost: a machine that slows down over the run slows every workload
        # alike, instead of the ones measured last.
        for rep in range(args.repeat):
            import_torch.append(timed_run([sys.executable, "-c", "import torch"], Path(tmp))[0])
            for index, (name, make, cmd, size) in enumerate(chosen):
                big = size == "big"
                k_small, k_big = (max(2, args.k // 10), args.k) if big else (1, args.k_ref)
                print(f"[{rep + 1}/{args.repeat}] {name} ...", file=sys.stderr, flush=True)
                folder = Path(tmp) / str(index)
                folder.mkdir(exist_ok=True)
                measure_once(make, cmd, k_small, k_big, folder, results[name], rep == 0)
    reference = {ws: results.get(f"MultiProcessTestCase ws{ws}") for ws in (2, 4)}
    print(
        f"{args.repeat} repetitions; medians, and min-max over the repetitions; K={args.k} "
        f"(MultiProcessTestCase K={args.k_ref}); per test = (wall of K tests - wall of K/10 "
        "tests) / (K - K/10), whole pytest processes"
    )
    header = (
        f"{'workload':<28}{'per test ms':>12}{'min-max':>13}{'rank CPU ms':>12}"
        f"{'ctrl CPU ms':>12}{'steady ms':>13}{'spread ms':>10}{'1-test s':>9}{'PSS MiB':>9}"
        f"{'MPTC/this':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        ref = reference[4 if "ws4" in name else 2]
        per_test = statistics.median(r.per_test)
        ratio = "-"
        if ref and per_test > 0:
            ratio = f"{statistics.median(ref.per_test) / per_test:.0f}x"
        print(
            f"{name:<28}{per_test * 1000:>12.2f}{spread(r.per_test):>13}{ms(r.rank_cpu):>12}"
            f"{ms(r.controller_cpu):>12}{ms(r.dispatch):>13}{ms(r.start_spread):>10}"
            f"{statistics.median(r.first):>9.2f}"
            f"{statistics.median(r.peak) / 2**20:>9.0f}{ratio:>10}"
        )
    torch_s = statistics.median(import_torch)
    label = 'python -c "import torch"'
    print(f"{label:<28}{'':>81}{torch_s:>9.2f}")
    print("\ntargets (medians)")
    for name, target in PER_TEST_TARGET_MS.items():
        if name in results:
            value = statistics.median(results[name].per_test) * 1000
            print(f"  {name + ' per test ms':<36}{verdict(value, target)}")
    ws4 = results.get("distrank ws4")
    if ws4 is not None:
        if ws4.rank_cpu:
            value = statistics.median(ws4.rank_cpu) * 1000
            print(f"  {'rank CPU per test ws4 ms':<36}{verdict(value, RANK_CPU_TARGET_MS)}")
        if ws4.controller_cpu:
            value = statistics.median(ws4.controller_cpu) * 1000
            label = "controller CPU per test ws4 ms"
            print(f"  {label:<36}{verdict(value, CONTROLLER_CPU_TARGET_MS)}")
        first = statistics.median(ws4.first)
        print(f"  {'1-test session ws4 s':<36}{verdict(first, FIRST_TEST_TARGET_S)}")
        print(
            f"  {'1-test session / import torch':<36}"
            f"{verdict(first / torch_s, FIRST_TEST_TARGET_RATIO)}"
        )
        ref = reference[4]
        if ref:
            ratio_4 = statistics.median(ref.per_test) / statistics.median(ws4.per_test)
            print(
                f"  {'MPTC / distrank ws4':<36}{'met' if ratio_4 >= 1000 else 'MISSED'} "
                f"({ratio_4:.0f}x, target >= 1000x)"
            )


if __name__ == "__main__":
    main()
