"""Unit tests of the merged failure report's text (outcome/merge.py): the per-rank table, the
root cause, repeated tracebacks, cut messages, plain-text failures and the per-rank junit
properties. The end-to-end tests (tests/e2e/test_outcomes.py, test_wording.py) check that real
ranks get there; the wording itself is checked here, on reports built by hand.
"""

from __future__ import annotations

from typing import Literal

from pytest import TestReport

from pytest_distrank._compat import ExceptionChainRepr, ReprFileLocation, ReprTracebackNative
from pytest_distrank.outcome.merge import CRASH_LIMIT, STORY_LIMIT, annotate, merge_test

NODEID = "test_x.py::test_x"
LOCATION = ("test_x.py", 3, "test_x")
When = Literal["setup", "call", "teardown"]


def ok(when: When = "call", duration: float = 0.25) -> TestReport:
    return TestReport(NODEID, LOCATION, {}, "passed", None, when, duration=duration)


def failed(message: str, traceback: str, *, when: When = "call", stop: float = 1.0) -> TestReport:
    """A failure as a rank sends it: pytest's traceback text and its crash line."""
    lines = [line + "\n" for line in traceback.splitlines()]
    crash = ReprFileLocation("test_x.py", 5, message)
    longrepr = ExceptionChainRepr([(ReprTracebackNative(lines), crash, None)])
    return TestReport(NODEID, LOCATION, {}, "failed", longrepr, when, start=0.0, stop=stop)


def traceback_of(rank: int, error: str) -> str:
    """pytest's traceback of the test, with its argument line (it differs on every rank)."""
    return (
        f"rank = {rank}\n\n"
        "    @pytest.mark.world_size(2)\n"
        "    def test_x(rank):\n"
        f">       raise {error}\n"
        f"E       {error}\n\n"
        "test_x.py:5: RuntimeError"
    )


def text(report: TestReport) -> str:
    return str(report.longrepr)


def crash_line(report: TestReport) -> str:
    """The line ``-ra`` and junit's ``message=`` show."""
    assert isinstance(report.longrepr, ExceptionChainRepr)
    assert report.longrepr.reprcrash is not None
    return report.longrepr.reprcrash.message


def test_the_table_names_every_rank_and_the_root_cause() -> None:
    error = 'AssertionError("rank 1 disagrees")'
    bad = failed("AssertionError: rank 1 disagrees", traceback_of(1, error))
    merged = merge_test({0: [ok("setup"), ok()], 1: [ok("setup"), bad]}, 2)
    assert [(r.when, r.outcome) for r in merged] == [("setup", "passed"), ("call", "failed")]
    lines = text(merged[1]).splitlines()
    assert lines[:4] == [
        "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
        "  rank 0/2  passed",
        "  rank 1/2  failed in call: AssertionError: rank 1 disagrees  <- root cause",
        "---------- traceback of rank 1/2 ----------",
    ]
    assert 'E       AssertionError("rank 1 disagrees")' in lines
    # -ra's line and junit's message= name the rank.
    assert crash_line(merged[1]) == "[rank 1/2] AssertionError: rank 1 disagrees"


def test_every_failing_rank_shows_its_own_traceback() -> None:
    per_rank = {
        rank: [
            ok("setup"),
            failed(
                f"ValueError: bad value on {rank}",
                traceback_of(rank, f"ValueError('bad value on {rank}')"),
                stop=1.0 + rank,
            ),
        ]
        for rank in range(3)
    }
    merged = merge_test(per_rank, 3)[1]
    report = text(merged)
    # The same exception type at the same line on every rank: said, not one rank picked.
    assert report.startswith(
        "distrank: all 3 ranks failed the same way (ValueError at test_x.py:5); shown: rank 0/3\n"
    )
    assert "  rank 0/3  failed in call: ValueError: bad value on 0  <- shown\n" in report
    assert crash_line(merged) == "[all 3 ranks] ValueError: bad value on 0"
    for rank in range(3):
        assert f"  rank {rank}/3  failed in call: ValueError: bad value on {rank}" in report
        assert f"E       ValueError('bad value on {rank}')" in report
    for rank in (1, 2):
        assert f"traceback of rank {rank}/3" in report
    assert "the same as" not in report


def test_tracebacks_that_differ_only_in_their_arguments_are_shown_once() -> None:
    error = 'RuntimeError("the same on every rank")'
    per_rank = {
        rank: [
            ok("setup"),
            failed(
                "RuntimeError: the same on every rank",
                traceback_of(rank, error),
                stop=1.0 + rank,
            ),
        ]
        for rank in range(2)
    }
    report = text(merge_test(per_rank, 2)[1])
    assert report.startswith("distrank: all 2 ranks failed the same way (RuntimeError at ")
    assert "traceback of rank 1/2" in report
    assert "the same as rank 0/2" in report
    assert report.count(f"raise {error}") == 1


def test_a_huge_message_is_cut_in_the_table_and_the_crash_line() -> None:
    message = "ValueError: " + "x" * 2_000_000
    huge = failed(message, traceback_of(1, "ValueError(huge)") + "\nE   " + message)
    merged = merge_test({0: [ok("setup"), ok()], 1: [ok("setup"), huge]}, 2)
    rows = [line for line in text(merged[1]).splitlines() if line.startswith("  rank 1/2  ")]
    assert len(rows) == 1 and len(rows[0]) < 400
    assert len(rows[0]) == len("  rank 1/2  ") + STORY_LIMIT + len("  <- root cause")
    assert rows[0].endswith("x…  <- root cause")
    crash = crash_line(merged[1])
    assert crash.startswith("[rank 1/2] ValueError: xxx")
    assert len(crash) == len("[rank 1/2] ") + CRASH_LIMIT and crash.endswith("…")
    # The traceback below the table still has it whole, as pytest shows it.
    assert message in text(merged[1])


#: A fixture lookup error as it reaches the controller: pytest's text, not an exception repr.
MISSING_FIXTURE = """\
file /src/project/test_x.py, line 3
  @pytest.mark.world_size(2)
  def test_x(rank, no_such_fixture):
E       fixture 'no_such_fixture' not found
>       available fixtures: backend, capfd, dist_store, pg, rank, world_size
>       use 'pytest --fixtures [testpath]' for help on them.

/src/project/test_x.py:3"""


def test_a_plain_text_failure_row_names_what_went_wrong() -> None:
    def lookup_error() -> TestReport:
        return TestReport(NODEID, LOCATION, {}, "failed", MISSING_FIXTURE, "setup")

    merged = merge_test({0: [lookup_error()], 1: [lookup_error()]}, 2)
    assert [(r.when, r.outcome) for r in merged] == [("setup", "failed")]
    report = text(merged[0])
    assert (
        "  rank 0/2  failed in setup: fixture 'no_such_fixture' not found  <- root cause" in report
    )
    assert "  rank 1/2  failed in setup: fixture 'no_such_fixture' not found\n" in report
    assert "the same as rank 0/2" in report
    # The text gets a crash line, so that -ra and junit's message= name the rank too.
    assert crash_line(merged[0]) == "[rank 0/2] file /src/project/test_x.py, line 3"


def test_a_strict_xpass_is_a_failure_naming_the_rank() -> None:
    def xpass() -> TestReport:
        return TestReport(NODEID, LOCATION, {}, "failed", "[XPASS(strict)] fixed now", "call")

    merged = merge_test({0: [ok("setup"), xpass()], 1: [ok("setup"), xpass()]}, 2)
    assert "  rank 0/2  failed in call: [XPASS(strict)] fixed now  <- root cause" in text(merged[1])
    assert crash_line(merged[1]) == "[rank 0/2] [XPASS(strict)] fixed now"


def test_annotate_gives_a_property_per_rank_and_the_rerun_command() -> None:
    per_rank = {
        0: [ok("setup", 0.5), ok("call", 1.0), ok("teardown", 0.25)],
        1: [ok("setup", 0.5), ok("call", 1.0), ok("teardown", 0.25)],
        2: [ok("setup", 0.5), failed("assert 2 != 2", "E   assert 2 != 2", stop=2.0)],
    }
    merged = merge_test(per_rank, 3)
    rerun = "cd /src/project && pytest -p distrank 'test_x.py::test_x[a b]'"
    annotate(merged, per_rank, 3, [101, 102, 103], rerun)
    properties = dict(merged[-1].user_properties)
    assert list(properties) == ["distrank rank 0/3", "distrank rank 1/3", "distrank rank 2/3"]
    assert properties["distrank rank 0/3"] == "passed; 1.750 s; pid 101"
    assert str(properties["distrank rank 2/3"]).startswith("failed in call: assert 2 != 2; ")
    assert str(properties["distrank rank 2/3"]).endswith(" s; pid 103")
    failures = [r for r in merged if r.failed]
    assert len(failures) == 1
    longrepr = failures[0].longrepr
    assert isinstance(longrepr, ExceptionChainRepr)
    sections = longrepr.sections
    assert ("distrank: rerun just this test", rerun, "-") in sections
    # A pid the pool does not know reads "?".
    annotate(merged, per_rank, 3, [101], rerun)
    assert str(dict(merged[-1].user_properties)["distrank rank 2/3"]).endswith("pid ?")


def test_the_collective_verdict_decides_the_root_cause_of_a_hang() -> None:
    """Issue 28: rank 2 finished without entering the all_reduce ranks 0 and 1 wait in; the
    head, the arrow and the crash line (``-ra``, junit's message=) blame rank 2, not rank 0."""
    from pytest_distrank.outcome.reports import synthesized_failure
    from pytest_distrank.outcome.rootcause import CAUSE_ATTR, UNFINISHED_ATTR

    cause = (
        (2,),
        "rank 2/3",
        "never entered all_reduce #2 on the default group (ranks 0, 1 wait in it)",
    )

    def waited(rank: int) -> TestReport:
        crash = "Timeout: still in call after 10 s (timeout from marker)"
        note = (
            "waited in all_reduce #2 on the default group for rank 2; timed out in call after 10 s"
        )
        report = synthesized_failure(
            NODEID, LOCATION, "call", crash, f"rank {rank}/3: {crash}", note=note, collateral=True
        )
        setattr(report, UNFINISHED_ATTR, True)
        setattr(report, CAUSE_ATTR, cause)
        return report

    per_rank = {0: [ok("setup"), waited(0)], 1: [ok("setup"), waited(1)], 2: [ok("setup"), ok()]}
    merged = merge_test(per_rank, 3)[1]
    lines = text(merged).splitlines()
    assert lines[0] == (
        "distrank: 2 of 3 ranks failed; root cause: rank 2/3 never entered all_reduce #2 on the "
        "default group (ranks 0, 1 wait in it)"
    )
    assert lines[3] == "  rank 2/3  passed  <- root cause"
    assert "<- root cause" not in lines[1] + lines[2]
    assert lines[4] == "---------- traceback of rank 0/3 ----------"  # the root has none
    assert crash_line(merged) == (
        "[rank 2/3] never entered all_reduce #2 on the default group (ranks 0, 1 wait in it); "
        "Timeout: still in call after 10 s (timeout from marker)"
    )
    # A rank that failed on its own still decides: the verdict only explains a hang.
    own = failed("ValueError: rank 1", traceback_of(1, "ValueError('rank 1')"))
    mixed = merge_test({**per_rank, 1: [ok("setup"), own]}, 3)[1]
    assert crash_line(mixed) == "[rank 1/3] ValueError: rank 1"
