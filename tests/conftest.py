"""Fixtures of the plugin's tests (run in the outer pytest process).

``run_pytest`` runs an end-to-end case; ``shared_session`` runs one inner session that several
tests check, each its own behaviour; ``in_terminal`` runs one under a pseudo-terminal,
typing at its debugger prompts; ``fake_gpus`` gives GPU leasing four fake GPUs. The
helpers they use (the process tag, the leak check) are in ``helpers.py``. Under
``-n N --dist loadfile`` (the README's command), test files that run the same shared sessions
go to one worker (``pytest_xdist_make_scheduler``, in the xdist controller).
"""

from __future__ import annotations

import os
import resource
import signal
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import torch  # noqa: F401  (before any in-process run: torch 2.13 cannot be imported twice)
from hypothesis import HealthCheck, settings

from pytest_distrank.envvars import TEST_WAITS_ENV
from pytest_distrank.markers import MARKERS
from pytest_distrank.options import REPLAY

from .helpers import (
    RUN_TIMEOUT,
    TAG_ENV,
    InTerminal,
    RunPytest,
    SharedSession,
    TerminalRun,
    describe_process,
    run_in_terminal,
    session_families,
    wait_gone,
)
from .zygote import ZYGOTE, Zygote

#: The property tests' profile, here and in CI alike: no per-example deadline and no too-slow
#: check (a loaded 2-core machine under ``-n 3`` flakes on both), a fixed number of examples, and
#: the blob that replays a failing example (``@reproduce_failure``) printed with it.
#: ``HYPOTHESIS_PROFILE=dev`` explores ten times more.
settings.register_profile(
    "distrank",
    deadline=None,
    max_examples=200,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", parent=settings.get_profile("distrank"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "distrank"))


def pytest_configure(config: pytest.Config) -> None:
    """The suite's own session runs without the plugin (pyproject's addopts): its unit tests
    still build items with its markers, so they are registered here."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)


#: ``DISTRANK_TEST_CPU_LOG=FILE``: each test appends a line ``<node id>\t<CPU seconds>`` to FILE,
#: the CPU of this process, of the subprocesses it waited for and of its forked inner sessions
#: (``bench/suite_cpu.py`` sums them per file).
CPU_LOG_ENV = "DISTRANK_TEST_CPU_LOG"


def _cpu_used() -> float:
    """CPU seconds so far of this process and of every inner session it ran."""
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used) + ZYGOTE.cpu


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    log = os.environ.get(CPU_LOG_ENV)
    if not log:
        return (yield)
    before = _cpu_used()
    try:
        return (yield)
    finally:
        with open(log, "a") as out:
            out.write(f"{item.nodeid}\t{_cpu_used() - before:.3f}\n")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, but each family of test files that run the same shared inner sessions
    (``helpers.session_families``: ``test_faults.py``'s sessions, which four other files check)
    is one unit of work: on two workers, each would run those sessions again (seconds of CPU
    each). None (xdist's own) for the other modes."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    families = session_families(Path(__file__).parent / "e2e")

    class SharedSessionsScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            file = PurePosixPath(super()._split_scope(nodeid))
            if file.parent.name == "e2e" and file.name in families:
                return str(file.parent / families[file.name])
            return str(file)

    return SharedSessionsScheduling(config, log)


#: What pytest-xdist sets in its workers: an inner session that inherits them believes it is an
#: xdist worker (pool names, plugins' worker ids), so the suite can run under ``-n``.
XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
#: What a launcher (torchrun, a CI runner that is itself launched) sets: an inner session that
#: inherits them believes it is a launched rank, and its harness tests see them.
LAUNCHER_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
)


def _inner_environment(monkeypatch: pytest.MonkeyPatch, tag: str) -> None:
    """The environment of an inner session: its tag, the short test waits, no xdist worker's
    or launcher's variables."""
    monkeypatch.setenv(TAG_ENV, tag)
    # The end-of-test rule's fixed waits (grace 5 s, finish 5 s, dumps 3 s) take 1 s here; a test
    # of those defaults deletes the variable (envvars.TEST_WAITS_ENV).
    monkeypatch.setenv(TEST_WAITS_ENV, "1")
    for name in (*XDIST_ENV, *LAUNCHER_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    """The warm process inner sessions are forked from (``tests/zygote.py``), one per outer
    process, started at its first session and ended with the outer session."""
    yield ZYGOTE
    ZYGOTE.close()


def _assert_none_left(tag: str) -> None:
    """No process of the inner session tagged ``tag`` (or forked from the zygote) may outlive it
    (15 s to end)."""
    leftover = {pid: describe_process(pid) for pid in wait_gone(tag, 15)}
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes outlived their pytest session: {leftover}"


@pytest.fixture
def run_pytest(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, zygote: Zygote
) -> Iterator[RunPytest]:
    """Run ``pytest -p distrank ARGS`` in a process of its own (forked from the suite's zygote,
    or a subprocess); fail the test if a process outlives it."""
    tag = uuid.uuid4().hex
    _inner_environment(monkeypatch, tag)
    monkeypatch.setenv("COLUMNS", "200")  # short summary lines are not trimmed
    # No replays of failures after the session (pool/replay.py): the fault sessions fail tests
    # on purpose, and replays would cost seconds and run tests that count their runs again.
    # tests/e2e/test_replay.py turns them back on (an empty value: the default).
    monkeypatch.setenv(REPLAY.env, "off")

    def run(*args: str, timeout: float = RUN_TIMEOUT) -> pytest.RunResult:
        return zygote.runpytest(pytester, "-p", "distrank", *args, timeout=timeout)

    yield run
    _assert_none_left(tag)


@pytest.fixture
def run_inprocess(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunPytest]:
    """Run ``pytest -p distrank ARGS`` in this process, for sessions that start no rank (a skip
    or error decided before any process starts, option and marker errors, ordinary tests,
    ``--markers``): ~0.3 s instead of a subprocess's seconds. The inner controller is nested
    (pool/controller.py) and starts no fork server unless a pool is needed; should one start,
    the leak check still finds it."""
    tag = uuid.uuid4().hex
    _inner_environment(monkeypatch, tag)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str, timeout: float = RUN_TIMEOUT) -> pytest.RunResult:
        return pytester.runpytest_inprocess("-p", "distrank", *args)

    yield run
    _assert_none_left(tag)


#: Inner sessions already run, by name (``shared_session``): one per outer session.
_SHARED: dict[str, pytest.RunResult | Exception] = {}


@pytest.fixture
def shared_session(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> SharedSession:
    """Run one inner session for every test that names it, the first time one asks.

    ``write(folder)`` writes the session's files, ``args`` are its pytest arguments and ``env``
    its extra environment; later tests that name the same session get the same result, so each
    checks its own behaviour without a session start (seconds) of its own. The leak check of
    ``run_pytest`` runs after the test that ran the session.
    """

    def run(
        name: str, write: Callable[[Path], None], *args: str, env: dict[str, str] | None = None
    ) -> pytest.RunResult:
        if name not in _SHARED:
            write(pytester.path)
            for key, value in (env or {}).items():
                monkeypatch.setenv(key, value.format(folder=pytester.path))
            try:
                _SHARED[name] = run_pytest(*args)
            except Exception as exc:  # a timeout: every test of the session fails with it
                _SHARED[name] = exc
        result = _SHARED[name]
        if isinstance(result, Exception):
            pytest.fail(f"the shared inner session {name!r} did not finish: {result!r}")
        request.node.stash.setdefault(_SESSIONS_USED, []).append((name, result))
        return result

    return run


#: The shared inner sessions a test checked: shown with its failure (pytest_runtest_makereport).
_SESSIONS_USED = pytest.StashKey[list[tuple[str, pytest.RunResult]]]()
#: How much of a shared session's output a failure shows (its end: summary, failures).
SHOWN_LINES = 300


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed check of a shared inner session shows that session's output: its assertion
    alone (a list of outcomes, a missing line) says nothing of why."""
    report = yield
    if report.failed and call.when == "call":
        for name, result in item.stash.get(_SESSIONS_USED, []):
            lines = [*result.outlines, *result.errlines][-SHOWN_LINES:]
            report.sections.append((f"shared inner session {name!r} (its end)", "\n".join(lines)))
    return report


@pytest.fixture
def in_terminal(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[InTerminal]:
    """Run ``pytest -p distrank ARGS`` under a pseudo-terminal; no process may outlive it."""
    tag = uuid.uuid4().hex
    _inner_environment(monkeypatch, tag)  # as run_pytest
    basetemp = pytester.path / "basetemp"

    def run(args: list[str], answers: list[str], pause: float = 0.0) -> TerminalRun:
        return run_in_terminal(
            ["-p", "distrank", f"--basetemp={basetemp}", *args],
            answers,
            pytester.path,
            RUN_TIMEOUT,
            pause,
        )

    yield run
    _assert_none_left(tag)


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Four fake GPUs and a private lock folder (this test's only), for GPU leasing."""
    lock_dir = tmp_path / "locks"
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "4")
    monkeypatch.setenv("DISTRANK_GPU_LOCK_DIR", str(lock_dir))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return lock_dir
