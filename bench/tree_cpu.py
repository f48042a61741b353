"""Which process of a session's tree spends a warm test's CPU: the controller, or each rank.

Runs in a plain Python process; each workload (``bench_overhead.py``'s) is a whole pytest session
in a subprocess, run with K/10 and K tests, in turn with the other workloads, ``--rounds`` times.
While a session runs, the script reads the CPU time (user + system) of every process of its tree
from ``/proc`` every 20 ms and keeps each process's last reading; the cost per test of a process
is the difference between the two runs over the difference of test counts. The pytest process
itself is "controller" (for PyTorch's harnesses: the process that runs pytest and hands the
tests out); the others are listed by CPU, the ranks first. A process that ends between two
readings loses its last 20 ms: compare the large runs' rows, not small differences.

    python bench/tree_cpu.py                      # distrank ws4 and MultiProcContinuous ws4
    python bench/tree_cpu.py --k 300 --rounds 3 --workloads "distrank ws4,MultiProcContinuous ws4"
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import workload_names, workloads

HZ = os.sysconf("SC_CLK_TCK")
#: Seconds a session may run (a warm 300-test session takes a few).
TIMEOUT = 600


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(name))
            except OSError:
                pass
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children.get(pid, [])
    return found


def _cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / HZ


def run(cmd: list[str], text: str) -> tuple[float, list[float]]:
    """(the controller's CPU seconds, every other process's, largest first) of one session."""
    folder = Path(tempfile.mkdtemp(prefix="tree-cpu-"))
    (folder / "test_bench.py").write_text(text)
    proc = subprocess.Popen(
        [*cmd, "test_bench.py"], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    last: dict[int, float] = {}
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None:
        if time.monotonic() > deadline:  # a session that hangs: its tree ends, the run fails
            proc.kill()
            proc.wait()
            sys.exit(f"tree_cpu: the session ran past {TIMEOUT} s: {' '.join(cmd)} in {folder}")
        for pid in _tree(proc.pid):
            cpu = _cpu(pid)
            if cpu is not None:
                last[pid] = cpu
        time.sleep(0.02)
    controller = last.pop(proc.pid, 0.0)
    return controller, sorted(last.values(), reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=300, help="tests of the large run (default 300)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="distrank ws4,MultiProcContinuous ws4")
    parser.add_argument("--ranks", type=int, default=4, help="processes listed after it")
    options = parser.parse_args()
    table = {w[0]: w for w in workloads()}
    names = workload_names(options.workloads)
    small = max(1, options.k // 10)
    per_test: dict[str, list[list[float]]] = {name: [] for name in names}
    for round_ in range(options.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            _, make, cmd, _ = table[name]
            ctl_s, others_s = run(cmd, make(small))
            ctl_k, others_k = run(cmd, make(options.k))
            width = options.ranks
            big, little = (others_k + [0.0] * width)[:width], (others_s + [0.0] * width)[:width]
            rows = [ctl_k - ctl_s] + [k - s for k, s in zip(big, little, strict=True)]
            rest = sum(others_k[width:]) - sum(others_s[width:])
            costs = [1000 * r / (options.k - small) for r in (*rows, rest)]
            per_test[name].append(costs)
            print(f"round {round_ + 1} {name:28s} " + " ".join(f"{c:6.2f}" for c in costs))
    print(f"\nms of CPU per test (medians of {options.rounds} rounds, K={options.k} - {small}):")
    print(f"{'':28s} {'ctl':>6s} " + " ".join(f"{'p' + str(i):>6s}" for i in range(options.ranks))
          + f" {'rest':>6s} {'all':>6s}")  # fmt: skip
    for name, rounds in per_test.items():
        medians = [statistics.median(column) for column in zip(*rounds, strict=True)]
        print(f"{name:28s} " + " ".join(f"{m:6.2f}" for m in medians) + f" {sum(medians):6.2f}")


if __name__ == "__main__":
    main()
