"""Unit tests of outcome/reports.py: every report the plugin makes up, from plain values.

Each builder's outcome, phase, crash line, the head of its text and the attributes the merge reads
(note, collateral). The decisions that call them are tested where they are made (checks.py,
endgame.py, launch/gather.py); the wording end to end in tests/e2e/test_wording.py.
"""

from __future__ import annotations

from pytest import TestReport

from pytest_distrank.launch.channel import Forged, Malformed
from pytest_distrank.outcome.endgame import BEFORE_SETUP, Endgame, Position, Unfinished
from pytest_distrank.outcome.merge import COLLATERAL_ATTR, IN_TEST_ATTR, NOTE_ATTR, VERDICT_ATTR
from pytest_distrank.outcome.reports import (
    check_failure,
    crashed_report,
    error_reports,
    fill_passed,
    forged_report,
    forked_report,
    not_exited_report,
    passed_report,
    setup_error_report,
    silent_report,
    skipped_reports,
    stopped_report,
    synthesized_failure,
    unfinished_report,
    unmatched_report,
)

NODEID = "t.py::test_x"
LOC = ("t.py", 3, "test_x")


def _note(report: TestReport) -> str:
    note = getattr(report, NOTE_ATTR)
    assert isinstance(note, str)
    return note


def _crash(report: TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    assert crash is not None
    return str(crash.message)


def _head(report: TestReport) -> str:
    return report.longreprtext.splitlines()[0]


def test_a_synthesized_failure_carries_what_the_merge_reads() -> None:
    report = synthesized_failure(
        NODEID,
        LOC,
        "call",
        "crashed",
        "line 1\nline 2",
        note="n",
        collateral=True,
        stop=5.0,
        verdict="rank 1 is behind",
        in_test=True,
    )
    assert (report.outcome, report.when, report.nodeid, report.location) == (
        "failed",
        "call",
        NODEID,
        LOC,
    )
    assert _crash(report) == "crashed" and report.longreprtext.splitlines()[:2] == [
        "line 1",
        "line 2",
    ]
    assert (report.start, report.stop) == (5.0, 5.0)
    assert getattr(report, COLLATERAL_ATTR) is True
    assert getattr(report, IN_TEST_ATTR) is True
    assert getattr(report, VERDICT_ATTR) == "rank 1 is behind"
    plain = synthesized_failure(NODEID, LOC, "setup", "gone", "", note="")
    assert _head(plain) == "gone"  # no details: the crash line is the text
    assert not hasattr(plain, IN_TEST_ATTR) and not hasattr(plain, VERDICT_ATTR)


def test_a_passed_report_keeps_keywords_sections_and_times() -> None:
    report = passed_report(
        NODEID,
        LOC,
        "teardown",
        keywords=["test_x", "t.py"],
        sections=[("s", "c")],
        start=2.0,
        stop=3.0,
        duration=1.0,
    )
    assert (report.outcome, report.when, report.longrepr) == ("passed", "teardown", None)
    assert report.keywords == {"test_x": 1, "t.py": 1}
    assert report.sections == [("s", "c")]
    assert (report.duration, report.start, report.stop) == (1.0, 2.0, 3.0)
    assert report.user_properties == []


def test_fill_passed_adds_the_phases_before() -> None:
    reports: list[TestReport] = []
    fill_passed(reports, NODEID, LOC, "teardown")
    assert [(r.when, r.outcome) for r in reports] == [("setup", "passed"), ("call", "passed")]
    skipped = [TestReport(NODEID, LOC, {}, "skipped", ("t.py", 4, "Skipped: no"), "setup")]
    fill_passed(skipped, NODEID, LOC, "teardown")
    assert len(skipped) == 1  # no call phase after a skipped setup
    ended: list[TestReport] = []
    fill_passed(ended, NODEID, LOC, "end")
    assert [r.when for r in ended] == ["setup", "call", "teardown"]


def test_skipped_reports_in_both_modes_words() -> None:
    setup, teardown = skipped_reports(NODEID, LOC, "/abs/t.py", "GPU lease: busy")
    assert (setup.outcome, setup.when, teardown.outcome, teardown.when) == (
        "skipped",
        "setup",
        "passed",
        "teardown",
    )
    assert setup.longrepr == ("/abs/t.py", 4, "Skipped: GPU lease: busy")
    not_run, _ = skipped_reports(NODEID, LOC, LOC[0], "not run: rank 1 stuck")
    assert not_run.longrepr == ("t.py", 4, "Skipped: not run: rank 1 stuck")


def test_error_reports_take_the_first_line_as_the_summary() -> None:
    setup, teardown = error_reports(NODEID, LOC, "could not start the ranks\nTraceback ...")
    assert (setup.outcome, setup.when, teardown.when) == ("failed", "setup", "teardown")
    assert _crash(setup) == "could not start the ranks"
    assert _note(setup) == "error in setup"
    assert _head(setup) == "could not start the ranks"


def test_a_setup_error_takes_the_last_line_of_the_traceback() -> None:
    message = "rank 1: could not initialise the process group:\nTraceback\nRuntimeError: no"
    report = setup_error_report(NODEID, LOC, message, 7.0)
    assert (report.outcome, report.when, report.stop) == ("failed", "setup", 7.0)
    assert _crash(report) == "RuntimeError: no"
    assert _note(report) == "error in setup: RuntimeError: no"
    assert _crash(setup_error_report(NODEID, LOC, "", 0.0)) == "error in setup"


def test_a_failed_check_names_the_rank_then_says_more() -> None:
    report = check_failure(NODEID, LOC, 1, 2, "sent reports from pid 9", "Replaced.", 1.0)
    assert (report.outcome, report.when) == ("failed", "call")
    assert _note(report) == _crash(report) == "sent reports from pid 9"
    assert report.longreprtext.startswith("rank 1/2 sent reports from pid 9\nReplaced.")


def test_an_unmatched_collective_with_each_modes_words() -> None:
    crash = "issued 1 more collective than its peers on the default group: an unmatched"
    report = unmatched_report(NODEID, LOC, 0, 2, crash, "The pool was replaced.", 1.0)
    assert _note(report) == crash
    assert report.longreprtext.startswith(
        f"rank 0/2 {crash}\nA collective that not every member of the group issues stays "
        "pending and would be matched by the next test's collective. The pool was replaced."
    )


def test_forks_left_running_the_ranks_code_fail_the_test() -> None:
    report = forked_report(NODEID, LOC, 1, 2, [11, 12], "The rank killed it.", 1.0)
    assert (report.outcome, report.when) == ("failed", "call")
    assert _note(report) == (
        "forked pid 11, 12 which still ran the rank's own code when the test ended: it "
        "returns into pytest and runs the rest of the test again"
    )
    assert report.longreprtext.startswith(f"rank 1/2 {_note(report)}.\nEnd a child made with")
    assert "multiprocessing, which manages its children). The rank killed it." in (
        report.longreprtext
    )


def test_a_crashed_rank_shows_its_last_output_or_says_it_wrote_none() -> None:
    crash = "crashed in call with SIGSEGV"
    report = crashed_report(NODEID, LOC, "call", 1, 2, crash, "Fatal Python error", "r1.log", 1.0)
    assert _note(report) == _crash(report) == crash
    lines = report.longreprtext.splitlines()
    assert lines[:3] == [
        f"rank 1/2 {crash}.",
        "Its last output (with faulthandler's traceback, if any):",
        "Fatal Python error",
    ]
    assert "Its whole log: r1.log" in lines
    quiet = crashed_report(NODEID, LOC, "setup", 0, 2, crash, "  ", "r0.log", 1.0)
    assert quiet.when == "setup"
    assert quiet.longreprtext.splitlines()[1] == "It wrote nothing since the test started."


def test_a_stopped_rank_names_its_first_line_and_the_modes_words() -> None:
    message = "\n  Exit: leaving  \nmore"
    report = stopped_report(NODEID, LOC, "call", "in call", message, 1.0)
    assert _note(report) == _crash(report) == "stopped serving in call: Exit: leaving"
    assert report.longreprtext.splitlines()[-1] == "more"
    told = stopped_report(NODEID, LOC, "setup", "before its setup began", "", 1.0, "It ended.")
    assert _crash(told) == "stopped serving before its setup began: its pytest session ended"
    assert told.when == "setup" and told.longreprtext.splitlines()[-1] == "It ended."


def test_a_silent_rank_is_not_collateral() -> None:
    report = silent_report(NODEID, LOC, 2, 3, "r2.log", 1.0)
    assert (report.when, _crash(report)) == ("call", "no report from rank 2/3 in call")
    assert _note(report).startswith("sent neither its reports nor its stack")
    assert getattr(report, COLLATERAL_ATTR) is False
    assert _head(report).startswith("rank 2/3 sent neither its reports nor its stack in time")


def test_a_forged_or_malformed_payload_names_the_key_and_the_rank() -> None:
    forged = Forged("report/3/1", 1, "does not verify")
    report = forged_report(NODEID, LOC, 2, forged, 1.0)
    assert _crash(report) == "control store tampered with: 'report/3/1' does not verify"
    assert _head(report) == f"rank 1/2: {forged}."
    assert report.longreprtext.rstrip().endswith(f"could not be trusted. {Forged.advice}")
    bad = forged_report(NODEID, LOC, 2, Malformed("report/3/1", 1, "does not read"), 1.0)
    assert _crash(bad).startswith("malformed control payload: 'report/3/1'")


def test_a_rank_that_did_not_exit_as_expected() -> None:
    why = "was expected to exit by SIGKILL but finished the test"
    report = not_exited_report(NODEID, LOC, 1, 2, why, 1.0)
    assert _crash(report) == f"rank 1/2 {why}"
    assert _note(report) == f"did not exit: it {why}"
    assert report.longreprtext.splitlines()[:2] == [f"rank 1/2 {why}", f"(in {NODEID})"]


def _game(timeout: float) -> Endgame:
    return Endgame(frozenset({0, 1, 2}), 100.0, timeout, 2.0, timeout_source="marker")


def test_unfinished_report_says_where_the_rank_was() -> None:
    info = Unfinished(BEFORE_SETUP, "", "rank1.log", "killed", _game(4.0), 104.0, "it was stopped")
    rep = unfinished_report(NODEID, LOC, "t.py", 1, 3, info, 0.0)
    assert rep.failed and rep.when == "setup"
    assert _note(rep) == "timed out before its setup began after 4 s; it was stopped"
    assert _crash(rep) == "Timeout: its setup had not begun after 4 s (timeout from marker)"
    assert _head(rep) == f"rank 1/3: {_crash(rep)}"
    assert getattr(rep, IN_TEST_ATTR) is False


def test_unfinished_report_of_a_collateral_rank() -> None:
    g = _game(100.0)
    failed = TestReport(NODEID, LOC, {}, "failed", None, "call")
    g.note_reports(0, [failed], 101.0)
    info = Unfinished(Position.in_phase("call"), "", "r.log", "stuck", g, 103.5)
    rep = unfinished_report(NODEID, LOC, "t.py", 2, 3, info, 0.0)
    assert getattr(rep, COLLATERAL_ATTR) is True
    assert _note(rep).startswith("stuck in call 2.5 s after rank 0 failed; ")
    assert getattr(rep, IN_TEST_ATTR) is True
