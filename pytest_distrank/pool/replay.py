"""Order-dependent failures proven on fresh ranks: replay, then bisect for the polluter.

Runs in the controller (pool mode). While the session runs, :class:`Replays` remembers which
tests each pool served, in order (a pool replaced after a fault starts a new history), and keeps
a :class:`Suspect` for each distributed test that failed in a pool that had served other tests
before it. After the session's tests (the controller's ``pytest_runtestloop``, once the session's
pools have stopped), each suspect is replayed on fresh pools of its own, one sequence of tests per
pool, each test torn down for the next as in the session:

1. the test alone: it fails -> the failure is the test's own;
2. it passes alone -> its pool's earlier tests, then the test: it passes -> did not reproduce;
3. it fails -> bisect the earlier tests: run half of the candidates then the test, keep the half
   that makes it fail (else the other half, unverified), down to one candidate, verified last:
   its polluter, or no single polluter.

At most ``ceil(log2 N) + 3`` runs per suspect, all of them within ``--distrank-replay-budget``.
A replay is judged with :func:`~outcome.merge.merge_test` alone: its reports reach no hook of any
plugin (terminal, junit, reportlog, ``lastfailed``, rerun databases), the session's outcomes and
exit code stand, and the verdicts go to a summary section of their own. Under pytest-xdist each
worker replays its own suspects and hands its lines to the xdist controller
(``config.workeroutput``), which prints the section once.

:func:`search` and :func:`verdict_lines` are pure (a fake runner tests them); :class:`Replays`
starts the pools.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pytest
from pytest import TestReport

from ..outcome.expectations import item_expectations
from ..outcome.merge import merge_test
from ..settings import REPLAY, REPLAY_BUDGET, Value
from .gpus import GpuUnavailable
from .ownreports import deserializer
from .pool import Pool, PoolStartError, PoolUnfit
from .poolkey import PoolKey
from .poolset import START_TIMEOUT, STOP_TIMEOUT
from .stats import Stats

if TYPE_CHECKING:
    from .controller import Controller

#: The summary section's title.
TITLE = "distrank: order-dependent failures"
#: The key of the lines in pytest-xdist's ``workeroutput``.
WORKEROUTPUT_KEY = "distrank_replay_lines"


class Unreachable(Exception):
    """A replay could not tell whether the test fails: it never ran (says why)."""


class BudgetSpent(Exception):
    """``--distrank-replay-budget`` is spent: no more runs."""


@dataclasses.dataclass(frozen=True)
class Suspect:
    """A distributed test that failed in a pool that had served other tests before it."""

    nodeid: str
    #: Its pool's key (shared, not isolated): the replays' pools are of the same kind.
    key: PoolKey
    #: The node ids its pool served before it, in order.
    before: tuple[str, ...]


@dataclasses.dataclass
class Budget:
    """Seconds all replays of the session may take together (0: no limit)."""

    seconds: Value[float]
    clock: Callable[[], float] = time.monotonic
    started: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def spent(self) -> bool:
        return bool(self.seconds.value) and self.clock() - self.started >= self.seconds.value

    def describe(self) -> str:
        """``budget of 300 s (--distrank-replay-budget, default)``: the value and its source."""
        source = self.seconds.source
        if not any(name in source for name in (REPLAY_BUDGET.flag, REPLAY_BUDGET.env)):
            source = f"{REPLAY_BUDGET.flag}, {source}"
        return f"budget of {self.seconds.value:g} s ({source})"


@dataclasses.dataclass
class Verdict:
    """What the replays of one suspect found, so far."""

    suspect: Suspect
    runs: int = 0
    seconds: float = 0.0
    #: "own", "flaky", "polluter", "no single polluter", or "" (the search did not end).
    kind: str = ""
    polluter: str = ""
    #: Passes alone on fresh ranks (None: not known).
    alone_passes: bool | None = None
    #: Why the search stopped early: a spent budget, Ctrl-C, a replay that could not run.
    stopped: str = ""
    candidates: tuple[str, ...] = ()


#: Runs the tests in order on fresh ranks; True when the last one failed. Raises Unreachable.
Runner = Callable[[Sequence[str]], bool]


def search(verdict: Verdict, run: Runner, budget: Budget) -> None:
    """Replay ``verdict.suspect`` with ``run`` until the verdict is known or the budget spent.

    Fills ``verdict`` as it goes, so that what ran before a Ctrl-C (re-raised) is kept.
    """
    suspect = verdict.suspect
    test = suspect.nodeid
    clock = budget.clock

    def fails(nodeids: Sequence[str]) -> bool:
        if budget.spent():
            raise BudgetSpent
        verdict.runs += 1
        started = clock()
        try:
            return run([*nodeids, test])
        finally:
            verdict.seconds += clock() - started

    candidates: list[str] = list(suspect.before)
    try:
        if fails([]):
            verdict.kind, verdict.alone_passes = "own", False
            return
        verdict.alone_passes = True
        if not fails(candidates):
            verdict.kind = "flaky"
            return
        verified = len(candidates) == 1
        while len(candidates) > 1:
            half = len(candidates) // 2
            first, second = candidates[:half], candidates[half:]
            verified = fails(first)
            candidates = first if verified else second
        if verified or fails(candidates):
            verdict.kind, verdict.polluter = "polluter", candidates[0]
        else:
            verdict.kind = "no single polluter"
            verdict.polluter = candidates[0]
    except BudgetSpent:
        verdict.stopped = f"budget spent after {verdict.runs} runs"
        verdict.candidates = tuple(candidates)
    except Unreachable as exc:
        verdict.stopped = f"replay {verdict.runs} could not run the test: {exc}"
        verdict.candidates = tuple(candidates)
    except KeyboardInterrupt:
        verdict.stopped = f"interrupted (Ctrl-C) during replay {verdict.runs}"
        verdict.candidates = tuple(candidates)
        raise


def max_runs(earlier: int) -> int:
    """The most runs :func:`search` takes for a test with ``earlier`` tests before it."""
    return math.ceil(math.log2(earlier)) + 3 if earlier > 1 else 2


def short(nodeid: str) -> str:
    """A node id without its file: ``test_c``, ``TestX::test_c[2]``."""
    return nodeid.split("::", 1)[-1]


def verdict_lines(verdict: Verdict, budget: Budget | None = None) -> list[str]:
    """The summary lines of one suspect: what it did, what the replays found, what they cost."""
    suspect = verdict.suspect
    count = len(suspect.before)
    earlier = f"{count} earlier test{'s' if count != 1 else ''}"
    parts = [f"{suspect.nodeid} fails after {earlier} of its pool"]
    test = short(suspect.nodeid)
    if verdict.alone_passes is False:
        parts.append("fails alone on fresh ranks too: the failure is the test's own")
    elif verdict.alone_passes:
        parts.append("passes alone on fresh ranks")
    if verdict.kind == "flaky":
        parts.append(f"passes after the {earlier} too: did not reproduce (flaky?)")
    elif verdict.kind == "polluter":
        polluter = short(verdict.polluter)
        parts.append(
            f"polluter: {verdict.polluter} ({polluter} then {test} fails; {test} alone passes)"
        )
    elif verdict.kind == "no single polluter":
        parts.append(
            f"fails after the {earlier}, but no single polluter ({short(verdict.polluter)} "
            f"then {test} passes: it takes several earlier tests together)"
        )
    if verdict.stopped:
        stopped = verdict.stopped
        if stopped.startswith("budget") and budget is not None:
            stopped = f"{budget.describe()} spent after {verdict.runs} runs"
        if verdict.candidates and verdict.alone_passes:
            stopped += "; candidates left: " + ", ".join(short(c) for c in verdict.candidates)
        parts.append(stopped)
    runs = f"{verdict.runs} replay{'s' if verdict.runs != 1 else ''}"
    goal = " to find a polluter" if verdict.kind == "polluter" else ""
    return ["; ".join(parts), f"{runs}{goal}, {verdict.seconds:.1f} s"]


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

    def judge(self, item: pytest.Item, reports: Sequence[TestReport]) -> None:
        """The test's final reports: a failure after earlier tests of its pool is a suspect."""
        last, self.last = self.last, None
        if last is None or last[0] != item.nodeid or not any(r.failed for r in reports):
            return
        if refusal(self.replay, self.config.option) is not None:
            return
        _, key, count = last
        before = [i for i in self.history[key][1][:count] if i.nodeid != item.nodeid]
        if before:
            self.items.update((i.nodeid, i) for i in [*before, item])
            self.suspects.append(Suspect(item.nodeid, key, tuple(i.nodeid for i in before)))

    def run_all(self, controller: Controller) -> None:
        """Replay every suspect (after the session's pools stopped); Ctrl-C ends at once."""
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
        pools = controller.pools
        # Replay pools are not the session's: their starts stay out of its numbers.
        saved, pools.stats = pools.stats, Stats()
        try:
            for suspect in suspects:
                verdict = Verdict(suspect)
                try:
                    search(verdict, functools.partial(self._run, controller, suspect), budget)
                finally:
                    self.lines.extend(verdict_lines(verdict, budget))
        finally:
            pools.stats = saved
            self.items.clear()

    def _run(self, controller: Controller, suspect: Suspect, nodeids: Sequence[str]) -> bool:
        """Run ``nodeids`` in order on a fresh pool; whether the last one failed."""
        items = [self.items[nodeid] for nodeid in nodeids]
        controller.isolated += 1
        key = dataclasses.replace(suspect.key, isolated=controller.isolated)
        files = sorted({str(item.path) for item in items})
        timeout = max(START_TIMEOUT, *(self._timeout(controller, i).value for i in items))
        try:
            pool = controller.pools.get(key, list(dict.fromkeys(nodeids)), files, timeout)
        except (PoolStartError, GpuUnavailable) as exc:
            raise Unreachable(f"fresh ranks did not start: {exc}") from None
        controller.pools.live.pop(key, None)
        try:
            return self._sequence(controller, pool, items)
        except BaseException:
            pool.kill()  # Ctrl-C, a broken pool: no rank outlives it
            raise
        finally:
            pool.request_stop()
            pool.finish_stop(STOP_TIMEOUT)  # errors of a replay's teardown are not the session's

    def _sequence(self, controller: Controller, pool: Pool, items: list[pytest.Item]) -> bool:
        settings = controller.settings
        missing = sorted({r.rank for r in pool.ready for i in items if i.nodeid in r.missing})
        if missing:
            raise Unreachable(f"ranks {missing} did not collect every test to replay")
        failed = False
        for index, item in enumerate(items):
            last = index == len(items) - 1
            timeout = self._timeout(controller, item)
            test = controller._new_test(item, None if last else items[index + 1].nodeid)
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
            if last:
                failed = any(r.failed for r in merge_test(run.reports, pool.key.world_size))
            elif run.broken:
                raise Unreachable(f"{item.nodeid} broke its fresh pool: {run.broken}")
        return failed

    @staticmethod
    def _timeout(controller: Controller, item: pytest.Item) -> Value[float]:
        """The test's deadline, as in the session (settings.item_timeout)."""
        plan = controller.plan.get(item.nodeid) if controller.plan else None
        return plan.timeout if plan is not None and plan.timeout else controller.settings.timeout

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
