"""The replays' judgement, pure: the search for a polluter, its budget, and what it may conclude.

Runs in the controller (pool mode), called by :mod:`replay`, which runs the tests; no processes
here and no clock of its own (a fake runner and a fake clock test it: tests/unit/test_replay*.py).

A *run* is a sequence of tests on fresh ranks that ends with the suspect; its outcome is whether
the suspect failed (:class:`Run`). :func:`search` runs:

1. the test alone: it fails -> it fails alone on fresh ranks (see below);
2. it passes alone -> its pool's earlier tests, then the test: it passes -> did not reproduce;
3. it fails -> bisect the earlier tests: run half of the candidates then the test, keep the half
   that makes it fail (else the other half, unverified), down to one candidate, verified last:
   its polluter, or no single polluter.

What the runs can show, and so what a verdict may say (the properties of
tests/unit/test_replay_properties.py):

- **Never "the test's own".** That needs a run of the test alone on fresh ranks before any other
  test of the session ran: only then can nothing a test left outside the processes (a file, a
  server, an environment variable of the machine) be there. Every replay runs after the session's
  tests, so none is such a run: a failure alone says "not state in the ranks; earlier tests may
  have left files or other state outside the processes".
- **A polluter P** only from two runs of the history: P then the test failed, and the test alone
  passed (taking P away changed the outcome).
- **"Did not reproduce"** only from two runs: alone passed, and after all the earlier tests passed.
- **The budget is a bound** (:class:`Budget`): every deadline of a replay (a test's, a pool
  start's) is cut to the budget left; a run cut short by it has no outcome (not in the history);
  a suspect whose run in the session took longer than the budget left (a test that failed at its
  deadline) is not replayed. What the budget cannot cut: the few seconds after a deadline that
  end a test (its ranks' stacks, the failure grace) and stop its pool.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from ..options import REPLAY_BUDGET
from ..outcome.endgame import effective_timeout
from ..settings import Value
from .onetest.interrupts import interrupt_signal
from .pools.poolkey import PoolKey


class Unreachable(Exception):
    """A replay could not tell whether the test fails: it never ran (says why)."""


class BudgetSpent(Exception):
    """``--distrank-replay-budget`` is spent: no more runs (the current one has no outcome)."""


@dataclasses.dataclass(frozen=True)
class Suspect:
    """A distributed test that failed in a pool that had served other tests before it."""

    nodeid: str
    #: Its pool's key (shared, not isolated): the replays' pools are of the same kind.
    key: PoolKey
    #: The node ids its pool served before it, in order.
    before: tuple[str, ...]
    #: How long its (last) run in the session took, in seconds.
    seconds: float = 0.0


@dataclasses.dataclass
class Budget:
    """Seconds all replays of the session may take together (0: no limit)."""

    seconds: Value[float]
    clock: Callable[[], float] = time.monotonic
    started: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def left(self) -> float | None:
        """Seconds left (<= 0 when spent); None: no limit."""
        if not self.seconds.value:
            return None
        return self.seconds.value - (self.clock() - self.started)

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def cap(self, seconds: float) -> tuple[float, bool]:
        """A wait of ``seconds`` (<= 0: none) cut to the budget left, and whether it was cut;
        BudgetSpent when nothing is left."""
        left = self.left()
        if left is None:
            return seconds, False
        if left <= 0:
            raise BudgetSpent
        wanted = effective_timeout(seconds)
        if wanted is not None and wanted <= left:
            return seconds, False
        return left, True

    def cut(self, deadline: Value[float]) -> tuple[Value[float], bool]:
        """A replayed test's deadline cut to the budget left (its source then says so), and
        whether it was cut."""
        seconds, cut = self.cap(deadline.value)
        if not cut:
            return deadline, False
        return Value(seconds, f"{REPLAY_BUDGET.flag}: {seconds:.1f} s of the budget left"), True

    def covers(self, seconds: float) -> bool:
        """The budget left is at least ``seconds`` (always, without a limit)."""
        left = self.left()
        return left is None or seconds <= left

    def describe(self) -> str:
        """``budget of 300 s (--distrank-replay-budget, default)``: the value and its source."""
        source = self.seconds.source
        if not any(name in source for name in (REPLAY_BUDGET.flag, REPLAY_BUDGET.env)):
            source = f"{REPLAY_BUDGET.flag}, {source}"
        return f"budget of {self.seconds.value:g} s ({source})"


@dataclasses.dataclass(frozen=True)
class Run:
    """One replay that ran to its end: the tests before the suspect, and whether it failed."""

    before: tuple[str, ...]
    failed: bool


@dataclasses.dataclass
class Verdict:
    """What the replays of one suspect found, so far."""

    suspect: Suspect
    #: Replays started (the last may have no outcome: see ``stopped``).
    runs: int = 0
    seconds: float = 0.0
    #: The replays that ran to their end, in order: the verdict's only evidence.
    history: list[Run] = dataclasses.field(default_factory=list)
    #: "alone" (fails alone after the session), "flaky", "polluter", "unstable" (a polluter's
    #: evidence did not repeat), "no single polluter", or "" (the search did not end).
    kind: str = ""
    polluter: str = ""
    #: Why the search stopped early: the budget, a signal, a replay that could not run.
    stopped: str = ""
    candidates: tuple[str, ...] = ()

    @property
    def alone_passes(self) -> bool | None:
        """Whether the test passed alone on fresh ranks (None: not known)."""
        return next((not run.failed for run in self.history if not run.before), None)


#: Runs the tests in order on fresh ranks; True when the last one failed. Raises Unreachable,
#: or BudgetSpent when the budget cut the run short (no outcome).
Runner = Callable[[Sequence[str]], bool]


def search(verdict: Verdict, run: Runner, budget: Budget) -> None:
    """Replay ``verdict.suspect`` with ``run`` until the verdict is known or the budget spent.

    Fills ``verdict`` as it goes, so that what ran before an interrupt (re-raised) is kept.
    """
    suspect = verdict.suspect
    clock = budget.clock

    def fails(before: Sequence[str]) -> bool:
        if budget.spent():
            raise BudgetSpent
        verdict.runs += 1
        started = clock()
        try:
            failed = run([*before, suspect.nodeid])
        finally:
            verdict.seconds += clock() - started
        verdict.history.append(Run(tuple(before), failed))
        return failed

    candidates: list[str] = list(suspect.before)
    try:
        if not budget.covers(suspect.seconds):
            left = budget.left() or 0.0
            verdict.stopped = (
                f"not replayed: its run in the session took {suspect.seconds:.1f} s, more than "
                f"the {max(left, 0.0):.1f} s left of the {budget.describe()}"
            )
            return
        if fails([]):
            verdict.kind = "alone"
            return
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
            # One run of each step would blame an earlier test for a flaky one (a 1-in-2 flaky
            # test was blamed in 2 of 5 failing sessions): the two runs the blame rests on, the
            # test alone and after the polluter, run once more and must say the same.
            verdict.polluter = candidates[0]
            stable = not fails([]) and fails(candidates)
            verdict.kind = "polluter" if stable else "unstable"
        else:
            verdict.kind = "no single polluter"
            verdict.polluter = candidates[0]
    except BudgetSpent:
        runs = verdict.runs
        if runs > len(verdict.history):  # the budget ran out inside the last one
            verdict.stopped = f"{budget.describe()} spent during replay {runs}: no outcome"
        else:
            verdict.stopped = f"{budget.describe()} spent after {runs} replay{'s' * (runs != 1)}"
        verdict.candidates = tuple(candidates)
    except Unreachable as exc:
        verdict.stopped = f"replay {verdict.runs} could not run the test: {exc}"
        verdict.candidates = tuple(candidates)
    except KeyboardInterrupt as exc:
        # A signal (a CI cancel, Ctrl-C) stopped the session: no test is to blame.
        verdict.stopped = (
            f"replays interrupted by {interrupt_signal(exc)} during replay {verdict.runs}"
        )
        verdict.candidates = tuple(candidates)
        raise


def max_runs(earlier: int) -> int:
    """The most runs :func:`search` takes for a test with ``earlier`` tests before it (a
    polluter's two runs are repeated once each)."""
    return math.ceil(math.log2(earlier)) + 5 if earlier > 1 else 4


def short(nodeid: str) -> str:
    """A node id without its file: ``test_c``, ``TestX::test_c[2]``."""
    return nodeid.split("::", 1)[-1]


#: What a failure alone on fresh ranks shows, and what it cannot (see the module's docstring).
ALONE = (
    "fails alone on fresh ranks after the session too: not state in the ranks; earlier tests "
    "may have left files or other state outside the processes"
)


def verdict_lines(verdict: Verdict) -> list[str]:
    """The summary lines of one suspect: what it did, what the replays found, what they cost."""
    suspect = verdict.suspect
    count = len(suspect.before)
    earlier = f"{count} earlier test{'s' if count != 1 else ''}"
    parts = [f"{suspect.nodeid} fails after {earlier} of its pool"]
    test = short(suspect.nodeid)
    alone = verdict.alone_passes
    if alone is False:
        parts.append(ALONE)
    elif alone:
        parts.append("passes alone on fresh ranks")
    if verdict.kind == "flaky":
        parts.append(f"passes after the {earlier} too: did not reproduce (flaky?)")
    elif verdict.kind == "polluter":
        polluter = short(verdict.polluter)
        parts.append(
            f"polluter: {verdict.polluter} ({polluter} then {test} fails; {test} alone passes)"
        )
    elif verdict.kind == "unstable":
        polluter = short(verdict.polluter)
        parts.append(
            f"flaky: {test} alone and {polluter} then {test} did not give the same outcomes when "
            "run again, so no polluter is named"
        )
    elif verdict.kind == "no single polluter":
        parts.append(
            f"fails after the {earlier}, but the bisection found no single polluter "
            f"({short(verdict.polluter)} then {test} passes: it may take several earlier tests "
            "together)"
        )
    if verdict.stopped:
        stopped = verdict.stopped
        if verdict.candidates and alone:
            stopped += "; candidates left: " + ", ".join(short(c) for c in verdict.candidates)
        parts.append(stopped)
    runs = f"{verdict.runs} replay{'s' if verdict.runs != 1 else ''}"
    goal = " to find a polluter" if verdict.kind == "polluter" else ""
    return ["; ".join(parts), f"{runs}{goal}, {verdict.seconds:.1f} s"]
