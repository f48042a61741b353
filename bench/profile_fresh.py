"""Where a test on fresh ranks spends its time: each step of a fork's life, and the controller's.

Runs in a plain Python process; the session it measures is a ``pytest -p distrank
--distrank-isolate`` subprocess over K generated world-size-4 tests (``bench_fresh.py``'s: one
``all_reduce`` each), so that every test runs on ranks forked from the rank templates
(pool/worker/template.py). A probe plugin, loaded in the controller and (through the controller's
arguments) in the templates and so in every fork, marks the steps of each fork's life with its
process CPU (every thread; a fork's starts at zero) and the machine's monotonic clock, and writes
them when the fork leaves (``os._exit``); in the controller it sums the CPU (its main thread) and
wall time of the functions that start, run and stop a pool; in each template, the CPU it spent
forking. No sampling profiler: py-spy's ``--subprocesses`` misses short-lived forks and stops
every process it samples, which changes what it measures.

    python bench/profile_fresh.py                 # K=30, ws4
    python bench/profile_fresh.py --k 40 --ws 2
    python bench/profile_fresh.py --root path/to/suites -k "TensorPipeRpcTest and test_async_fu" \\
        --file pytorch/test/distributed/rpc/test_tensorpipe_agent.py --cprofile rpc.prof

Each row of the fork's table is a step (from the mark before to its own), median over forks;
the controller's rows are per test, inclusive and nested. Quote the machine's load beside the
numbers: a busy machine inflates wall time most and CPU time too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fresh import write_tests

PROBE = '''
"""Probe (bench/profile_fresh.py): marks of each fork's life, sums in the controller."""
import functools, json, os, time
import pytest

OUT = os.environ["DISTRANK_PROBE_DIR"]
STATE = {"who": "controller", "start": 0.0, "tests": 0}
MARKS = []
ACC = {}


def faults():
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[7])


def mark(label):
    MARKS.append((label, time.process_time(), time.monotonic(), faults()))


def marked(owner, name, label, enter=False):
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        if enter:
            mark(label + " (start)")
        try:
            return original(*args, **kwargs)
        finally:
            mark(label)

    setattr(owner, name, wrapped)


def summed(owner, name, label):
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        cpu, wall = time.thread_time(), time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            row = ACC.setdefault(label, [0.0, 0.0, 0])
            row[0] += time.thread_time() - cpu
            row[1] += time.monotonic() - wall
            row[2] += 1

    setattr(owner, name, wrapped)


def dump(name, data):
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(data, f)


_exit = os._exit


def leave(code):
    if STATE["who"] == "fork":
        mark("exit")
        MARKS.append(("system", os.times().system, 0.0, 0))
        dump(f"fork-{os.getpid()}", MARKS)
        if STATE.get("profiler") is not None:
            STATE["profiler"].disable()
            STATE["profiler"].dump_stats(os.path.join(OUT, f"fork-{os.getpid()}.prof"))
    elif STATE["who"] == "template":
        dump(f"template-{os.getpid()}", {"cpu": time.process_time() - STATE["start"]})
    _exit(code)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if os.environ.get("RANK") is None:
        from pytest_distrank.pool.pools import pool, poolset, templates
        from pytest_distrank.pool import controller

        summed(controller.Controller, "_execute", "one test (Controller._execute)")
        summed(poolset.PoolSet, "_start", "  the pool's start (PoolSet._start)")
        summed(pool.Pool, "start", "    forks and Ready (Pool.start)")
        summed(pool.Pool, "wait_for", "      waits (Pool.wait_for, also in run, stop)")
        summed(pool.Pool, "run", "  the test (Pool.run)")
        summed(poolset.PoolSet, "retire", "  retire (PoolSet.retire)")
        summed(pool.Pool, "finish_stop", "    collect the pool before (Pool.finish_stop)")
        summed(pool.Pool, "kill", "      kill, reap (Pool.kill)")
        summed(pool.Pool, "request_stop", "    ask to stop (Pool.request_stop)")
        original = templates.fork_from

        def fork_from(template):
            fork = original(template)

            def timed(*args):
                cpu, wall = time.thread_time(), time.monotonic()
                try:
                    return fork(*args)
                finally:
                    row = ACC.setdefault("      fork requests (templates.fork_from)", [0, 0, 0])
                    row[0] += time.thread_time() - cpu
                    row[1] += time.monotonic() - wall
                    row[2] += 1

            return timed

        templates.fork_from = fork_from
        poolset.fork_from = fork_from
        return
    os._exit = leave
    from pytest_distrank.pool.worker import main, template

    original = template.fork_ranks

    def fork_ranks(*args, **kwargs):
        STATE["who"], STATE["start"] = "template", time.process_time()
        out = original(*args, **kwargs)
        STATE["who"] = "fork"  # only a fork returns
        MARKS.clear()
        mark("forked")
        if os.environ.get("DISTRANK_PROBE_CPROFILE"):
            import cProfile

            STATE["profiler"] = cProfile.Profile(time.process_time)
            STATE["profiler"].enable()
        return out

    template.fork_ranks = fork_ranks
    marked(template, "become", "become (what it gets anew)")
    marked(template.TemplatePlugin, "_load_conftests", "conftests")
    marked(main, "start_rank", "process group (start_rank)", enter=True)
    marked(main.WorkerPlugin, "_run", "the test (WorkerPlugin._run)", enter=True)
    marked(main.WorkerPlugin, "_stop", "stop (WorkerPlugin._stop)", enter=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    if STATE["who"] == "fork":
        mark("collection")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid):
    STATE["tests"] += 1


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if STATE["who"] == "controller":
        dump("controller", {"acc": ACC, "tests": STATE["tests"]})
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=30, help="tests in the session")
    parser.add_argument("--ws", type=int, default=4, help="world size")
    parser.add_argument(
        "--cprofile", metavar="PATH", help="also profile each fork (cProfile), merged into PATH"
    )
    parser.add_argument("--file", help="profile this test file instead (its tests' own fresh "
                        "ranks: PyTorch's RPC classes), relative to --root")  # fmt: skip
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("-k", dest="select", default="", help="with --file: its -k")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="distrank-profile-") as tmp:
        folder = Path(tmp)
        (folder / "distrank_probe.py").write_text(PROBE)
        out = folder / "out"
        out.mkdir()
        env = dict(os.environ, DISTRANK_PROBE_DIR=str(out))
        if args.cprofile:
            env["DISTRANK_PROBE_CPROFILE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "distrank_probe"]
        command += ["-q", "-p", "no:cacheprovider"]
        if args.file:
            command += [args.file, *(["-k", args.select] if args.select else [])]
        else:
            command += [write_tests(folder, args.k, args.ws).name, "--distrank-isolate"]
        cwd = args.root if args.file else folder
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:])
        forks = [json.loads(p.read_text()) for p in out.glob("fork-*.json")]
        templates = [json.loads(p.read_text()) for p in out.glob("template-*.json")]
        controller = json.loads((out / "controller.json").read_text())
        profiles = [str(p) for p in out.glob("fork-*.prof")]
        if args.cprofile and profiles:
            pstats.Stats(*profiles).dump_stats(args.cprofile)
    tests = controller["tests"]
    what = f"{args.file} -k {args.select!r}" if args.file else f"K={args.k} ws{args.ws}"
    print(f"{what}, {len(forks)} forks; load {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end\n")  # fmt: skip
    print(f"{'each fork, step by step (median over forks)':50} {'ms CPU':>8} {'ms wall':>8} "
          f"{'faults':>8}")  # fmt: skip
    steps: dict[str, list[tuple[float, float, int]]] = {}
    system = statistics.median(m.pop()[1] for m in forks) * 1000
    for marks in forks:
        for (_, cpu0, wall0, f0), (label, cpu1, wall1, f1) in itertools.pairwise(marks):
            steps.setdefault(label, []).append((cpu1 - cpu0, wall1 - wall0, f1 - f0))
    for label, values in steps.items():
        cpu = statistics.median(v[0] for v in values) * 1000
        wall = statistics.median(v[1] for v in values) * 1000
        minor = statistics.median(v[2] for v in values)
        print(f"  {label:48} {cpu:8.1f} {wall:8.1f} {minor:8.0f}")
    whole = statistics.median(m[-1][1] for m in forks) * 1000
    minor = statistics.median(m[-1][3] for m in forks)
    print(f"  {'the whole fork (from the fork to its exit)':48} {whole:8.1f} {'':8} {minor:8.0f}")
    print(f"  {'of it in the kernel (system time)':48} {system:8.1f}")
    per_fork = sum(t["cpu"] for t in templates) / max(len(forks), 1) * 1000
    print(f"\n{'each template, per fork it made':50} {per_fork:8.1f}\n")
    print(f"{'controller, per test (inclusive, nested)':50} {'ms CPU':>8} {'ms wall':>8}")
    for label, (cpu, wall, _) in controller["acc"].items():
        print(f"  {label:48} {cpu / tests * 1000:8.1f} {wall / tests * 1000:8.1f}")


if __name__ == "__main__":
    main()
