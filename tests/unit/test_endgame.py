"""Unit tests of the end-of-test rule (endgame.py), shared by pool mode and launcher mode."""

from __future__ import annotations

import math

from pytest import TestReport

from pytest_distrank.outcome.endgame import (
    FINISH_WAIT,
    FOREVER,
    MAX_WAIT,
    Endgame,
    clamp_wait,
    effective_timeout,
    failed_itself,
    grace_trigger,
)

LOC = ("t.py", 3, "test_x")


def report(outcome: str, when: str = "call", **attrs: object) -> TestReport:
    longrepr = ("t.py", 4, "Skipped: no") if outcome == "skipped" else None
    rep = TestReport("t.py::test_x", LOC, {}, outcome, longrepr, when)  # type: ignore[arg-type]
    for name, value in attrs.items():
        setattr(rep, name, value)
    return rep


def game(timeout: float = 10.0, grace: float = 2.0) -> Endgame:
    return Endgame(frozenset({0, 1, 2}), 100.0, timeout, grace, timeout_source="marker")


def test_only_reports_finish_a_rank() -> None:
    g = game()
    g.note_reports(0, [report("passed", "setup"), report("passed")], 101.0)
    assert g.pending == {0, 1, 2}  # reports, but not the last batch
    g.note_finished(0)
    assert g.pending == {1, 2}


def test_deadline_ends_the_wait() -> None:
    g = game(timeout=10.0)
    assert not g.expired(109.9)
    assert g.expired(110.0)
    assert g.seconds_left(105.0) == 5.0


def test_failure_starts_the_grace_period() -> None:
    g = game(timeout=100.0, grace=2.0)
    g.note_reports(1, [report("failed")], 103.0)
    assert g.trigger == "rank 1 failed"
    assert g.limit() == 105.0
    assert g.expired(105.0)  # ranks 0 and 2 did not fail themselves: no finishing extension
    assert g.is_collateral(0) and not g.is_collateral(1)


def test_only_self_failed_ranks_left_get_the_finish_wait_once() -> None:
    g = game(timeout=100.0, grace=2.0)
    for rank in (0, 1, 2):
        g.note_reports(rank, [report("failed")], 103.0)
    g.note_finished(0)
    assert not g.expired(105.0)  # 1 and 2 failed themselves and are tearing down
    assert g.limit() == 105.0 + FINISH_WAIT
    assert g.expired(105.0 + FINISH_WAIT)


def test_finish_wait_never_passes_the_deadline() -> None:
    g = game(timeout=5.0, grace=2.0)
    g.note_reports(1, [report("failed")], 104.0)
    g.note_finished(0)
    g.note_finished(2)
    assert g.limit() == 105.0
    assert g.expired(105.0)


def test_a_skip_starts_the_grace_an_xfail_and_a_subtest_do_not() -> None:
    assert grace_trigger(report("skipped")) == "skipped"
    assert grace_trigger(report("skipped", wasxfail="flaky")) is None
    sub = report("failed")
    sub.__class__ = type("SubtestReport", (TestReport,), {})
    sub.context = object()  # type: ignore[attr-defined]
    assert grace_trigger(sub) is None
    assert grace_trigger(report("failed")) == "failed"


def test_an_early_message_counts_as_the_report_it_announces() -> None:
    g = game(timeout=100.0, grace=2.0)
    g.note_trigger(2, "skipped", 101.0)
    g.note_trigger(1, "failed", 102.0)
    assert g.trigger == "rank 2 skipped"  # the first one starts the grace
    assert g.failed == {1}
    assert g.limit() == 103.0


def test_failed_itself_ignores_subtests() -> None:
    sub = report("failed")
    sub.__class__ = type("SubtestReport", (TestReport,), {})
    sub.context = object()  # type: ignore[attr-defined]
    assert not failed_itself([report("passed", "setup"), sub])
    assert failed_itself([report("passed", "setup"), report("failed")])


def test_a_lost_rank_is_not_waited_for_and_not_finished() -> None:
    g = game()
    g.note_lost(2, "crashed", 101.0)
    assert g.pending == {0, 1}
    assert 2 not in g.finished
    assert g.trigger == "rank 2 crashed"


def test_huge_and_odd_timeouts_mean_no_deadline() -> None:
    for value in (0.0, -1.0, math.inf, math.nan, 10.0**7 * 365, FOREVER):
        assert effective_timeout(value) is None, value
    assert effective_timeout(3.0) == 3.0
    assert Endgame(frozenset({0}), 0.0, math.inf, 1.0).deadline is None
    assert clamp_wait(1e300) == MAX_WAIT < 24.8 * 86400  # poll() takes int milliseconds
    assert clamp_wait(-5.0) == 0.0
    assert clamp_wait(None) is None


def test_sequences_compared_as_increments_since_the_last_test() -> None:
    from pytest_distrank.outcome.checks import sequences_in_step

    base = {0: {"the default group": 5}, 1: {"the default group": 3}}  # p2p earlier on rank 0
    assert sequences_in_step({0: {"the default group": 7}, 1: {"the default group": 5}}, base)
    assert not sequences_in_step({0: {"the default group": 8}, 1: {"the default group": 5}}, base)
    # A group created during the test, on its members only.
    assert sequences_in_step({0: {"g": 2}, 1: {"g": 2}, 2: {}}, {})
