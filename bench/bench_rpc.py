"""Tests on fresh ranks (PyTorch's RPC classes): the plugin's cost per test beyond the call phase.

Runs in a plain Python process; every run is a whole pytest session in a subprocess. PyTorch's
RPC test classes run each test on fresh ranks (RPC state does not survive between tests), so
each test pays a pool start; ``rpc/test_faulty_agent.py`` also delays every call by 1.5 s by
design. For a file (and an optional ``-k``), each round runs, in turn (the order reversed every
other round, A B B A ...):

- ``fork``: ``pytest -p distrank`` with fresh ranks forked from rank templates (the default);
- ``start``: the same with ``--distrank-fresh-ranks=start`` (each fresh rank starts its own
  pytest session);
- ``other``: with ``--other PATH``, the ``fork`` mode of the checkout at PATH (first on
  ``PYTHONPATH``): a before/after pair on the same machine in the same rounds;
- ``plain``: ``pytest -p no:distrank --collect-only`` of the same selection: what any pytest
  session pays for the file (its imports, its collection) without the plugin.

Per run it prints the session's wall time and the whole tree's CPU time, the sums of the
tests' phases (``--durations=0``: the controller's merged reports; a fresh pool's start is
charged to its test's setup), and per test: beyond the call phase, (wall - calls) / tests, which
includes the session's fixed costs (collecting the whole file: a ``-k`` selection of a few tests
pays all of it); of it the setup and teardown, (setups + teardowns) / tests; and the plugin's
own, (wall - calls - the round's plain collection wall) / tests. Issue #40's target: at most
0.15 s per test beyond the call phase at world size 4.

    python bench/bench_rpc.py --root path/to/suites \\
        pytorch/test/distributed/rpc/test_tensorpipe_agent.py -k RemoteModule --rounds 2
    python bench/bench_rpc.py --root path/to/suites --modes fork --other ../main \\
        pytorch/test/distributed/rpc/test_tensorpipe_agent.py \\
        -k "TensorPipeRpcTest and test_async_function_" --rounds 3      # world size 4
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
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|tests? collected)")


def run(root: Path, path: str, select: str, mode: str, other: str) -> dict[str, float | str]:
    """One session: its wall and the whole tree's CPU seconds, its summed phases, its tests
    (run, or collected by ``plain``) and its summary line."""
    env = dict(os.environ)
    if mode == "other":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (other, env.get("PYTHONPATH")) if p)
    if mode == "plain":
        options = ["-p", "no:distrank", "--collect-only"]
    else:
        fresh = "start" if mode == "start" else "fork"
        options = ["-p", "distrank", "--durations=0", "--durations-min=0"]
        options.append(f"--distrank-fresh-ranks={fresh}")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *options, path]
    command += ["-k", select] if select else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = done.stdout.splitlines()
    out: dict[str, float | str] = dict.fromkeys(("setup", "call", "teardown"), 0.0)
    out["wall"] = wall
    out["cpu"] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    for line in lines:
        if m := PHASE.match(line):
            out[m.group(2)] = float(out[m.group(2)]) + float(m.group(1))
    summary = lines[-1] if lines else done.stderr[-500:]
    out["summary"] = summary
    out["tests"] = float(sum(int(n) for n, _ in COUNTS.findall(summary)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the test file, relative to --root")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("-k", dest="select", default="")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="start,fork", help="of start, fork (default: both)")
    parser.add_argument("--other", default="", help="a checkout whose fork mode runs too")
    args = parser.parse_args()
    modes = [*args.modes.split(","), *(["other"] if args.other else []), "plain"]
    rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for round_ in range(args.rounds):
        runs = {}
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            runs[mode] = run(args.root, args.path, args.select, mode, args.other)
        plain = float(runs["plain"]["wall"])
        rows["plain"].append({"wall": plain, "cpu": float(runs["plain"]["cpu"])})
        print(f"round {round_ + 1} plain : {plain:7.1f} s wall ({float(runs['plain']['cpu']):.1f}"
              f" s CPU), collecting [{runs['plain']['summary']}]")  # fmt: skip
        for mode in modes[:-1]:
            r = {k: v for k, v in runs[mode].items() if isinstance(v, float)}
            tests = max(r["tests"], 1.0)
            r["beyond"] = (r["wall"] - r["call"]) / tests
            r["own"] = (r["setup"] + r["teardown"]) / tests
            r["plugin"] = (r["wall"] - r["call"] - plain) / tests
            rows[mode].append(r)
            print(f"round {round_ + 1} {mode:6}: {r['wall']:7.1f} s wall ({r['cpu']:.1f} s CPU), "
                  f"calls {r['call']:6.1f} s, {tests:.0f} tests; per test beyond the call "
                  f"{r['beyond']:.3f} s, of it setup and teardown {r['own']:.3f} s; the "
                  f"plugin's {r['plugin']:.3f} s  [{runs[mode]['summary']}]",
                  flush=True)  # fmt: skip
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    for mode in modes[:-1]:
        m = {k: statistics.median(r[k] for r in rows[mode]) for k in rows[mode][0]}
        print(f"median {mode:6}: {m['wall']:.1f} s wall, {m['cpu']:.1f} s CPU, calls "
              f"{m['call']:.1f} s; per test beyond the call {m['beyond']:.3f} s, of it setup "
              f"and teardown {m['own']:.3f} s; the plugin's {m['plugin']:.3f} s")  # fmt: skip
    plain = statistics.median(r["wall"] for r in rows["plain"])
    cpu = statistics.median(r["cpu"] for r in rows["plain"])
    print(f"median plain : {plain:.1f} s wall, {cpu:.1f} s CPU (collecting, without the plugin)")


if __name__ == "__main__":
    main()
