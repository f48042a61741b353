"""Tests on fresh ranks (PyTorch's RPC classes): the plugin's cost per test beyond the call phase.

Runs in a plain Python process; every run is a whole ``pytest -p distrank`` session in a
subprocess. PyTorch's RPC test classes run each test on fresh ranks (RPC state does not survive
between tests), so each test pays a pool start; ``rpc/test_faulty_agent.py`` also delays every
call by 1.5 s by design. For a file (and an optional ``-k``), the script runs it with
``--distrank-fresh-ranks=start`` (each fresh rank starts its own pytest session) and ``=fork``
(the default: forked from rank templates), in turn (A B, B A, ...), with ``--durations=0``, and
prints per run the session's wall time and the whole tree's CPU time, the sums of the tests'
phases (as pytest's durations report them: the controller's merged reports; a fresh pool's
start is charged to its test's setup), the cost per test beyond the call phase, (wall - calls) /
tests, which includes the session's fixed costs (collecting the file: a -k selection of a few
tests pays all of it), and the per-test part alone, (setups + teardowns) / tests. Issue #40's
target: at most 0.15 s at world size 4.

    python bench/bench_rpc.py --root path/to/suites \\
        pytorch/test/distributed/rpc/test_tensorpipe_agent.py -k RemoteModule --rounds 2
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASE = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+\S")
PASSED = re.compile(r"(\d+) (passed|failed|skipped|error)")


def run(root: Path, path: str, select: str, mode: str) -> tuple[float, dict[str, float], int, str]:
    """Wall seconds, summed phases (and "cpu": the whole tree's), tests run, and the summary
    line of one session."""
    command = [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "no:cacheprovider", "-q",
               "--durations=0", "--durations-min=0", f"--distrank-fresh-ranks={mode}", path,
               *(["-k", select] if select else [])]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = done.stdout.splitlines()
    phases = dict.fromkeys(("setup", "call", "teardown"), 0.0)
    phases["cpu"] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    for line in lines:
        if m := PHASE.match(line):
            phases[m.group(2)] += float(m.group(1))
    summary = lines[-1] if lines else done.stderr[-500:]
    tests = sum(int(n) for n, _ in PASSED.findall(summary))
    return wall, phases, tests, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the test file, relative to --root")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("-k", dest="select", default="")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    costs: dict[str, list[tuple[float, float]]] = {"start": [], "fork": []}
    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for round_ in range(args.rounds):
        order = ["start", "fork"] if round_ % 2 == 0 else ["fork", "start"]
        for mode in order:
            wall, phases, tests, summary = run(args.root, args.path, args.select, mode)
            beyond = (wall - phases["call"]) / max(tests, 1)
            own = (phases["setup"] + phases["teardown"]) / max(tests, 1)
            costs[mode].append((beyond, own))
            print(f"round {round_ + 1} {mode:5}: {wall:7.1f} s wall ({phases['cpu']:.1f} s CPU), "
                  f"calls {phases['call']:6.1f} s,"
                  f" {tests} tests; per test beyond the call {beyond:.3f} s, of it setup and "
                  f"teardown {own:.3f} s  [{summary}]", flush=True)  # fmt: skip
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for mode, values in costs.items():
        beyond = statistics.median(b for b, _ in values)
        own = statistics.median(o for _, o in values)
        print(f"median {mode:5}: {beyond:.3f} s per test beyond the call phase, of it setup and "
              f"teardown {own:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
