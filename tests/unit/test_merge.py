"""Unit tests of the merge policy (merge.py): pure logic over pytest's report objects."""

from __future__ import annotations

from collections.abc import Sequence

from pytest import TestReport

from pytest_distrank._compat import ExceptionChainRepr
from pytest_distrank.outcome.merge import merge_test, rank_story
from pytest_distrank.outcome.reports import synthesized_failure

LOCATION = ("test_x.py", 3, "test_x")


def report(when: str, outcome: str, *, stop: float = 1.0, **extra: object) -> TestReport:
    longrepr: object = None
    if outcome == "failed":
        longrepr = synthesized_failure(
            "test_x.py::test_x", LOCATION, when, f"boom {stop}", "tb", note=""
        ).longrepr
    if outcome == "skipped":
        longrepr = ("test_x.py", 4, f"Skipped: {extra.pop('reason', 'nope')}")
    rep = TestReport(
        "test_x.py::test_x",
        LOCATION,
        {},
        outcome,  # type: ignore[arg-type]
        longrepr,  # type: ignore[arg-type]
        when,  # type: ignore[arg-type]
        sections=extra.pop("sections", ()),  # type: ignore[arg-type]
        duration=stop,
        start=0.0,
        stop=stop,
    )
    for key, value in extra.items():
        setattr(rep, key, value)
    return rep


def passed() -> list[TestReport]:
    return [report("setup", "passed"), report("call", "passed"), report("teardown", "passed")]


def outcomes(reports: Sequence[TestReport]) -> list[tuple[str, str]]:
    return [(r.when, r.outcome) for r in reports]


def test_all_passed_is_passed_with_the_longest_duration() -> None:
    slow = passed()
    slow[1].duration = 5.0
    merged = merge_test({0: passed(), 1: slow}, 2)
    assert outcomes(merged) == [("setup", "passed"), ("call", "passed"), ("teardown", "passed")]
    assert merged[1].duration == 5.0


def test_any_failed_call_is_failed_naming_the_first_rank() -> None:
    late = [
        report("setup", "passed"),
        report("call", "failed", stop=9.0),
        report("teardown", "passed"),
    ]
    early = [
        report("setup", "passed"),
        report("call", "failed", stop=2.0),
        report("teardown", "passed"),
    ]
    merged = merge_test({0: late, 1: early, 2: passed()}, 3)
    assert outcomes(merged) == [("setup", "passed"), ("call", "failed"), ("teardown", "passed")]
    longrepr = merged[1].longrepr
    assert isinstance(longrepr, ExceptionChainRepr)
    assert longrepr.reprcrash is not None
    assert longrepr.reprcrash.message == "[rank 1/3] boom 2.0"
    text = str(longrepr)
    assert "root cause: rank 1/3" in text
    assert "rank 2/3  passed" in text
    assert "traceback of rank 0/3" in text


def test_merging_leaves_the_ranks_reports_as_they_came() -> None:
    """Brief A46 item 7: the table went into the root cause's own report, so a second merge of
    the same reports (launcher mode checks a sub-world's result, then reports it) showed two."""
    failing = [report("setup", "passed"), report("call", "failed"), report("teardown", "passed")]
    per_rank = {0: passed(), 1: failing}
    before = str(failing[1].longrepr)
    first = str(merge_test(per_rank, 2)[1].longrepr)
    assert str(failing[1].longrepr) == before
    assert str(merge_test(per_rank, 2)[1].longrepr) == first
    assert first.count("distrank: 1 of 2 ranks failed") == 1


def test_collateral_ranks_are_never_the_root_cause() -> None:
    killed = synthesized_failure(
        "test_x.py::test_x",
        LOCATION,
        "call",
        "killed",
        "tb",
        note="killed",
        collateral=True,
        stop=0.5,
    )
    own = [report("setup", "passed"), report("call", "failed", stop=3.0)]
    merged = merge_test({0: [report("setup", "passed"), killed], 1: own}, 2)
    assert "root cause: rank 1/2" in str(merged[1].longrepr)
    assert "1 of 2 ranks failed, 1 killed after it" in str(merged[1].longrepr)


def test_a_hangs_verdict_stands_under_the_summary_line() -> None:
    killed = synthesized_failure(
        "test_x.py::test_x",
        LOCATION,
        "call",
        "killed",
        "tb",
        note="killed; in barrier #1 on the default group",
        collateral=True,
        stop=0.5,
        verdict="rank 0 waits in barrier #1 on the default group; rank 1 never entered it",
    )
    own = [report("setup", "passed"), report("call", "failed", stop=3.0)]
    merged = merge_test({0: [report("setup", "passed"), killed], 1: own}, 2)
    lines = str(merged[1].longrepr).splitlines()
    assert lines[0] == "distrank: 1 of 2 ranks failed, 1 killed after it; root cause: rank 1/2"
    assert lines[1] == (
        "collectives: rank 0 waits in barrier #1 on the default group; rank 1 never entered it"
    )
    assert lines[2].startswith("  rank 0/2  killed; in barrier #1 on the default group")


def test_setup_error_wins_over_everything() -> None:
    broken = [report("setup", "failed"), report("teardown", "passed")]
    merged = merge_test({0: broken, 1: passed()}, 2)
    assert outcomes(merged) == [("setup", "failed"), ("teardown", "passed")]


def test_skip_on_all_ranks_keeps_the_reason() -> None:
    skipped = [report("setup", "skipped", reason="no data"), report("teardown", "passed")]
    merged = merge_test({0: skipped, 1: list(skipped)}, 2)
    assert outcomes(merged) == [("setup", "skipped"), ("teardown", "passed")]
    assert merged[0].longrepr == ("test_x.py", 4, "Skipped: no data")


def test_skip_on_some_ranks_names_them() -> None:
    call_skip = [
        report("setup", "passed"),
        report("call", "skipped", reason="odd rank"),
        report("teardown", "passed"),
    ]
    merged = merge_test({0: passed(), 1: call_skip, 2: passed(), 3: list(call_skip)}, 4)
    assert outcomes(merged) == [("setup", "passed"), ("call", "skipped"), ("teardown", "passed")]
    reason = merged[1].longrepr[2]  # type: ignore[index]
    assert reason == "Skipped: skipped on ranks 1, 3 of 4 (ranks 0, 2 did not): odd rank"


def test_setup_skip_on_one_rank_and_call_failure_on_another_is_failed() -> None:
    skipped = [report("setup", "skipped"), report("teardown", "passed")]
    failed = [report("setup", "passed"), report("call", "failed"), report("teardown", "passed")]
    merged = merge_test({0: skipped, 1: failed}, 2)
    assert outcomes(merged) == [("setup", "passed"), ("call", "failed"), ("teardown", "passed")]
    assert "rank 0/2  skipped in setup: nope" in str(merged[1].longrepr)


def test_xfail_on_some_ranks_is_xfailed_and_says_where() -> None:
    xfailed = [
        report("setup", "passed"),
        report("call", "skipped", wasxfail="known"),
        report("teardown", "passed"),
    ]
    xpassed = [
        report("setup", "passed"),
        report("call", "passed", wasxfail="known"),
        report("teardown", "passed"),
    ]
    merged = merge_test({0: xpassed, 1: xfailed}, 2)
    assert merged[1].outcome == "skipped"
    assert merged[1].wasxfail == "[xfailed on rank 1 of 2] known"
    all_xpass = merge_test({0: xpassed, 1: list(xpassed)}, 2)
    assert all_xpass[1].outcome == "passed" and all_xpass[1].wasxfail == "known"


def test_sections_are_labelled_per_rank() -> None:
    talk0 = passed()
    talk0[1].sections = [("Captured stdout call", "hi 0\n")]
    talk1 = passed()
    talk1[1].sections = [("Captured stdout call", "hi 1\n")]
    merged = merge_test({0: talk0, 1: talk1}, 2)
    assert merged[1].sections == [
        ("Captured stdout call (rank 0/2)", "[rank 0/2]\nhi 0\n"),
        ("Captured stdout call (rank 1/2)", "[rank 1/2]\nhi 1\n"),
    ]


def test_identical_tracebacks_are_shown_once() -> None:
    def failing() -> list[TestReport]:
        return [report("setup", "passed"), report("call", "failed", stop=1.0)]

    merged = merge_test({0: failing(), 1: failing(), 2: failing()}, 3)
    text = str(merged[1].longrepr)
    assert text.count("the same as rank 0/3") == 2


def test_rank_story_prefers_notes() -> None:
    crash = synthesized_failure(
        "n", LOCATION, "call", "crashed", "tb", note="crashed in call with SIGSEGV(-11)"
    )
    assert rank_story([report("setup", "passed"), crash]) == "crashed in call with SIGSEGV(-11)"
    assert rank_story(passed()) == "passed"
    assert rank_story([report("setup", "skipped", reason="x")]) == "skipped in setup: x"


def _killed_waiting(when: str = "call", stop: float = 3.0) -> TestReport:
    return synthesized_failure(
        "test_x.py::test_x",
        LOCATION,
        when,
        "killed in call: rank 1 skipped first",
        "tb",
        note="killed in call 2.0 s after rank 1 skipped; in all_reduce #1",
        collateral=True,
        stop=stop,
    )


def test_ranks_killed_waiting_for_a_setup_skip_leave_the_test_skipped() -> None:
    """D11: a plugin deciding per rank (pytest-dependency) skips on rank 1 in setup; rank 0 waits
    for it in a collective and is killed after the grace: skipped with the skip's reason."""
    skipped = [report("setup", "skipped", reason="depends on test_a", stop=1.0)]
    skipped.append(report("teardown", "passed", stop=1.1))
    waiting = [report("setup", "passed", stop=0.9), _killed_waiting()]
    merged = merge_test({0: waiting, 1: skipped}, 2)
    assert outcomes(merged) == [("setup", "skipped"), ("teardown", "passed")]
    reason = merged[0].longrepr[2]  # type: ignore[index]
    assert reason == (
        "Skipped: skipped on rank 1 of 2 (rank 0 did not, and was stopped while waiting for it): "
        "depends on test_a"
    )
    assert "collateral" not in reason and "killed" not in reason
    # Killed in its own setup (waiting in a fixture's collective): the same.
    merged = merge_test({0: [_killed_waiting("setup")], 1: skipped, 2: passed()}, 3)
    reason = merged[0].longrepr[2]  # type: ignore[index]
    assert merged[0].skipped and "(ranks 0, 2 did not; rank 0 was stopped while" in reason


def test_a_rank_failing_on_its_own_after_a_setup_skip_still_fails_the_test() -> None:
    skipped = [report("setup", "skipped", stop=1.0), report("teardown", "passed", stop=1.1)]
    failed = [report("setup", "passed"), report("call", "failed", stop=2.0)]
    merged = merge_test(
        {0: failed, 1: skipped, 2: [report("setup", "passed"), _killed_waiting()]}, 3
    )
    assert outcomes(merged)[1] == ("call", "failed")
    # A crash is a failure of its own too (a synthesized report that is not collateral).
    crash = synthesized_failure("n", LOCATION, "call", "crashed", "tb", note="crashed", stop=2.0)
    merged = merge_test({0: [report("setup", "passed"), crash], 1: skipped}, 2)
    assert outcomes(merged)[1] == ("call", "failed")


def test_ranks_killed_after_a_skip_in_call_still_fail_the_test() -> None:
    """Only a skip in setup, the first end of the test, excuses the ranks that waited."""
    in_call = [report("setup", "passed"), report("call", "skipped", stop=1.0)]
    merged = merge_test({0: [report("setup", "passed"), _killed_waiting()], 1: in_call}, 2)
    assert outcomes(merged)[1] == ("call", "failed")
    setup_skip = [report("setup", "skipped", stop=2.0)]
    merged = merge_test({0: in_call, 1: setup_skip, 2: [_killed_waiting()]}, 3)
    assert any(r.failed for r in merged)


def test_a_rank_killed_outside_the_test_is_not_excused_by_a_setup_skip() -> None:
    """Only a rank killed inside the test's setup or call may have waited for the skipped peer;
    one stuck before its setup or in its teardown is a failure of its own story."""
    skipped = [report("setup", "skipped", stop=1.0), report("teardown", "passed", stop=1.1)]
    for when, in_test in (("setup", False), ("teardown", False)):
        killed = synthesized_failure(
            "test_x.py::test_x",
            LOCATION,
            when,
            "killed: rank 1 skipped first",
            "tb",
            note="killed",
            collateral=True,
            stop=3.0,
            in_test=in_test,
        )
        merged = merge_test({0: [report("setup", "passed"), killed], 1: skipped}, 2)
        assert any(r.failed for r in merged), when


def test_pytorchs_repro_hint_stays_out_of_the_one_line_story() -> None:
    """PyTorch's harness appends its repro hint to an exception's first argument; an exception
    of several arguments shows it as literal \\n escapes on the crash line (#27)."""
    hint = (
        "\\n\\nTo execute this test, run the following from the base repo dir:\\n    python "
        "test/distributed/test_x.py TestX.test_y\\n\\nThis message can be suppressed by setting "
        "PYTORCH_PRINT_REPRO_ON_FAILURE=0"
    )
    message = f"RuntimeError: ('boom{hint}', 3)"
    crash = synthesized_failure("n", LOCATION, "call", message, "tb", note="")
    assert rank_story([report("setup", "passed"), crash]) == (
        "failed in call: RuntimeError: ('boom', 3)"
    )


def test_json_report_metadata_of_every_rank_lowest_rank_first() -> None:
    """pytest-json-report's metadata set in the ranks reaches every merged report: every key
    any rank set, the lowest rank's value where ranks differ; each phase's output stays the
    rank's whose report the merged one was built from (rank 1's: the failure)."""

    def extra(rank: int, when: str) -> dict[str, object]:
        meta = {"rank": rank, **({"only_1": True} if rank == 1 else {})}
        return {when: {"stdout": f"out {rank}"}, "metadata": meta}

    per_rank = {
        rank: [
            report(when, "failed" if (rank, when) == (1, "call") else "passed")
            for when in ("setup", "call", "teardown")
        ]
        for rank in (0, 1)
    }
    for rank, reports in per_rank.items():
        for r in reports:
            r._json_report_extra = extra(rank, r.when)  # type: ignore[attr-defined]
    merged = merge_test(per_rank, 2)
    assert outcomes(merged) == [("setup", "passed"), ("call", "failed"), ("teardown", "passed")]
    for r in merged:
        data = r._json_report_extra
        assert data["metadata"] == {"rank": 0, "only_1": True}, r.when
    assert merged[1]._json_report_extra["call"] == {"stdout": "out 1"}
    assert merged[0]._json_report_extra["setup"] == {"stdout": "out 0"}


def test_a_rank_killed_before_its_setup_after_a_peers_call_failure_is_no_setup_error() -> None:
    """With no failure grace, a slow rank is killed before its setup began when its peer fails
    in call (seen under load: `--pdb`, `q` in the peer's debugger). The test failed in call; its
    setup did not fail."""
    from pytest_distrank.outcome.merge import COLLATERAL_ATTR, NOTE_ATTR

    killed = report("setup", "failed")
    setattr(killed, COLLATERAL_ATTR, True)
    setattr(killed, NOTE_ATTR, "killed before its setup began 0.1 s after rank 1 failed")
    own = [report("setup", "passed"), report("call", "failed", stop=2.0)]
    merged = merge_test({0: [killed], 1: own}, 2)
    assert outcomes(merged) == [("setup", "passed"), ("call", "failed")]
    text = str(merged[1].longrepr)
    assert "rank 0/2  killed before its setup began 0.1 s after rank 1 failed" in text
    assert "root cause: rank 1/2" in text


def test_a_section_that_says_what_an_earlier_ranks_said_is_folded() -> None:
    """-rA of a passing test: ranks whose captured output is rank 0's are one line each."""
    from pytest_distrank.outcome.merge import _relabel_sections

    def said(text: str) -> TestReport:
        report = TestReport("t.py::t", ("t.py", 0, "t"), {}, "passed", None, "call")
        report.sections = [("Captured stdout call", text)]
        return report

    sections = _relabel_sections(
        [(0, said("loss 0.5\n")), (1, said("loss 0.5\n")), (2, said("loss 0.7\n"))], 3
    )
    assert sections == [
        ("Captured stdout call (rank 0/3)", "[rank 0/3]\nloss 0.5\n"),
        ("Captured stdout call (rank 1/3)", "[rank 1/3]\nthe same as rank 0/3\n"),
        ("Captured stdout call (rank 2/3)", "[rank 2/3]\nloss 0.7\n"),
    ]
