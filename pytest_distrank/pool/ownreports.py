"""The controller's own share of a test's reports, beside what its ranks send.

Runs in the controller (pool mode). A rank's plain passing phase travels as a tuple and is rebuilt
here from the controller's own item; why a test's ranks did not collect it is worded here (the
error report itself, like every made-up report, is :mod:`outcome.reports`'); the controller's own
fixtures (those of ordinary tests) are torn down here when a distributed test ends a module, as
pytest's teardown phase would. A pool's start is charged to the setup of the first test it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pytest
from pytest import CallInfo, TestReport

from .. import _compat
from ..outcome.records import PassedPhase
from ..outcome.reports import passed_report

if TYPE_CHECKING:
    from .pools.pool import Pool


def rebuild_passed(
    item: pytest.Item, data: PassedPhase, keywords: Iterable[str] | None = None
) -> TestReport:
    """The TestReport a rank's pytest made for a plain passing phase (protocol.compact_passed),
    built from this process's item as ``TestReport.from_item_and_call`` builds it
    (``keywords``: the item's, read once for all the test's reports)."""
    outcome, when, duration, start, stop = data
    if outcome != "passed" or when not in ("setup", "call", "teardown"):
        raise ValueError(f"not a passing phase: {data!r}")
    return passed_report(
        item.nodeid,
        item.location,
        when,
        keywords=item.keywords if keywords is None else keywords,
        duration=duration,
        start=start,
        stop=stop,
    )


def deserializer(item: pytest.Item) -> Callable[[Any], TestReport]:
    """Rebuild a rank's report: pytest's own hook, or (a plain pass) from the item."""
    config = item.config
    keywords: list[str] = []  # the item's keywords, read at the first plain pass (a walk)

    def deserialize(data: dict[str, Any] | PassedPhase) -> TestReport:
        if isinstance(data, tuple):
            if not keywords:
                keywords.extend(item.keywords)
            return rebuild_passed(item, data, keywords)
        report = config.hook.pytest_report_from_serializable(config=config, data=data)
        assert isinstance(report, TestReport)
        return report

    return deserialize


def missing_message(item: pytest.Item, pool: Pool, missing: list[int]) -> str:
    """Ranks of ``pool`` did not collect ``item``: why that happens, and their collection errors."""
    errors = sorted({e for r in pool.ready if r.rank in missing for e in r.collect_errors})
    ranks = ", ".join(str(r) for r in missing)
    text = (
        f"{item.nodeid}: rank(s) {ranks} of {pool.key.world_size} did not collect this test, "
        "so collection differs between the controller and its ranks (a conftest.py or "
        "collection hook that behaves differently inside ranks, e.g. reading RANK)."
    )
    if errors:
        text += "\nCollection errors in the ranks:\n" + "\n".join(errors)
    return text


def teardown_controller_side(
    item: pytest.Item, nextitem: pytest.Item | None, reports: list[TestReport]
) -> list[TestReport]:
    """Keep the controller's own SetupState in step: tear down what ``nextitem`` won't need.

    Fixtures of ordinary tests live here; a distributed test between two modules must close
    the first module's, as pytest's own teardown phase would.
    """
    session = item.session
    call = CallInfo.from_call(lambda: _compat.teardown_exact(session, nextitem), "teardown")
    if call.excinfo is None:
        return reports
    # Built directly, not through pytest_runtest_makereport: plugins' makereport hooks expect
    # their own runtest_protocol to have run for the item (pytest-rerunfailures does).
    report = TestReport.from_item_and_call(item, call)
    last = reports[-1] if reports and reports[-1].when == "teardown" else None
    if last is None or last.passed:
        return [*(reports[:-1] if last is not None else reports), report]
    # The ranks' teardown failed too: keep that report and add the controller's error to it.
    add_section = getattr(last.longrepr, "addsection", None)
    if add_section is not None:
        add_section("controller-side teardown (ordinary tests' fixtures)", str(report.longrepr))
    return reports


def charge_pool_start(merged: list[TestReport], pool: Pool) -> None:
    """The pool's start, charged once to the setup of the test that waited for it: stored
    durations (pytest-split's ``--store-durations``, junit's ``time``) then add up to a shard's
    wall time, as a fixture's set-up time would."""
    setup = next((r for r in merged if r.when == "setup"), None)
    if setup is None or not pool.uncharged:
        return
    setup.duration += pool.uncharged
    setup.start -= pool.uncharged
    pool.uncharged = 0.0
