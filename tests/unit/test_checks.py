"""Unit tests of the checks after each test (outcome/checks.py): sequence numbers in step, a
collective only some ranks issued, reports from a process the test forked, forks left running.

End to end: tests/e2e/test_honest.py (test_unmatched_collective_fails_the_test_that_left_it,
test_reports_from_a_forked_test_process_are_not_credited).
"""

from __future__ import annotations

import pytest

from pytest_distrank.outcome.checks import (
    foreign_report,
    forked_report,
    is_own,
    sequences_in_step,
    unmatched_collectives,
)
from pytest_distrank.outcome.merge import NOTE_ATTR
from pytest_distrank.outcome.records import Reports, RunTest

TEST = RunTest(index=4, nodeid="t.py::test_x", next_nodeid=None, shared_dir="")
WHERE = ("t.py", 3, "test_x")
GROUP = "the default group"


def _reports(pid: int, index: int = 4, nodeid: str = "t.py::test_x") -> Reports:
    return Reports(rank=1, index=index, nodeid=nodeid, pid=pid, reports=(), done=True)


def _note(report: pytest.TestReport) -> str:
    note = getattr(report, NOTE_ATTR)
    assert isinstance(note, str)
    return note


def test_sequences_compare_as_increments_since_the_last_test() -> None:
    base = {0: {GROUP: 10}, 1: {GROUP: 7}}
    assert sequences_in_step({0: {GROUP: 12}, 1: {GROUP: 9}}, base)
    assert not sequences_in_step({0: {GROUP: 12}, 1: {GROUP: 8}}, base)
    # A group made during the test starts from 0 on each of its members.
    assert sequences_in_step({0: {GROUP: 10, "g1": 3}, 1: {GROUP: 7, "g1": 3}}, base)
    assert not sequences_in_step({0: {GROUP: 10, "g1": 3}, 1: {GROUP: 7, "g1": 2}}, base)


def test_a_collective_only_one_rank_issued_fails_the_test_on_that_rank() -> None:
    counts = {0: {GROUP: (5, "gloo:all_reduce")}, 1: {GROUP: (4, "gloo:broadcast")}}
    [(rank, report, why)] = unmatched_collectives(counts, 2, TEST, WHERE)
    assert rank == 0
    assert report.failed and report.when == "call" and report.nodeid == TEST.nodeid
    assert _note(report) == (
        "issued 1 more collective than its peers on the default group: an unmatched "
        "collective (its last: gloo:all_reduce)"
    )
    assert report.longreprtext.startswith(f"rank 0/2 {_note(report)}\n")
    assert "The pool was replaced" in report.longreprtext
    assert why == "rank 0 left an unmatched collective on the default group in t.py::test_x"


def test_unmatched_collectives_counts_and_their_absence() -> None:
    counts = {0: {GROUP: (4, "")}, 1: {GROUP: (6, "")}, 2: {GROUP: (4, "")}}
    [(rank, report, _)] = unmatched_collectives(counts, 3, TEST, WHERE)
    assert rank == 1
    assert _note(report).startswith("issued 2 more collectives than its peers")
    assert _note(report).endswith("(its last: unknown)")
    in_step = {0: {GROUP: (4, "")}, 1: {GROUP: (4, "")}}
    assert unmatched_collectives(in_step, 2, TEST, WHERE) == []


def test_only_the_ranks_own_reports_of_this_test_are_its_own() -> None:
    assert is_own(100, _reports(100), TEST)
    assert not is_own(100, _reports(101), TEST)
    assert not is_own(100, _reports(100, index=3), TEST)
    assert not is_own(100, _reports(100, nodeid="t.py::test_y"), TEST)


def test_reports_from_another_pid_name_the_fork() -> None:
    report = foreign_report(1, 100, 2, _reports(101), TEST, WHERE)
    assert report.failed and report.nodeid == TEST.nodeid
    assert (
        _note(report)
        == "sent reports from pid 101, not its own (100): a process forked by the test?"
    )
    assert report.longreprtext.startswith(f"rank 1/2 {_note(report)}\n")
    assert "End such a child with os._exit()" in report.longreprtext


def test_reports_of_another_test_say_the_pipe_is_out_of_step() -> None:
    report = foreign_report(1, 100, 2, _reports(100, index=3, nodeid="t.py::test_w"), TEST, WHERE)
    assert _note(report) == "sent reports for test #3 (t.py::test_w) while test #4 was running"
    assert "out of step with the controller" in report.longreprtext


def test_forks_left_running_the_ranks_code_fail_the_test() -> None:
    report = forked_report(1, 2, [11, 12], TEST.nodeid, WHERE)
    assert report.failed and report.when == "call"
    assert _note(report) == (
        "forked pid 11, 12 which still ran the rank's own code when the test ended: it "
        "returns into pytest and runs the rest of the test again"
    )
    assert report.longreprtext.startswith(f"rank 1/2 {_note(report)}.\n")
    assert "The child was killed with the pool" in report.longreprtext
