"""Order-dependent failures proven on fresh ranks: replay, then bisect for the polluter.

Runs in the controller (pool mode). While the session runs, :class:`Replays` remembers which
tests each pool served, in order (a pool replaced after a fault starts a new history), and keeps
a :class:`~replaysearch.Suspect` for each distributed test that failed in a pool that had served
other tests before it. After the session's tests (the controller's ``pytest_runtestloop``, once
the session's pools have stopped), each suspect is replayed on fresh pools of its own, one
sequence of tests per pool, each test torn down for the next as in the session. Which sequences,
what they may conclude and the budget's bound: :mod:`replaysearch` (pure).

A replay is judged with :func:`~outcome.merge.merge_test` alone: its reports reach no hook of any
plugin (terminal, junit, reportlog, ``lastfailed``, rerun databases), the session's outcomes and
exit code stand, and the verdicts go to a summary section of their own. A signal during the
replays (SIGTERM, SIGINT, SIGHUP) ends them at once: the section says so, blaming no test, and
the session ends as interrupted (exit code 2). Under pytest-xdist each worker replays its own
suspects and hands its lines to the xdist controller (``config.workeroutput``), which prints the
section once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Protocol

import pytest
from pytest import TestReport

from ..options import REPLAY
from ..outcome.expectations import item_expectations
from ..outcome.merge import merge_test
from ..outcome.records import RunTest
from ..settings import Settings, Value
from .ownreports import deserializer
from .pools.gpus import GpuUnavailable
from .pools.pool import Pool, PoolStartError, PoolUnfit
from .pools.poolkey import PoolKey
from .pools.poolset import START_TIMEOUT, STOP_TIMEOUT, PoolSet
from .pools.stats import Stats
from .replaysearch import Budget, BudgetSpent, Suspect, Unreachable, Verdict, search, verdict_lines

#: The summary section's title.
TITLE = "distrank: order-dependent failures"
#: The key of the lines in pytest-xdist's ``workeroutput``.
WORKEROUTPUT_KEY = "distrank_replay_lines"


class Session(Protocol):
    """What the replays use of the session (the controller hands itself in)."""

    settings: Settings
    pools: PoolSet

    def new_test(self, item: pytest.Item, next_nodeid: str | None) -> RunTest:
        """The message that runs ``item`` on its ranks."""

    def timeout_of(self, item: pytest.Item) -> Value[float]:
        """The test's deadline, as in the session."""

    def isolate(self, key: PoolKey) -> PoolKey:
        """A key of its own: the pool started for it serves nothing else."""


def refusal(replay: Value[bool], option: Any) -> str | None:
    """Why this session replays no failure (None: it does), from ``config.option``."""
    if not replay.value:
        return f"{REPLAY.flag} is off ({replay.source})"
    if getattr(option, "maxfail", 0):
        return "the session stops at a failure (-x, --exitfirst or --maxfail)"
    if getattr(option, "usepdb", False) or getattr(option, "trace", False):
        return "a debugger is on (--pdb or --trace)"
    return None


@dataclasses.dataclass(eq=False)  # a plugin: pytest 8.0 keeps plugins in sets
class Replays:
    """The controller's replays: histories of pools, suspects, verdicts (a pytest plugin)."""

    config: pytest.Config
    replay: Value[bool]
    budget: Value[float]
    #: Per shared pool key: the id of its live pool and the items it served, in order.
    history: dict[PoolKey, tuple[int, list[pytest.Item]]] = dataclasses.field(default_factory=dict)
    #: The last test served: its node id, pool key and how many tests its pool served before.
    last: tuple[str, PoolKey, int] | None = None
    suspects: list[Suspect] = dataclasses.field(default_factory=list)
    #: The items by node id, of every test a suspect's replays run.
    items: dict[str, pytest.Item] = dataclasses.field(default_factory=dict)
    #: The section's lines (under pytest-xdist, the workers' too).
    lines: list[str] = dataclasses.field(default_factory=list)

    def served(self, pool: Pool, key: PoolKey, item: pytest.Item) -> None:
        """``pool`` (of ``key``) ran ``item``: remember it in its history."""
        if key.isolated:
            self.last = None
            return
        pool_id, items = self.history.get(key, (0, []))
        if pool_id != pool.id:
            pool_id, items = pool.id, []
            self.history[key] = (pool_id, items)
        self.last = (item.nodeid, key, len(items))
        items.append(item)

    def judge(self, item: pytest.Item, reports: Sequence[TestReport], seconds: float) -> None:
        """The test's final reports (its last run took ``seconds``): a failure after earlier
        tests of its pool is a suspect."""
        last, self.last = self.last, None
        if last is None or last[0] != item.nodeid or not any(r.failed for r in reports):
            return
        if refusal(self.replay, self.config.option) is not None:
            return
        _, key, count = last
        before = [i for i in self.history[key][1][:count] if i.nodeid != item.nodeid]
        if before:
            self.items.update((i.nodeid, i) for i in [*before, item])
            nodeids = tuple(i.nodeid for i in before)
            self.suspects.append(Suspect(item.nodeid, key, nodeids, seconds))

    def run_all(self, session: Session, spent: float) -> None:
        """Replay every suspect (after the session's pools stopped); a signal ends at once.
        ``spent``: the seconds of the budget the harness tests' fresh retries took."""
        suspects, self.suspects = self.suspects, []
        if not suspects:
            return
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        # Not in pytest's quiet modes: they write the line's "[100%]" after this loop.
        if reporter is not None and self.config.get_verbosity() > 0:
            tests = f"{len(suspects)} failed test{'s' if len(suspects) > 1 else ''}"
            reporter.write_line(
                f"distrank: replaying {tests} on fresh ranks, to tell whether they fail because "
                f"of earlier tests ({REPLAY.flag}=off to skip)"
            )
        budget = Budget(self.budget)
        budget.started -= spent
        pools = session.pools
        # Replay pools are not the session's: their starts stay out of its numbers.
        saved, pools.stats = pools.stats, Stats()
        try:
            for suspect in suspects:
                verdict = Verdict(suspect)
                try:
                    run = functools.partial(self._run, session, suspect, budget)
                    search(verdict, run, budget)
                finally:
                    self.lines.extend(verdict_lines(verdict))
        finally:
            pools.stats = saved
            self.items.clear()

    def _run(
        self, session: Session, suspect: Suspect, budget: Budget, nodeids: Sequence[str]
    ) -> bool:
        """Run ``nodeids`` in order on a fresh pool; whether the last one failed."""
        items = [self.items[nodeid] for nodeid in nodeids]
        key = session.isolate(suspect.key)
        files = sorted({str(item.path) for item in items})
        start, _ = budget.cap(max(START_TIMEOUT, *(session.timeout_of(i).value for i in items)))
        try:
            pool = session.pools.start_apart(key, list(dict.fromkeys(nodeids)), files, start)
        except (PoolStartError, GpuUnavailable) as exc:
            if budget.spent():
                raise BudgetSpent from None
            raise Unreachable(f"fresh ranks did not start: {exc}") from None
        try:
            return self._sequence(session, pool, items, budget)
        except BaseException:
            pool.kill()  # a signal, a broken pool, the budget: no rank outlives it
            raise
        finally:
            pool.request_stop()
            pool.finish_stop(STOP_TIMEOUT)  # errors of a replay's teardown are not the session's

    def _sequence(
        self, session: Session, pool: Pool, items: list[pytest.Item], budget: Budget
    ) -> bool:
        settings = session.settings
        missing = sorted({r.rank for r in pool.ready for i in items if i.nodeid in r.missing})
        if missing:
            raise Unreachable(f"ranks {missing} did not collect every test to replay")
        failed = False
        for index, item in enumerate(items):
            last = index == len(items) - 1
            timeout, cut = budget.cut(session.timeout_of(item))
            test = session.new_test(item, None if last else items[index + 1].nodeid)
            try:
                run = pool.run(
                    test,
                    item.location,
                    str(item.path),
                    deserializer(item),
                    timeout.value,
                    timeout.source,
                    settings.failure_grace.value,
                    end_deadlocks=settings.deadlocks.value == "end",
                    expected=item_expectations(item, pool.key.world_size),
                )
            except PoolUnfit as exc:
                raise Unreachable(str(exc)) from None
            if run.interrupted is not None:
                raise run.interrupted  # the session's end, not the test's doing
            if cut and budget.spent():
                raise BudgetSpent  # ended by the budget, not by its own deadline: no outcome
            if last:
                failed = any(r.failed for r in merge_test(run.reports, pool.key.world_size))
            elif run.broken:
                raise Unreachable(f"{item.nodeid} broke its fresh pool: {run.broken}")
        return failed

    # -- the summary section, and pytest-xdist's workers --------------------------------------

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        output = getattr(self.config, "workeroutput", None)
        if output is not None and self.lines:
            output[WORKEROUTPUT_KEY] = list(self.lines)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist's controller: a worker's replay lines, printed once here."""
        output = getattr(node, "workeroutput", None)
        if isinstance(output, dict):
            self.lines.extend(output.get(WORKEROUTPUT_KEY, ()))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.lines and not hasattr(self.config, "workerinput"):
            terminalreporter.write_sep("=", TITLE)
            for line in self.lines:
                terminalreporter.write_line(line)
