"""Unit tests of a session's end on a signal (pool/interrupts.py, outcome/interrupted.py): the
test in flight gets a teardown report, and a test the signal interrupted names no rank "root
cause" unless one failed on its own first (a property over generated ranks). Signals during the
replays: tests/unit/test_replay.py; the real sessions: tests/e2e/test_report_files.py."""

from __future__ import annotations

import types
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pytest import TestReport

from pytest_distrank.outcome.endgame import Endgame, Position, Unfinished
from pytest_distrank.outcome.merge import merge_test
from pytest_distrank.outcome.reports import unfinished_report
from pytest_distrank.pool.onetest.interrupts import signal_interrupt, with_teardown

NODEID = "t.py::test_x"
LOC = ("t.py", 3, "test_x")


def report(outcome: str, when: str, longrepr: object = None) -> TestReport:
    return TestReport(NODEID, LOC, {}, outcome, longrepr, when)  # type: ignore[arg-type]


def test_the_interrupted_test_gets_a_teardown_report_that_says_it_did_not_run() -> None:
    """hostile-4 D8: pytest-html writes a test's row at its teardown report; the ranks of the
    test in flight were killed before theirs, so the controller adds one (passed: the failure is
    the call's), once."""
    reports = [report("passed", "setup"), report("failed", "call", "E boom")]
    out = with_teardown(reports, signal_interrupt(15))
    assert [(r.when, r.outcome) for r in out] == [
        ("setup", "passed"),
        ("call", "failed"),
        ("teardown", "passed"),
    ]
    assert out[-1].nodeid == NODEID and out[-1].location == LOC
    assert out[-1].sections == [
        ("distrank", "teardown not run: SIGTERM interrupted the session, its ranks were killed")
    ]
    assert with_teardown(out, signal_interrupt(15)) == out  # one teardown, never two


def merged_head(states: list[str], signal: int = 15) -> tuple[str, str]:
    """The merged call report of a test whose ranks ``states`` ("passed", "failed" on its own
    at 101 s, "interrupted": still running when the signal came at 105 s): its head line and
    crash line."""
    ranks = frozenset(range(len(states)))
    game = Endgame(ranks, 100.0, 300.0, 5.0, timeout_source="default")
    for rank, state in enumerate(states):
        if state == "failed":
            game.note_reports(rank, [report("failed", "call")], 101.0)
    game.note_interrupt(105.0, "SIGTERM" if signal == 15 else "SIGINT")
    per_rank: dict[int, list[TestReport]] = {}
    for rank, state in enumerate(states):
        reports = [report("passed", "setup")]
        if state == "interrupted":
            info = Unfinished(Position.in_phase("call"), "", f"r{rank}.log", "killed", game, 105.0)
            reports.append(unfinished_report(NODEID, LOC, "t.py", rank, len(states), info, 1.0))
        else:
            reports.append(report(state, "call", f"E   rank {rank} says no" if state else None))
            reports[-1].stop = 0.5
        reports.append(report("passed", "teardown"))
        per_rank[rank] = reports
    call = next(r for r in merge_test(per_rank, len(states)) if r.when == "call")
    text = str(call.longrepr)
    crash = call.longrepr.reprcrash.message  # type: ignore[union-attr]
    return text.splitlines()[0], crash


def test_every_rank_interrupted_the_same_way_names_no_root_cause() -> None:
    """The issue: a SIGTERM-interrupted test named rank 0 "root cause" though every rank was
    interrupted the same way. The head says the session was interrupted; the table where each
    rank was."""
    head, crash = merged_head(["interrupted"] * 3)
    assert head == (
        "distrank: the session was interrupted by SIGTERM while all 3 ranks were in the test: no "
        "rank failed, none is the root cause (where each was, below); shown: rank 0/3"
    )
    assert crash == "[all 3 ranks] Interrupted: still in call when SIGTERM came after 5.0 s"
    head, crash = merged_head(["passed", "interrupted", "passed"], signal=2)
    assert "by SIGINT while rank 1/3 was in the test: no rank failed" in head
    assert crash.startswith("[rank 1/3] Interrupted: ")


@given(st.lists(st.sampled_from(["passed", "failed", "interrupted"]), min_size=1, max_size=5))
def test_a_root_cause_only_when_a_rank_failed_before_the_signal(states: list[str]) -> None:
    """An interrupted test blames a rank only when a rank failed on its own before the signal
    came (the ranks still running are then collateral, and the root cause is one that failed);
    when every failed rank was only stopped by the signal, no rank is "root cause" and the head
    says the session was interrupted."""
    if states.count("passed") == len(states):
        return  # nothing failed: no failure report to read
    head, _ = merged_head(states)
    if "failed" in states:
        cause = head.split("root cause: ")[1]
        assert cause.startswith("rank ") and states[int(cause[5:].split("/")[0])] == "failed"
    else:
        assert "root cause:" not in head
        assert head.startswith("distrank: the session was interrupted by SIGTERM while ")


def test_failing_the_same_way_inside_pytest_or_the_plugin_names_no_place() -> None:
    """A failure raised from pytest's, pluggy's or the plugin's own frames (the leftover
    check's under --distrank-leftovers=fail) is located nowhere useful: the head names its kind
    only, never "at _manager.py:183"; one in the test's own file keeps its place."""
    from pytest_distrank._compat import ReprFileLocation
    from pytest_distrank.outcome.rootcause import same_way

    def failures(path: str) -> list[tuple[int, Any]]:
        crash = ReprFileLocation(path, 183, "LeftoverError: t.py::test_x left X set on rank 0")
        report = types.SimpleNamespace(longrepr=types.SimpleNamespace(reprcrash=crash))
        return [(rank, report) for rank in range(2)]

    inside = "/venv/lib/python3.11/site-packages/pluggy/_manager.py"
    assert same_way(failures(inside), 2) == "all 2 ranks failed the same way (LeftoverError)"
    own = "/x/pytest_distrank/pool/worker/leanphases.py"
    assert same_way(failures(own), 2) == "all 2 ranks failed the same way (LeftoverError)"
    assert same_way(failures("/home/u/tests/t.py"), 2) == (
        "all 2 ranks failed the same way (LeftoverError at t.py:183)"
    )
