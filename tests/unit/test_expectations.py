"""Unit tests of expected deaths (outcome/expectations.py): the marker, the judging, the words."""

from __future__ import annotations

import signal

import pytest

from pytest_distrank.outcome.expectations import (
    ExpectationError,
    ExpectedExit,
    from_markers,
    harness_source,
    met_note,
    parse_signal,
    survived,
    unmet_death,
)


def mark(*args: object, **kwargs: object) -> pytest.Mark:
    return pytest.mark.expect_rank_exit(*args, **kwargs).mark


def test_a_signal_by_name_or_number() -> None:
    assert parse_signal("SIGKILL", "m") == signal.SIGKILL
    assert parse_signal("kill", "m") == signal.SIGKILL
    assert parse_signal(int(signal.SIGTERM), "m") == signal.SIGTERM
    with pytest.raises(ExpectationError, match=r"m: signal 'SIGNOPE' is not a signal"):
        parse_signal("SIGNOPE", "m")


def test_the_marker_states_one_expectation_per_rank() -> None:
    got = from_markers([mark(rank=(1, 2), signal="SIGKILL"), mark(0, exit_code=3)], 4)
    assert got[1] == ExpectedExit(1, -9, "", got[1].source)
    assert got[1].source == "@pytest.mark.expect_rank_exit(rank=(1, 2), signal='SIGKILL')"
    assert got[0].code == 3 and got[0].words() == "exit with code 3"
    assert got[2].words() == "exit by SIGKILL"
    assert from_markers([mark(rank=1, match="boom")], 2)[1].words() == (
        "exit with output matching 'boom'"
    )


@pytest.mark.parametrize(
    ("marks", "error"),
    [
        ([mark(rank=2)], r"rank 2 is not a rank of this test's world of 2 \(0 to 1\)"),
        ([mark()], "which rank"),
        ([mark(rank=1, signal="SIGKILL", exit_code=3)], "contradict each other"),
        ([mark(rank=1, exit_code=300)], "exit_code=300 is not an exit code"),
        ([mark(rank=1, signal="NOPE")], "signal 'NOPE' is not a signal"),
        ([mark(rank=1, match="(")], "is no regular expression"),
        ([mark(rank=1, when="call")], "unknown keyword 'when'"),
        (
            [mark(rank=1, signal="SIGKILL"), mark(rank=1, exit_code=3)],
            "contradict each other for rank 1",
        ),
    ],
)
def test_bad_markers_name_the_marker_and_the_value(marks: list[pytest.Mark], error: str) -> None:
    with pytest.raises(ExpectationError, match=error) as info:
        from_markers(marks, 2)
    assert "@pytest.mark.expect_rank_exit(" in str(info.value)


def test_the_same_expectation_twice_is_one() -> None:
    assert list(from_markers([mark(rank=1), mark(rank=1)], 2)) == [1]


def test_judging_a_death() -> None:
    kill = ExpectedExit(1, -9, "", "M")
    assert unmet_death(kill, -9, "") is None
    assert unmet_death(kill, -11, "") == "was expected to exit by SIGKILL (M), not SIGSEGV(-11)"
    assert unmet_death(ExpectedExit(1, None, "", "M"), 7, "") is None
    code = ExpectedExit(1, 3, "", "M")
    assert unmet_death(code, 3, "") is None
    assert "not exit code 4" in str(unmet_death(code, 4, ""))
    matching = ExpectedExit(1, None, r"boom \d", "M")
    assert unmet_death(matching, -6, "a\nboom 3\n") is None
    why = unmet_death(matching, -6, "boom 3\n" + "x\n" * 60)  # only the last 50 lines count
    assert why == (
        "printed nothing matching 'boom \\\\d' in its last 50 lines of output (M expects it with "
        "the SIGABRT(-6) it exited with); match= reads the rank's log, and output pytest captured "
        "dies with the rank: only under -s does all of it reach the log"
    )  # one "but" in the crash line ("crashed ..., but it printed nothing ..."), no "as expected"
    assert met_note(kill, -9) == "exited as expected: SIGKILL(-9) (M)"


def test_a_survivor_is_told_what_to_do() -> None:
    text = survived(ExpectedExit(1, -9, "", "M"), "finished the test")
    assert text.startswith("was expected to exit by SIGKILL (M) but finished the test")
    assert "drop the expectation" in text


def test_a_harness_rule_is_named() -> None:
    def test_abort() -> None: ...

    assert harness_source(test_abort, -6).endswith("test_abort ends with -6")
