"""Unit tests of the end-of-test rule (endgame.py), shared by pool mode and launcher mode."""

from __future__ import annotations

import math

from pytest import TestReport

from pytest_distrank.outcome.endgame import (
    BEFORE_SETUP,
    FINISH_WAIT,
    FOREVER,
    MAX_WAIT,
    Endgame,
    Position,
    Unfinished,
    clamp_wait,
    effective_timeout,
    failed_itself,
    fill_passed,
    grace_trigger,
    unfinished_report,
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


def test_unfinished_report_says_where_the_rank_was() -> None:
    g = game(timeout=4.0)
    info = Unfinished(BEFORE_SETUP, "", "rank1.log", "killed", g, 104.0, "it was stopped")
    rep = unfinished_report("t.py::test_x", LOC, "t.py", 1, 3, info, 0.0)
    assert rep.failed and rep.when == "setup"
    assert rep.distrank_note == "timed out before its setup began after 4 s; it was stopped"
    assert "Timeout: its setup had not begun after 4 s (timeout from marker)" in str(rep.longrepr)


def test_unfinished_report_of_a_collateral_rank() -> None:
    g = game(timeout=100.0)
    g.note_reports(0, [report("failed")], 101.0)
    info = Unfinished(Position.in_phase("call"), "", "r.log", "stuck", g, 103.5)
    rep = unfinished_report("t.py::test_x", LOC, "t.py", 2, 3, info, 0.0)
    assert rep.distrank_collateral
    assert rep.distrank_note.startswith("stuck in call 2.5 s after rank 0 failed; ")


def test_fill_passed_adds_the_phases_before() -> None:
    reports: list[TestReport] = []
    fill_passed(reports, "t.py::test_x", LOC, "teardown")
    assert [(r.when, r.outcome) for r in reports] == [("setup", "passed"), ("call", "passed")]
    skipped = [report("skipped", "setup")]
    fill_passed(skipped, "t.py::test_x", LOC, "teardown")
    assert len(skipped) == 1


def test_sequences_compared_as_increments_since_the_last_test() -> None:
    from pytest_distrank.outcome.checks import sequences_in_step

    base = {0: {"the default group": 5}, 1: {"the default group": 3}}  # p2p earlier on rank 0
    assert sequences_in_step({0: {"the default group": 7}, 1: {"the default group": 5}}, base)
    assert not sequences_in_step({0: {"the default group": 8}, 1: {"the default group": 5}}, base)
    # A group created during the test, on its members only.
    assert sequences_in_step({0: {"g": 2}, 1: {"g": 2}, 2: {}}, {})


def test_unmatched_collectives_name_the_rank_with_more() -> None:
    from pytest_distrank.outcome.checks import unmatched_collectives
    from pytest_distrank.outcome.records import RunTest

    counts = {0: {"the default group": (3, "gloo:all_reduce")}, 1: {"the default group": (2, "")}}
    test = RunTest(1, "t.py::test_x", None, "")
    found = unmatched_collectives(counts, 2, test, LOC)
    assert [(rank, why) for rank, _, why in found] == [
        (0, "rank 0 left an unmatched collective on the default group in t.py::test_x")
    ]
    assert found[0][1].distrank_note == (
        "issued 1 more collective than its peers on the default group: an unmatched "
        "collective (its last: gloo:all_reduce)"
    )
    same = {0: {"the default group": (2, "x")}, 1: {"the default group": (2, "x")}}
    assert unmatched_collectives(same, 2, test, LOC) == []
