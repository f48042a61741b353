"""Inside a pool rank: run a test of PyTorch's own harness the way that harness runs it.

Runs in pool-mode rank processes only (registered by :mod:`main`). The items :mod:`pool.suites`
took over (its ``CASE`` stash key) get their ``runtest`` replaced:

- ``MultiProcessTestCase`` (kind ``spawn``): what the harness's parent does before spawning
  runs here, with spawning turned off: an instance of the class runs its ``setUp`` (which fills
  ``special_return_code_checks``, ``skip_return_code_checks`` and sets environment variables
  such as ``WORLD_SIZE``). Then the class's own ``_run(rank, test_name, file_name, pipe)`` runs,
  as in a spawned child: overrides of ``_run`` (FSDPTest) and ``run_test`` keep working. Its
  exit code (``sys.exit``) and the traceback it sends through the pipe are read as the parent
  reads them: code 10 fails the test with that traceback, PyTorch's skip codes
  (``TEST_SKIPS``, 72-89) skip it with their message (a ``unittest.SkipTest`` inside the rank,
  code 86, with its own reason), and the parent's return-code rules apply. Then ``tearDown``.
  ``file_name`` is a file in the test's shared folder: the same for all ranks of the test,
  fresh for each test.
- ``MultiProcContinuousTest`` (kind ``continuous``): the first test of a class in this rank
  calls the class's own ``_init_pg(rank, world_size, rendezvous file)`` once, as the harness's
  worker loop does; every test then runs as ``_run_test_given_id`` runs it. A failure makes
  the pool unfit: the next test gets a new pool and the class's ``_init_pg`` again (instead of
  the harness's ``poison_pill``, which skips the rest of the class); a group the test destroyed
  or replaced makes the pool unfit too (:func:`rankgroup.group_problem`).

Class state follows the harness's processes: ``setUpClass`` runs in the rank (pytest's class
fixture, the harness's parent), and the test itself (the child's part: ``_run``, ``_init_pg``,
``_run_test_given_id``) sees the class as the harness's child would (:mod:`suiteclass`). A
child forked from the parent (``_fork_processes``, or ``_start_processes`` with a fork context)
sees what ``setUpClass`` and ``setUp`` set; a spawned child (``_spawn_processes``, every
``MultiProcContinuousTest`` worker) imports the module afresh and sees the class as it was after
import. What the child's part changes in the class is undone after it, as the child's exit
would; a continuous class's worker keeps its own view from one test to the next.

What the harness's parent does once for every child, its ``setUp`` and ``tearDown``, every rank
does, taking the environment rank 0's ``setUp`` set (:mod:`suiteparent`: one ``TEMP_DIR``, where
PyTorch's ``DistributedTest`` suite meets at its file barrier).

What the test leaves behind in the warm rank is checked as for every test
(:mod:`rank.leftovers`); what the harness's own ``setUp`` sets in what stands for its parent
process (``WORLD_SIZE``, ``TEMP_DIR``, ``TORCH_NCCL_DESYNC_DEBUG``) is the harness's: it is
restored after the test without being named (:attr:`SuiteRunner.after_setup`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import unittest
from collections.abc import Callable, Generator, Iterator
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import pytest

from ... import _compat
from ...outcome.expectations import harness_source
from ...rank.context import RANK_CONTEXT, RankContext, announce_exit
from ..suites import CASE, Case
from . import harnessenv, ranklogs
from .suiteclass import ClassState, child_view
from .suiteparent import ParentEnv


class SuiteRunner:
    """The rank's runner of existing-suite tests (a pytest plugin of the rank's session)."""

    def __init__(self) -> None:
        #: The continuous class whose group is up in this rank (its _init_pg ran here).
        self.continuous: type | None = None
        self.continuous_skip: str | None = None
        #: Why this rank must not serve another test (a continuous class's failure), or "".
        self.unfit = ""
        #: Called when the harness's setUp has run (rank/leftovers.py: what it set is the
        #: harness's own).
        self.after_setup: Callable[[], None] = lambda: None
        #: Each class as a spawned child sees it: as imported, before any setUpClass ran.
        self.fresh: dict[type, ClassState] = {}
        #: The continuous class's worker's own view of its class, kept between its tests.
        self.worker_view: ClassState | None = None
        #: The continuous class's worker's environment, kept between its tests.
        self.worker_env = harnessenv.WorkerEnv()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            case = item.stash.get(CASE, None)
            if case is not None:
                setattr(item, "runtest", _bound(self, item, case))  # noqa: B010
                cls = getattr(item, "cls")  # noqa: B009
                if cls not in self.fresh:  # before any test (and setUpClass) ran here
                    self.fresh[cls] = ClassState.of(cls)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A failure read from the child's traceback is shown at the test's own line, with the
        child's exception line (the headline, ``-ra`` and junit's ``message=`` read it)."""
        report = yield
        site = getattr(call.excinfo.value, CRASH_ATTR, None) if call.excinfo else None
        crash = getattr(report.longrepr, "reprcrash", None)
        if site is not None and crash is not None:
            crash.path, crash.lineno, crash.message = site
        return report

    def problem(self) -> str:
        """What the last test left that makes this rank unfit for the next one ("" if none)."""
        found, self.unfit = self.unfit, ""
        return found

    def run(self, item: pytest.Item, case: Case) -> None:
        ctx = item.config.stash[RANK_CONTEXT]
        if case.kind == "spawn":
            self.end_continuous(ctx)
            cls = getattr(item, "cls")  # noqa: B009
            # The environment and loggers of the harness's parent and child, not the pool's.
            with harnessenv.child_environment(), ranklogs.out_of_sight():
                _run_spawned(item, ctx, self.fresh.get(cls), self.after_setup)
        else:
            if self.continuous is not getattr(item, "cls"):  # noqa: B009
                self.end_continuous(ctx)  # the next class's worker starts afresh
            with self.worker_env.around(), ranklogs.out_of_sight():
                self._run_continuous(item, ctx, case)

    # -- MultiProcContinuousTest ---------------------------------------------------------------

    def _run_continuous(self, item: pytest.Item, ctx: RankContext, case: Case) -> None:
        cls: Any = getattr(item, "cls")  # noqa: B009
        if self.continuous is not cls:
            self.end_continuous(ctx)
            # The harness's worker is a spawned process: the class as imported.
            self.worker_view = self.fresh.get(cls)
            try:
                with self._as_worker(cls):
                    self.continuous_skip = _init_continuous(cls, ctx, case)
            except BaseException:
                self._out_of_step(cls, ctx.rank)  # its peers may hold a half-made group
                raise
            self.continuous = cls
        if self.continuous_skip is not None:
            raise _compat.skip_exception(self.continuous_skip)
        test_id = f"{cls.__module__}.{cls.__qualname__}.{item.name}"
        expecting = _expecting_failure(cls, item.name)
        try:
            with self._as_worker(cls):
                _compat.harness_run_continuous(cls, test_id)
        except SystemExit as exc:
            reason = _skip_message(exc.code)
            if reason is None:
                self._out_of_step(cls, ctx.rank)
                pytest.fail(
                    f"{item.name} called sys.exit({exc.code!r}) on rank {ctx.rank}", pytrace=False
                )
            raise _compat.skip_exception(reason) from None
        except (unittest.SkipTest, pytest.skip.Exception):
            raise
        except BaseException as exc:
            self._out_of_step(cls, ctx.rank)
            if expecting and isinstance(exc, Exception):
                pytest.xfail(f"expected failure: {type(exc).__name__}: {exc}")
            raise
        if expecting:
            _unexpected_success(ctx.rank)

    @contextlib.contextmanager
    def _as_worker(self, cls: type) -> Iterator[None]:
        """The continuous class as its harness's worker process sees it, for a while; the
        worker's changes are kept for its next test (the worker lives as long as the class)."""
        with child_view(cls, self.worker_view):
            try:
                yield
            finally:
                self.worker_view = ClassState.of(cls)

    def _out_of_step(self, cls: type, rank: int) -> None:
        """A test of a continuous class failed here: its peers may be in a collective this rank
        never joins, and the harness's answer (``poison_pill``: skip the rest of the class) loses
        the remaining tests. The pool is replaced instead; the next test starts a new group."""
        self.unfit = (
            f"failed on rank {rank} in MultiProcContinuousTest class {cls.__name__}: the class's "
            "process group may be out of step; its next test gets a new pool (and _init_pg)"
        )

    def end_continuous(self, ctx: RankContext) -> None:
        """Destroy the group a continuous class made in this rank (before another class)."""
        if self.continuous is None:
            return
        import torch.distributed as dist

        self.continuous = None
        self.worker_view = None
        self.worker_env.end()
        ctx.pg = None
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _bound(runner: SuiteRunner, item: pytest.Item, case: Case) -> Any:
    def runtest() -> None:
        runner.run(item, case)

    return runtest


def _init_continuous(cls: Any, ctx: RankContext, case: Case) -> str | None:
    """The harness's worker-loop start: the class's own ``_init_pg`` once; a skip code from it
    skips every test of the class (its reason is returned)."""
    import torch.distributed as dist

    cls.rank, cls.world_size = ctx.rank, case.world_size
    assert ctx.test is not None
    shared = Path(ctx.test.shared_dir)
    shared.mkdir(parents=True, exist_ok=True)
    try:
        _compat.harness_init_group(cls, ctx.rank, case.world_size, str(shared / "rdvz_file"))
    except SystemExit as exc:
        reason = _skip_message(exc.code)
        if reason is None:
            raise
        return reason
    ctx.pg = dist.group.WORLD if dist.is_initialized() else None
    return None


# -- MultiProcessTestCase ---------------------------------------------------------------------


def _run_spawned(
    item: pytest.Item, ctx: RankContext, fresh: ClassState | None, after_setup: Callable[[], None]
) -> None:
    cls: Any = getattr(item, "cls")  # noqa: B009
    name = item.name
    assert ctx.test is not None
    shared = Path(ctx.test.shared_dir)
    shared.mkdir(parents=True, exist_ok=True)
    parent = cls(name)
    started = _compat.harness_no_spawning(parent)
    handover = ParentEnv(ctx)  # the parent's setUp runs once: its environment is rank 0's
    with handover.setup():
        parent.setUp()
    after_setup()
    # A forked child has the parent's class; a spawned one imports it afresh.
    child = None if started and started[-1] == "fork" else fresh
    ours, theirs = Pipe()
    try:
        # What the parent's join_or_run wrapper hands to _check_return_codes: the key of its
        # return-code rules (the method as the instance saw it when it was made).
        method = getattr(parent, name)
        fn = getattr(method, "__wrapped__", method)
        source = _announce_exit(parent, fn)
        with _skip_reasons() as reasons, child_view(cls, child):
            code = _exit_code(
                lambda: _compat.harness_run_spawned(
                    cls,
                    ctx.rank,
                    name,
                    str(shared / "file_name"),
                    theirs,
                    fake_pg=getattr(parent, "fake_pg", False),
                )
            )
        if source:
            announce_exit(None, source)  # it lives: judged here, as the parent would
        error = _received(ours)
    finally:
        ours.close()
        theirs.close()
        _compat.print_stacks_on_fatal_signal(False)
        handover.finished()
        try:
            parent.tearDown()
        finally:
            with contextlib.suppress(OSError, AttributeError):
                os.remove(parent.file_name)  # the parent's own temp file, unused here
    _judge(parent, fn, ctx.rank, code, error, reasons)
    if _expecting_failure(cls, name):
        _unexpected_success(ctx.rank)


def _announce_exit(parent: Any, fn: Any) -> str:
    """A return-code rule that expects the rank to end with another code than 0 (NCCL's abort
    tests: ``-signal.SIGABRT``): the controller must know before the rank dies, and then
    judges its death as an expected exit (outcome/expectations.py). Returns its words."""
    unchecked, special = _compat.harness_return_code_rules(parent)
    code = special.get(fn, 0)
    if not code or fn in unchecked:
        return ""
    source = harness_source(fn, code)
    announce_exit(code, source)
    return source


def _expecting_failure(cls: type, name: str) -> bool:
    """``@unittest.expectedFailure`` on the method (or the class)."""
    method = getattr(cls, name, None)
    return bool(
        getattr(method, "__unittest_expecting_failure__", False)
        or getattr(cls, "__unittest_expecting_failure__", False)
    )


def _unexpected_success(rank: int) -> None:
    pytest.fail(
        f"unexpected success on rank {rank}: the test is marked @unittest.expectedFailure "
        "and passed",
        pytrace=False,
    )


def _exit_code(run: Any) -> int:
    try:
        run()
    except SystemExit as exc:
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _received(conn: Any) -> str:
    """What the rank's ``run_test`` sent through the pipe (the traceback of its error)."""
    with contextlib.suppress(EOFError, OSError):
        if conn.poll():
            return str(conn.recv())
    return ""


def _judge(parent: Any, fn: Any, rank: int, code: int, error: str, reasons: list[str]) -> None:
    """The parent's ``_check_return_codes`` for this rank's exit code."""
    if code == _compat.harness_error_code():
        if _expecting_failure(type(parent), getattr(fn, "__name__", "")):
            last = error.strip().splitlines()[-1] if error.strip() else ""
            pytest.xfail(f"expected failure: {last}")
        if not error:
            pytest.fail(f"rank {rank} exited with code {code} and sent no traceback", pytrace=False)
        failed = pytest.fail.Exception(f"{_exception_line(error)}\n\n{error}", pytrace=False)
        setattr(failed, CRASH_ATTR, _crash_site(error, fn))
        raise failed
    unchecked, special = _compat.harness_return_code_rules(parent)
    if fn in unchecked:
        return
    skip = _skip_message(code)
    if skip is not None:
        generic = _compat.harness_generic_skip_code()
        raise _compat.skip_exception(reasons[-1] if code == generic and reasons else skip)
    expected = special.get(fn, 0)
    if code != expected:
        pytest.fail(
            f"rank {rank} exited with code {code}, expected {expected} (the test, or code it "
            "called, ended the process with sys.exit)",
            pytrace=False,
        )


#: On the failure :func:`_judge` raises: (path, line, message) of the test's own line that
#: failed in the child's traceback (:meth:`SuiteRunner.pytest_runtest_makereport`).
CRASH_ATTR = "_distrank_crash_site"
_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line (?P<line>\d+), in ')


def _crash_site(error: str, fn: Any) -> tuple[str, int, str] | None:
    """Where the child's traceback left the test's own file last: the line a person reads
    first (the parent's own re-raise is no place to look). None when no frame is there."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return None
    own = os.path.realpath(code.co_filename)
    found = None
    for line in error.splitlines():
        frame = _FRAME.match(line)
        if frame and os.path.realpath(frame["path"]) == own:
            found = (frame["path"], int(frame["line"]))
    return None if found is None else (*found, _exception_line(error))


def _exception_line(text: str) -> str:
    """The first line of the exception in a formatted traceback (what the summary shows)."""
    lines = text.strip().splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line.startswith("  File ")), default=-1)
    for line in lines[last_frame + 1 :]:
        if line and not line[0].isspace():
            return line
    return lines[-1] if lines else ""


def _skip_message(code: object) -> str | None:
    """The message of PyTorch's skip exit code ``code``, or None."""
    return _compat.harness_skip_message(code)


class _HarnessLog(logging.Filter):
    """Reads what ``run_test`` logs before it exits (the parent only ever sees its exit code):
    keeps the reason of a ``unittest.SkipTest`` (exit code 86), and drops its "Caught exception"
    record, whose traceback is the failure report itself."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) == 3 and isinstance(args[2], unittest.SkipTest):
            self.reasons.append(str(args[2]))
            return False
        return not str(record.msg).startswith("Caught exception")


@contextlib.contextmanager
def _skip_reasons() -> Any:
    logger = logging.getLogger(_compat.HARNESS_MODULE)
    log = _HarnessLog()
    level = logger.level
    logger.addFilter(log)
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    try:
        yield log.reasons
    finally:
        logger.removeFilter(log)
        logger.setLevel(level)
