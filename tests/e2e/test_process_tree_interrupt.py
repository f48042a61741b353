"""End-to-end: Ctrl-C (SIGINT) in an opted-in test shows its process tree's stacks and ends the
tree (issue 41 items 1-3). An interrupt ends its session, so these cannot join
test_process_tree.py's shared one: three small sessions run at once, an ordinary test, a
distributed one, and an ordinary one interrupted twice.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from ..helpers import TAG_ENV, Started, start_pytest, wait_gone
from .test_process_tree import WORKERS

INTERRUPTED_ORDINARY = """
    import multiprocessing as mp, os, pathlib, pytest, workers

    @pytest.mark.process_tree
    def test_waits():
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=workers.serve, args=(q,))
        p.start()
        pathlib.Path(os.environ["TREE_CASE_STARTED"]).touch()
        p.join()
"""

INTERRUPTED = {
    "ordinary": INTERRUPTED_ORDINARY,
    "twice": INTERRUPTED_ORDINARY,  # a second Ctrl-C while the stacks are taken
    "pool": """
        import multiprocessing as mp, os, pathlib, pytest, workers

        @pytest.mark.process_tree
        @pytest.mark.world_size(2)
        def test_waits(rank):
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            p = ctx.Process(target=workers.serve, args=(q,))
            p.start()
            if rank == 0:
                pathlib.Path(os.environ["TREE_CASE_STARTED"]).touch()
            p.join()
    """,
}


def test_an_interrupt_shows_the_trees_stacks_and_ends_it(pytester: pytest.Pytester) -> None:
    """Ctrl-C (SIGINT) in an opted-in test: an ordinary test's tree's stacks are printed and the
    tree ended; a distributed test's are in its interrupted report, one section per rank; a
    second Ctrl-C during the stacks still ends the tree. The sessions run at once; no process
    outlives any."""
    runs: dict[str, tuple[Path, str, Started]] = {}
    for mode, source in INTERRUPTED.items():
        case = pytester.path / mode
        case.mkdir()
        (case / "workers.py").write_text(textwrap.dedent(WORKERS))
        (case / "test_waits.py").write_text(textwrap.dedent(source))
        tag = f"tree-{mode}-{os.getpid()}-{time.time_ns()}"
        env = {**os.environ, TAG_ENV: tag, "TREE_CASE_STARTED": str(case / "started")}
        env.pop("PYTEST_ADDOPTS", None)
        args = ["-p", "distrank", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA"]
        args.append(f"--basetemp={case / 'tmp'}")
        output = case / "output"
        proc = start_pytest(args, case, env, (output, output), signals=[signal.SIGINT])
        runs[mode] = (case, tag, proc)
    try:
        end = time.monotonic() + 120
        for mode, (case, _tag, proc) in runs.items():
            while not (case / "started").exists():
                assert time.monotonic() < end and proc.poll() is None, (
                    f"{mode}: {(case / 'output').read_text()}"
                )
                time.sleep(0.1)
        time.sleep(0.5)  # the worker is in its queue's get()
        for _case, _tag, proc in runs.values():
            proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        runs["twice"][2].send_signal(signal.SIGINT)
        outputs = {}
        for mode, (case, tag, proc) in runs.items():
            proc.wait(60)
            left = wait_gone(tag, 15)
            outputs[mode] = (case / "output").read_text()
            assert not left, f"{mode}: alive after the interrupt: {left}\n{outputs[mode]}"
    finally:
        for _case, _tag, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ordinary = pytest.LineMatcher(outputs["ordinary"].splitlines())
    ordinary.fnmatch_lines(
        [
            "process tree: stacks of test_waits.py::test_waits (interrupted):",
            "* process(es) of the test's tree, stacks by py-spy in *",
            '    File "*workers.py", line 6 in serve',
            "*KeyboardInterrupt*",
        ]
    )
    pool = pytest.LineMatcher(outputs["pool"].splitlines())
    pool.fnmatch_lines(
        ["*process tree: stacks (rank 0/2)*", '    File "*workers.py", line 6 in serve']
    )
