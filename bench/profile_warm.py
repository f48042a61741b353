"""Where a warm test's time goes: CPU per test, per process, by function (issue #40 item 2).

Runs in a plain Python process; the session it measures is a ``pytest -p distrank`` subprocess
over K generated 4-rank tests (``bench_overhead.py``'s: one ``all_reduce`` each). A probe plugin,
loaded in the controller and (through the controller's arguments) in every rank, wraps the
functions named below with ``time.thread_time()``: the CPU of the thread that runs them (the main
thread), inclusive of what they call, without a sampling profiler's stops or cProfile's per-call
cost. Each process also reports its whole CPU (every thread, user + system: ``os.times``) over
the same tests. The first tests are left out (pool start, first imports).

Usage (from the repository root, with the project installed):

    python bench/profile_warm.py                 # K=300, ws4
    python bench/profile_warm.py --k 500 --ws 2

Rows are inclusive and nested (indented under the row that calls them); a function a version
lacks is left out. Quote the machine's load beside the numbers: the figures are CPU time, which a
busy machine inflates less than wall time, but still inflates (caches, frequency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import DISTRANK, DISTRANK_TEST

WORKER = "pytest_distrank.pool.worker.main"
ATTEMPT = "pytest_distrank.pool.onetest.attempt"
POOL = "pytest_distrank.pool.pools.pool"
#: (depth, label, module, attribute path) of what the probe times in each rank; a module
#: "hook:NAME" stands for the implementation of hook NAME by a plugin of that class.
RANK_ROWS = [
    (0, "serve one test (WorkerPlugin._run)", WORKER, "WorkerPlugin._run"),
    (1, "pytest's run protocol", "_pytest.runner", "runtestprotocol"),
    (1, "the lean run protocol", "hook:pytest_runtest_protocol", "LeanProtocol"),
    (2, "the phases' hooks (setup, call, teardown)", "_pytest.runner", "CallInfo.from_call"),
    (3, "fixtures set up", "_pytest.runner", "SetupState.setup"),
    (3, "the test's body", "_pytest.python", "Function.runtest"),
    (3, "seeding (each phase)", "pytest_distrank.rank.seeding", "SeedPlugin._phase"),
    (3, "leftover snapshot", "pytest_distrank.rank.snapshot", "Snapshot.take"),
    (3, "leftover compare and restore", "pytest_distrank.rank.leftovers", "LeftoverCheck._settle"),
    (2, "reports made (TestReport)", "_pytest.reports", "TestReport.from_item_and_call"),
    (2, "rank's terminal (its .pytest.log)", "hook:pytest_runtest_logreport", "TerminalReporter"),
    (2, "reports kept (WorkerPlugin)", "hook:pytest_runtest_logreport", "WorkerPlugin"),
    (1, "leftover check's start", "pytest_distrank.rank.leftovers", "LeftoverCheck.start"),
    (1, "loggers covered (ranklogs)", "pytest_distrank.pool.worker.ranklogs", "new_test"),
    (1, "meeting the peers", WORKER, "meet_before_destroy"),
    (1, "sequence numbers", WORKER, "sequence_numbers"),
    (1, "leftover check's finish", "pytest_distrank.rank.leftovers", "LeftoverCheck.finish"),
    (1, "sending the reports", WORKER, "WorkerPlugin._flush"),
]
#: The same for the controller.
CONTROLLER_ROWS = [
    (0, "one test (the plugin's run protocol)", "hook:pytest_runtest_protocol", "Controller"),
    (1, "sending it to the ranks", POOL, "Pool.send"),
    (1, "waiting, taking, judging (Attempt.run)", ATTEMPT, "Attempt.run"),
    (2, "waiting on pipes (Pool.wait_for)", POOL, "Pool.wait_for"),
    (2, "taking a message (Attempt._take)", ATTEMPT, "Attempt._take"),
    (1, "merging and replaying (finish_test)", "pytest_distrank.pool.controller", "finish_test"),
    (2, "merging the ranks' reports", "pytest_distrank.outcome.finish", "merge_test"),
    (1, "the terminal (every phase's report)", "hook:pytest_runtest_logreport", "TerminalReporter"),
]

PROBE = '''
"""Probe (bench/profile_warm.py): thread CPU of named functions, per process."""
import functools, importlib, json, os, time
import pytest

ROWS = {rows!r}
SKIP = {skip}
K = {k}
ACC = {{}}
STATE = {{"tests": 0, "cpu0": None, "where": None}}


def _timed(key, original):
    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            if STATE["cpu0"] is not None:
                ACC[key] = ACC.get(key, 0.0) + time.thread_time() - start

    return timed


def _wrap_hook(config, key, hook, owner):
    """A hook implementation already registered: its plugin's class named ``owner``."""
    for impl in getattr(config.pluginmanager.hook, hook).get_hookimpls():
        if type(impl.plugin).__name__ == owner:
            impl.function = _timed(key, impl.function)


def _wrap(key, module, path):
    try:
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    except (ImportError, AttributeError, KeyError):
        return
    if isinstance(original, classmethod):
        setattr(owner, name, classmethod(_timed(key, original.__func__)))
    elif not isinstance(original, staticmethod):
        setattr(owner, name, _timed(key, original))


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    rank = os.environ.get("RANK")
    STATE["where"] = "controller" if rank is None else f"rank{{rank}}-{{os.getpid()}}"
    config.pluginmanager.register(ControllerCount() if rank is None else RankCount())
    for key, (_, _, module, path) in enumerate(ROWS["controller" if rank is None else "rank"]):
        if module.startswith("hook:"):
            _wrap_hook(config, key, module[5:], path)
        else:
            _wrap(key, module, path)


def _cpu():
    t = os.times()
    return t.user + t.system


def _begin():
    if STATE["tests"] == SKIP and STATE["cpu0"] is None:
        STATE["cpu0"] = _cpu()
        STATE["thread0"] = time.thread_time()


def _end():
    STATE["tests"] += 1
    if STATE["tests"] == K:  # ranks end with os._exit: written at the last test
        out = os.path.join(os.environ["DISTRANK_PROBE_DIR"], STATE["where"] + ".json")
        with open(out, "w") as f:
            json.dump({{"acc": ACC, "cpu": _cpu() - STATE["cpu0"],
                        "thread": time.thread_time() - STATE["thread0"], "tests": K - SKIP}}, f)


class ControllerCount:
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid):
        _begin()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid):
        _end()


class RankCount:
    """In a rank, tests are counted in their setup and teardown hooks, not in logstart/logfinish
    implementations of the probe's own."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        _begin()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item):
        _end()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=300, help="tests in the session")
    parser.add_argument("--ws", type=int, default=4, help="world size")
    parser.add_argument("--skip", type=int, default=20, help="first tests left out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="distrank-profile-") as tmp:
        folder = Path(tmp)
        tests = "".join(DISTRANK_TEST.format(ws=args.ws, i=i) for i in range(args.k))
        (folder / "test_warm.py").write_text(DISTRANK.format(tests=tests))
        rows = {"rank": RANK_ROWS, "controller": CONTROLLER_ROWS}
        (folder / "distrank_probe.py").write_text(PROBE.format(rows=rows, skip=args.skip, k=args.k))
        out = folder / "out"
        out.mkdir()
        env = dict(os.environ, DISTRANK_PROBE_DIR=str(out))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "distrank_probe"]
        command += ["test_warm.py", "-q", "-p", "no:cacheprovider"]
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:])
        results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    load = os.getloadavg()[0]
    print(f"CPU per test in ms (thread_time of the main thread, inclusive; K={args.k},")
    print(f"ws{args.ws}, the first {args.skip} tests left out; load {load:.1f} at the end)\n")
    for kind, table in (("controller", CONTROLLER_ROWS), ("rank", RANK_ROWS)):
        runs = [r for name, r in sorted(results.items()) if name.startswith(kind)]
        if not runs:
            print(f"{kind}: no data (did the session pass?)")
            continue
        heading = "controller" if kind == "controller" else f"each rank (median of {len(runs)})"
        print(f"{heading:62} ms/test")

        def per_test(value: float, run: dict[str, float]) -> float:
            return 1000 * value / run["tests"]

        whole = statistics.median(per_test(r["cpu"], r) for r in runs)
        thread = statistics.median(per_test(r["thread"], r) for r in runs)
        print(f"{'the whole process (all threads, user + system)':62} {whole:7.3f}")
        print(f"{'its main thread':62} {thread:7.3f}")
        for key, (depth, label, _, _) in enumerate(table):
            values = [per_test(r["acc"][str(key)], r) for r in runs if str(key) in r["acc"]]
            if values:
                indent, median = "  " * (depth + 1), statistics.median(values)
                print(f"{indent}{label:{60 - 2 * depth}} {median:7.3f}")
        print()


if __name__ == "__main__":
    main()
