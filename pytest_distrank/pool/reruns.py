"""pytest-rerunfailures for distributed tests: rerun as it reruns an ordinary test.

Runs in the controller (pool mode). rerunfailures' own ``pytest_runtest_protocol`` would run a
test in this process; the controller runs a distributed test on its ranks instead, and reruns it
there, on all its ranks as one unit. Every option of the installed rerunfailures decides as it
decides for an ordinary test, each part where its inputs are:

- in the rank that raised (:mod:`worker.rankreruns`): ``--only-rerun``, ``--rerun-except``, the
  marker's ``only_rerun=``/``rerun_except=`` and ``flaky(condition=...)``, which read the
  exception; the root-cause rank of each failed phase decides (the rank the merged report names,
  :func:`merge._root_cause`). A failure no rank raised (a crash, a hang, a pool that did not
  start) is judged here as rerunfailures judges a failure without an exception;
- here: whether rerunfailures acts on the test at all (``--rerun-exclude-path``, a count from
  ``--reruns``, ``--force-reruns``, ``--reruns-mode`` or ``flaky``), the count of attempts,
  ``--max-suite-reruns`` (the cap shared with ordinary tests), the delay and its backoff factor,
  and ``item.execution_count``, which rerunfailures' ``--fail-on-flaky`` reads at session end.

:func:`decide` is rerunfailures' rule for the reports of one attempt (16.7's), as pure logic.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pytest
from pytest import TestReport

from .. import _compat
from ..outcome.rootcause import root_cause
from .worker.rankreruns import VERDICT_ATTR

#: What becomes of one report of an attempt: logged as it is, logged as a rerun, or not logged
#: (a failed phase that did not match the condition while another did: rerunfailures shows the
#: matching one only).
Action = Literal["log", "rerun", "drop"]


@dataclasses.dataclass(frozen=True)
class Judged:
    """One report of an attempt, as rerunfailures' rule reads it."""

    when: str
    failed: bool
    xfail: bool = False
    #: The filters rule a rerun out for this failure (``_should_hard_fail_on_error``).
    hard_fail: bool = False
    #: ``flaky(condition=...)`` for this failure; None without a condition.
    condition: bool | None = None


def decide(
    reports: Sequence[Judged], execution_count: int, reruns: int, take_slot: Callable[[], bool]
) -> list[Action]:
    """rerunfailures' rule for the reports of one attempt (its ``pytest_runtest_protocol``).

    ``execution_count``: this attempt's number (1 for the first); ``reruns``: the reruns allowed;
    ``take_slot``: takes one rerun of the suite-wide cap, False when it is used up. The first
    failed report that may be rerun makes the attempt a rerun; later failed reports of the
    attempt are reruns too.
    """
    failures = [r for r in reports if r.failed]
    conditional = any(r.condition is not None for r in failures)
    condition = not conditional or any(r.condition for r in failures)
    hard_fail = any(r.hard_fail for r in failures)

    def matches(when: str) -> bool:
        return not conditional or any(r.condition for r in failures if r.when == when)

    actions: list[Action] = []
    rerun = False
    for report in reports:
        if rerun:
            actions.append("rerun" if report.failed else "log")
        elif condition and report.failed and not matches(report.when):
            actions.append("drop")
        elif (
            execution_count > reruns
            or not report.failed
            or report.xfail
            or hard_fail
            or not condition
            or not take_slot()
        ):
            actions.append("log")
        else:
            actions.append("rerun")
            rerun = True
    return actions


def backoff_delay(delay: float, factor: float, execution_count: int) -> float:
    """The pause before the next attempt after attempt ``execution_count`` (rerunfailures:
    ``delay * factor ** (execution_count - 1)``)."""
    return delay * factor ** (execution_count - 1)


#: Each failed phase's report from its root-cause rank, kept from the merge hook for the decision.
ROOT_CAUSES = pytest.StashKey[dict[str, TestReport]]()


def keep_root_causes(item: pytest.Item, per_rank: Mapping[int, Sequence[TestReport]]) -> None:
    """Keep, for each failed phase of the attempt, the report of its root-cause rank (the rank
    the merged report names first): its verdict decides."""
    failed: dict[str, list[tuple[int, TestReport]]] = {}
    for rank, reports in per_rank.items():
        for report in reports:
            if report.failed:
                failed.setdefault(report.when, []).append((rank, report))
    if failed:
        item.stash[ROOT_CAUSES] = {when: root_cause(f)[1] for when, f in failed.items()}


class Reruns:
    """rerunfailures' handling of one distributed test, attempt after attempt."""

    def __init__(self, item: pytest.Item, plugin: Any, reruns: int, done: int) -> None:
        self.item = item
        self.plugin = plugin
        self.reruns = reruns
        self.delay, self.factor = _compat.rerun_delay(plugin, item)
        #: Attempts made so far (rerunfailures' ``item.execution_count``; under pytest-xdist it
        #: starts at the attempts that crashed a worker).
        self.execution_count = done
        self._publish()

    def _publish(self) -> None:
        # rerunfailures' --fail-on-flaky reads it at session end (its pytest_sessionfinish).
        _compat.count_execution(self.item, self.execution_count)

    @property
    def exhausted(self) -> bool:
        """Every attempt was made already (pytest-xdist reran it after crashes): not run again."""
        return self.execution_count > self.reruns and self.execution_count > 0

    @property
    def may_rerun(self) -> bool:
        """The running attempt is not the last one allowed."""
        return self.execution_count <= self.reruns

    def begin(self) -> None:
        """A new attempt starts."""
        self.execution_count += 1
        self._publish()
        if ROOT_CAUSES in self.item.stash:
            del self.item.stash[ROOT_CAUSES]

    def judge(self, reports: list[TestReport]) -> tuple[list[TestReport], bool]:
        """The attempt's reports to log (reruns marked ``rerun``), and whether to rerun."""
        roots = self.item.stash.get(ROOT_CAUSES, {})
        judged = [self._judged(report, roots.get(report.when)) for report in reports]
        config = self.item.config
        actions = decide(
            judged, self.execution_count, self.reruns, lambda: _compat.take_suite_rerun(config)
        )
        out = []
        for report, action in zip(reports, actions, strict=True):
            _compat.mark_rerun(report, self.execution_count - 1)
            if action == "drop":
                continue
            if action == "rerun":
                report.outcome = "rerun"  # type: ignore[assignment]
            out.append(report)
        return out, "rerun" in actions

    def _judged(self, report: TestReport, root: TestReport | None) -> Judged:
        xfail = hasattr(report, "wasxfail")
        if not report.failed:
            return Judged(report.when, failed=False, xfail=xfail)
        verdict: dict[str, Any] | None = getattr(root, VERDICT_ATTR, None)
        if verdict is None:  # no rank raised it: judged as a failure without an exception
            hard = _compat.rerun_hard_fail(self.plugin, self.item, root or report, None)
            condition = _compat.rerun_condition(self.plugin, self.item, None)
        else:
            if verdict.get("error"):  # rerunfailures ends the session on such a condition
                pytest.fail(str(verdict["error"]), pytrace=False)
            hard, condition = bool(verdict["hard_fail"]), verdict.get("condition")
        return Judged(report.when, True, xfail, hard, condition)

    def pause(self) -> None:
        """Wait the delay before the next attempt."""
        time.sleep(backoff_delay(self.delay, self.factor, self.execution_count))


def reruns_for(item: pytest.Item) -> Reruns | None:
    """How rerunfailures handles ``item``; None where it leaves the test alone (not loaded, an
    excluded path, no count), as its own ``pytest_runtest_protocol`` does."""
    plugin = _compat.rerunfailures_plugin(item.config)
    if plugin is None or _compat.rerun_path_excluded(plugin, item):
        return None
    count = _compat.rerun_count(plugin, item)
    if count is None:
        return None
    if count and item.config.option.usepdb:
        raise pytest.UsageError("--reruns incompatible with --pdb")  # rerunfailures' words
    done = _compat.rerun_attempts_before(item.config, item.nodeid, count)
    return Reruns(item, plugin, count, done)
