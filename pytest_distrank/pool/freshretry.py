"""A harness test that failed in a warm pool runs again at once on fresh ranks.

Runs in the controller (pool mode; :class:`controller.Controller` asks after each distributed
test). PyTorch's ``MultiProcessTestCase`` gives every test new processes: that is its contract,
and the warm pool is the plugin's own shortcut. So when such a test (kind ``spawn``, not a
``MultiProcContinuousTest``, whose processes live for the class) fails or crashes in a pool that
ran other tests before it, its outcome may be the warm pool's doing, which its harness would
never show. It runs again at once on a pool of its own, as its harness would run it:

- the fresh outcome stands; the warm failure stays in the report, as a section of its own
  (as pytest-rerunfailures keeps a ``RERUN``);
- when the fresh run passed, the class's remaining tests run on fresh ranks for the rest of the
  session, and the summary says why (``TestX: its tests run on fresh ranks from here on: ...``);
- when it failed again, the failure is the test's own under its harness's conditions (fresh
  processes, after the tests before it in the session, as the harness runs them too), and the
  class stays on its warm pool.

Bounded as the replays are: what the fresh runs take comes out of ``--distrank-replay-budget``
(the replays after the session get what is left), and a test whose warm run took longer than the
budget left is not run again (its report says so). Plugin tests keep their rule: the warm outcome
stands and the replays after the session explain it (:mod:`replay`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from pytest import TestReport

from ..settings import Value
from .onetest.interrupts import interrupt_signal
from .plan import Planned
from .suites import CASE

#: The section of the fresh run's report that keeps the warm failure.
SECTION = "distrank: the warm pool's failure (then run again on fresh ranks)"


@dataclasses.dataclass
class FreshRetry:
    """The controller's fresh retries of harness tests (one per session)."""

    budget: Value[float]
    #: Seconds the retries took so far (the replays after the session get the rest).
    spent: float = 0.0
    #: Classes whose remaining tests run on fresh ranks, by class.
    moved: dict[type, str] = dataclasses.field(default_factory=dict)
    #: The next isolated key's number for a moved test (negative, far below the plan's).
    next_isolated: int = -(10**6)

    def left(self) -> float:
        """Seconds of the budget left (inf: no limit)."""
        total = self.budget.value
        return float("inf") if total <= 0 else max(0.0, total - self.spent)

    def wanted(
        self, item: pytest.Item, reports: Sequence[TestReport], before: int, seconds: float
    ) -> str | None:
        """Why ``item`` runs again on fresh ranks ("") or not (a reason to say, or None when
        nothing is to be said): it failed after ``before`` other tests of its warm pool, and
        its run took ``seconds``."""
        case = item.stash.get(CASE, None)
        if case is None or case.kind != "spawn" or before < 1:
            return None
        if not any(r.failed for r in reports):
            return None
        if seconds > self.left():
            return (
                f"not run again on fresh ranks: its run took {seconds:.1f} s, more than the "
                f"{self.left():.1f} s left of --distrank-replay-budget ({self.budget.source})"
            )
        return ""

    def refused(self, reports: list[TestReport], why: str) -> list[TestReport]:
        """``reports``, each failed one saying why the test was not run again."""
        for report in reports:
            if report.failed:
                report.sections.append((SECTION, why))
        return reports

    def fresh_entry(self, entry: Planned, isolated: int) -> Planned:
        """The plan entry of the fresh run: a pool of its own, stopped after it, its deadline
        cut to the budget left."""
        assert entry.key is not None and entry.timeout is not None
        key = dataclasses.replace(entry.key, isolated=isolated)
        timeout = entry.timeout
        if self.left() < timeout.value:
            timeout = Value(
                self.left(), f"what is left of --distrank-replay-budget ({self.budget.source})"
            )
        return dataclasses.replace(entry, key=key, next_nodeid=None, timeout=timeout)

    def settle(
        self,
        item: pytest.Item,
        warm: Sequence[TestReport],
        fresh: list[TestReport],
        after: str,
        seconds: float,
        interrupted: BaseException | None = None,
    ) -> tuple[list[TestReport], str]:
        """The fresh run's reports (which took ``seconds``), keeping the warm failure, and the
        summary line when its class now moves to fresh ranks (:meth:`move`), else ""."""
        self.spent += seconds
        failed = [r for r in warm if r.failed]
        target = next((r for r in fresh if r.when == "call"), fresh[-1] if fresh else None)
        passed = not any(r.failed for r in fresh)
        if interrupted is not None:  # no outcome on fresh ranks: nothing is concluded
            text = "\n\n".join(f"{r.when}: {r.longreprtext}" for r in failed)
            text += (
                f"\n\n{item.name}'s run again on fresh ranks was interrupted by "
                f"{interrupt_signal(interrupted)}: no verdict"
            )
            passed = False
        elif passed:  # the warm failure in full: the only place it is shown
            text = "\n\n".join(f"{r.when}: {r.longreprtext}" for r in failed)
            text += (
                f"\n\n{item.name} passed on fresh ranks, as its harness runs it: the outcome is "
                "the fresh run's"
            )
        else:  # the report below is the fresh failure's
            text = (
                f"{item.name} failed in the warm pool ({_crash_line(failed)}) and on fresh ranks "
                "too: the failure is the test's own under its harness's conditions (fresh "
                "processes, after the tests before it in the session)"
            )
        if target is not None:
            target.sections.append((SECTION, text))
        cls = getattr(item, "cls", None)
        if not passed or interrupted is not None or not isinstance(cls, type) or cls in self.moved:
            return fresh, ""
        self.moved[cls] = (
            f"{cls.__name__}: its tests run on fresh ranks from here on: {item.name} failed "
            f"in a warm pool after {after} ({_crash_line(failed)}) and passed on fresh ranks"
        )
        return fresh, self.moved[cls]

    def move(self, items: Sequence[pytest.Item], plan: dict[str, Planned], first: int) -> None:
        """Give the remaining tests (from index ``first``) of every moved class a pool each:
        each gets an isolated key of its own (negative, far below the plan's), and a warm test
        whose next test of its pool moved now points past it."""
        moved = {
            item.nodeid
            for item in items[first:]
            if getattr(item, "cls", None) in self.moved
            and (entry := plan.get(item.nodeid)) is not None
            and entry.key is not None
            and not entry.key.isolated
        }
        if not moved:
            return
        for entry in plan.values():
            while entry.next_nodeid in moved:
                entry.next_nodeid = plan[entry.next_nodeid].next_nodeid
        for nodeid in sorted(moved):
            entry = plan[nodeid]
            assert entry.key is not None
            self.next_isolated -= 1
            entry.key = dataclasses.replace(entry.key, isolated=self.next_isolated)
            entry.next_nodeid = None


def _crash_line(failed: Sequence[TestReport]) -> str:
    """The first failure's crash line, short."""
    for report in failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = str(getattr(crash, "message", "") or report.longreprtext).strip()
        if message:
            first = message.splitlines()[0]
            return first if len(first) <= 160 else first[:157] + "..."
    return "no message"
