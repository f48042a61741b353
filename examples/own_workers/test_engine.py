"""Tests that start their own workers: a toy engine (``toy_engine.py``) in five cases.

Four tests run in a child process of their own (``@pytest_distrank.in_child``, as vLLM runs its
engine tests with a fork-per-test decorator), so what the engine leaves behind dies with the
child, and the child's outcome is the test's: a failure with its traceback, a hang with the
child's stack at its timeout, the workers it left running killed and named. The fifth hangs in
the test's own process under ``@pytest.mark.process_tree``: at pytest-timeout's deadline the
report shows every worker's Python stack (the one blocked in ``all_reduce`` marked), and the
workers are ended before the next test.

Four cases fail on purpose, to show their reports; they are marked ``xfail(strict=True)`` so
that ``pytest -p distrank examples/`` stays green. See the reports with
``pytest -p distrank examples/own_workers --runxfail``.
"""

from __future__ import annotations

import pytest
from toy_engine import Engine

from pytest_distrank import in_child


@in_child(timeout=30)
def test_serves_requests() -> None:
    engine = Engine(workers=2)
    for value in (1.0, 2.0, 5.0):
        engine.submit(value)
        assert engine.result() == value * 3
    engine.close()


@pytest.mark.xfail(strict=True, reason="a hung worker: its stack in the report, its tree killed")
@in_child(timeout=3)
def test_hung_worker() -> None:
    engine = Engine(workers=2)
    engine.submit(1.0, kind="hang")  # worker 1 sleeps; worker 0 waits in all_reduce
    engine.result()  # waits forever: in_child stops the test at 3 s, shows where it was


@pytest.mark.xfail(strict=True, reason="a hung worker: every worker's stack in the report")
@pytest.mark.process_tree
@pytest.mark.timeout(6)
def test_hung_worker_stacks() -> None:
    engine = Engine(workers=2)
    engine.submit(1.0, kind="hang")  # worker 1 sleeps; worker 0 waits in all_reduce
    engine.result()  # pytest-timeout ends the test at 6 s; the report shows both workers


@pytest.mark.xfail(strict=True, reason="a crashed worker: the engine's error names it")
@in_child(timeout=30)
def test_crashed_worker() -> None:
    engine = Engine(workers=2)
    engine.submit(1.0, kind="crash")  # worker 1 dies of SIGSEGV
    engine.result()


#: Engines kept for reuse, as a module global or a session fixture keeps them.
CACHE: list[Engine] = []


@pytest.mark.xfail(strict=True, reason="a leaked worker: killed and named, and failed here")
@in_child(timeout=30, leftovers="fail")
def test_leaked_worker() -> None:
    engine = Engine(workers=2)
    CACHE.append(engine)  # never closed: both workers still serve when the test returns
    engine.submit(2.0)
    assert engine.result() == 6.0
