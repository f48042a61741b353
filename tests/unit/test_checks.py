"""Unit tests of the checks after each test (outcome/checks.py): sequence numbers in step, a
collective only some ranks issued, reports from a process the test forked, forks left running
(their reports: tests/unit/test_reports.py).

End to end: tests/e2e/test_honest.py (test_unmatched_collective_fails_the_test_that_left_it,
test_reports_from_a_forked_test_process_are_not_credited).
"""

from __future__ import annotations

from pytest_distrank.outcome.checks import (
    foreign_crash,
    forked_crash,
    is_own,
    sequences_in_step,
    unmatched,
)
from pytest_distrank.outcome.records import Reports, RunTest

TEST = RunTest(index=4, nodeid="t.py::test_x", next_nodeid=None, shared_dir="")
GROUP = "the default group"


def _reports(pid: int, index: int = 4, nodeid: str = "t.py::test_x") -> Reports:
    return Reports(rank=1, index=index, nodeid=nodeid, pid=pid, reports=(), done=True)


def test_sequences_compare_as_increments_since_the_last_test() -> None:
    base = {0: {GROUP: 10}, 1: {GROUP: 7}}
    assert sequences_in_step({0: {GROUP: 12}, 1: {GROUP: 9}}, base)
    assert not sequences_in_step({0: {GROUP: 12}, 1: {GROUP: 8}}, base)
    # A group made during the test starts from 0 on each of its members.
    assert sequences_in_step({0: {GROUP: 10, "g1": 3}, 1: {GROUP: 7, "g1": 3}}, base)
    assert not sequences_in_step({0: {GROUP: 10, "g1": 3}, 1: {GROUP: 7, "g1": 2}}, base)


def test_a_collective_only_one_rank_issued_names_that_rank_and_group() -> None:
    counts = {0: {GROUP: (5, "gloo:all_reduce")}, 1: {GROUP: (4, "gloo:broadcast")}}
    assert unmatched(counts) == [
        (
            0,
            GROUP,
            "issued 1 more collective than its peers on the default group: an unmatched "
            "collective (its last: gloo:all_reduce)",
        )
    ]


def test_unmatched_collectives_counts_and_their_absence() -> None:
    counts = {0: {GROUP: (4, "")}, 1: {GROUP: (6, "")}, 2: {GROUP: (4, "")}}
    [(rank, _, crash)] = unmatched(counts)
    assert rank == 1
    assert crash.startswith("issued 2 more collectives than its peers")
    assert crash.endswith("(its last: unknown)")
    assert unmatched({0: {GROUP: (4, "")}, 1: {GROUP: (4, "")}}) == []


def test_only_the_ranks_own_reports_of_this_test_are_its_own() -> None:
    assert is_own(100, _reports(100), TEST)
    assert not is_own(100, _reports(101), TEST)
    assert not is_own(100, _reports(100, index=3), TEST)
    assert not is_own(100, _reports(100, nodeid="t.py::test_y"), TEST)


def test_reports_from_another_pid_name_the_fork() -> None:
    assert foreign_crash(100, 101, 4, TEST.nodeid, 4) == (
        "sent reports from pid 101, not its own (100): a process forked by the test?"
    )


def test_reports_of_another_test_say_which() -> None:
    assert foreign_crash(100, 100, 3, "t.py::test_w", 4) == (
        "sent reports for test #3 (t.py::test_w) while test #4 was running"
    )


def test_forks_left_running_the_ranks_code_are_named() -> None:
    assert forked_crash([11, 12]) == (
        "forked pid 11, 12 which still ran the rank's own code when the test ended: it "
        "returns into pytest and runs the rest of the test again"
    )
