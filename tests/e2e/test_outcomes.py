"""End-to-end: how per-rank outcomes fold into one report (fail, skip, xfail, output, junit).

One inner session (``outcomes``) runs every scenario, each in its own file, with ``-v -ra`` and a
junitxml report; each test below checks its own scenario: its ``-v`` line, its failure section,
its short summary line or its junit testcase. The wording of the merged report itself (table,
root cause, skip reasons) is unit-tested on merge.py (tests/unit/test_merge*.py); these check
that real ranks get there.
"""

from __future__ import annotations

import re
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ..helpers import SharedSession

#: The folder the session ran in (its junitxml report is there).
_RAN_IN: list[Path] = []

FILES = {
    "test_one_rank.py": """
        import pytest

        @pytest.mark.world_size(2)
        def test_one_rank(rank):
            assert rank == 0, f"rank {rank} disagrees"

        @pytest.mark.world_size(2)
        def test_healthy_after(rank):
            pass
        """,
    "test_all_fail.py": """
        import pytest

        @pytest.mark.world_size(3)
        def test_all_fail(rank):
            raise ValueError(f"bad value on {rank}")
        """,
    "test_skips.py": """
        import pytest

        @pytest.mark.world_size(2)
        def test_skip(rank):
            pytest.skip("not today")

        @pytest.mark.world_size(3)
        def test_partial(rank):
            if rank == 2:
                pytest.skip("rank 2 has no data")

        @pytest.mark.world_size(2)
        @pytest.mark.skipif(True, reason="condition")
        def test_marked():
            raise AssertionError("must not run")
        """,
    "test_xfails.py": """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="known bug")
        def test_xfail_all(rank):
            raise RuntimeError("bug")

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="known bug on rank 1")
        def test_xfail_one_rank(rank):
            assert rank == 0

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="fixed now", strict=False)
        def test_xpass(rank):
            pass

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="fixed now", strict=True)
        def test_xpass_strict(rank):
            pass
        """,
    "test_talks.py": """
        import sys, pytest

        @pytest.mark.world_size(2)
        def test_talks(rank):
            print(f"hello from {rank}")
            print(f"warning from {rank}", file=sys.stderr)
            assert False
        """,
    "test_junit.py": """
        import pytest

        @pytest.mark.world_size(2, 3)
        def test_ok(rank):
            print(f"out {rank}")

        @pytest.mark.world_size(2)
        def test_bad(rank):
            print(f"bad {rank}")
            assert rank == 0
        """,
    # Hooks of conftest.py: the merge hook decides test_rank0_decides alone (None: the default
    # policy for every other test); the rank setup hook records each rank's call.
    "conftest.py": """
        import torch.distributed as dist
        SEEN = []

        def pytest_distrank_merge_reports(item, reports):
            if item.name == "test_rank0_decides":
                return list(reports[0])  # rank 0 decides alone
            return None

        def pytest_distrank_rank_setup(config, rank, world_size):
            assert dist.is_initialized() and dist.get_rank() == rank
            SEEN.append((rank, world_size))
        """,
    "test_merge_hook.py": """
        import pytest

        @pytest.mark.world_size(2)
        def test_rank0_decides(rank):
            assert rank == 0
        """,
    "test_rank_setup.py": """
        import pytest, conftest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(3))
        def test_seen(rank, world_size, i):
            assert conftest.SEEN == [(rank, world_size)]
        """,
    "test_teardown_a.py": """
        import pytest

        @pytest.fixture(scope="module")
        def resource():
            yield
            raise RuntimeError("module teardown in the controller failed")

        def test_plain(resource):
            pass

        @pytest.mark.world_size(2)
        def test_last_in_module(rank):
            pass
        """,
    "test_teardown_b.py": """
        def test_other_module():
            pass
        """,
    "test_props.py": """
        import threading, pytest

        @pytest.mark.world_size(3)
        def test_bad_on_2(rank):
            assert rank != 2

        @pytest.mark.world_size(2)
        def test_prop(rank, record_property):
            record_property("lock", threading.Lock())
        """,
    "test_rerun.py": """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("x", ["a b"])
        def test_bad(rank, x):
            assert rank == 0
        """,
}


def _write(folder: Path) -> None:
    _RAN_IN.append(folder)
    for name, source in FILES.items():
        (folder / name).write_text(textwrap.dedent(source).lstrip())


@pytest.fixture
def outcomes(shared_session: SharedSession) -> pytest.RunResult:
    return shared_session(
        "outcomes", _write, "-v", "-ra", "--junitxml=out.xml", "-o", "junit_logging=all"
    )


@pytest.fixture
def junit(outcomes: pytest.RunResult) -> ET.Element:
    report = _RAN_IN[0] / "out.xml"
    if not report.is_file():  # the session broke: say so with its output, not a parse error
        pytest.fail(
            f"the shared inner session 'outcomes' wrote no {report.name}:\n{outcomes.stdout}"
        )
    return ET.parse(report).getroot()


def _cases(root: ET.Element, module: str) -> dict[str, ET.Element]:
    """The testcases of one test file, by name."""
    return {c.get("name", ""): c for c in root.iter("testcase") if c.get("classname") == module}


def section(result: pytest.RunResult, title: str) -> pytest.LineMatcher:
    """The lines of one failure or error section (``_____ title _____``), up to the next."""
    lines = result.outlines
    head = re.compile(rf"_+ {re.escape(title)} _+$")
    start = next(i for i, line in enumerate(lines) if head.match(line))
    rule = re.compile(r"(_{3,}|={3,}) \S.* (_{3,}|={3,})$")
    end = next((i for i in range(start + 1, len(lines)) if rule.match(lines[i])), len(lines))
    return pytest.LineMatcher(lines[start:end])


def test_outcomes_session_totals(outcomes: pytest.RunResult) -> None:
    outcomes.assert_outcomes(passed=11, failed=7, skipped=3, xfailed=2, xpassed=1, errors=1)


def test_failure_on_one_rank_names_the_rank(outcomes: pytest.RunResult) -> None:
    section(outcomes, "test_one_rank").fnmatch_lines(
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "  rank 0/2  passed",
            "  rank 1/2  failed in call: AssertionError: rank 1 disagrees*<- root cause",
            "*traceback of rank 1/2*",
            "E       AssertionError: rank 1 disagrees",
        ]
    )
    outcomes.stdout.fnmatch_lines(
        [
            "test_one_rank.py::test_one_rank FAILED*",
            "test_one_rank.py::test_healthy_after PASSED*",
            "FAILED test_one_rank.py::test_one_rank - [[]rank 1/2[]] AssertionError: rank 1 "
            "disagrees*",
        ]
    )


def test_failures_on_several_ranks_show_every_traceback(outcomes: pytest.RunResult) -> None:
    failure = section(outcomes, "test_all_fail")
    # The same exception type at the same line on every rank: said, not one rank picked.
    failure.fnmatch_lines(
        ["distrank: all 3 ranks failed the same way (ValueError at *.py:*); shown: rank 0/3"]
    )
    for rank in range(3):
        failure.fnmatch_lines([f"*traceback of rank {rank}/3*"])
        failure.fnmatch_lines([f"E *ValueError: bad value on {rank}"])


def test_skip_on_all_ranks(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skips.py:5: not today"])


def test_skip_on_some_ranks_says_which(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_skips.py:*: skipped on rank 2 of 3 (ranks 0, 1 did not): "
            "rank 2 has no data"
        ]
    )


def test_skip_marker_is_honoured_in_ranks(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines(["test_skips.py::test_marked SKIPPED (condition)*"])
    outcomes.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skips.py:*: condition"])


def test_xfail_not_strict(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines_random(
        [
            "test_xfails.py::test_xfail_all XFAIL (known bug)*",
            "test_xfails.py::test_xfail_one_rank XFAIL*",
            "test_xfails.py::test_xpass XPASS (fixed now)*",
            "XFAIL test_xfails.py::test_xfail_one_rank - *known bug on rank 1*",
        ]
    )


def test_xfail_strict_xpass_fails(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines(
        ["FAILED test_xfails.py::test_xpass_strict*XPASS(strict)*fixed now*"]
    )


def test_captured_output_per_rank(outcomes: pytest.RunResult) -> None:
    section(outcomes, "test_talks").fnmatch_lines(
        [
            "*- Captured stdout call (rank 0/2) -*",
            "[[]rank 0/2[]]",
            "hello from 0",
            "*- Captured stderr call (rank 0/2) -*",
            "[[]rank 0/2[]]",
            "warning from 0",
            "*- Captured stdout call (rank 1/2) -*",
            "[[]rank 1/2[]]",
            "hello from 1",
        ]
    )


def test_junitxml_one_testcase_per_test(outcomes: pytest.RunResult, junit: ET.Element) -> None:
    cases = _cases(junit, "test_junit")
    assert sorted(cases) == ["test_bad", "test_ok[ws2]", "test_ok[ws3]"]
    # One testcase per test in the whole report too: the suite counts them, not ranks.
    suite = junit.find("testsuite")
    assert suite is not None
    everything = list(junit.iter("testcase"))
    assert len(everything) == 24
    # pytest 8.0 counts a teardown error (here a controller-side module fixture's) once more in
    # the suite's "tests"; later versions count testcases. Never one per rank either way.
    teardown_errors = sum(
        1
        for case in everything
        for error in case.findall("error")
        if "teardown" in error.get("message", "")
    )
    assert int(suite.get("tests", "0")) in (len(everything), len(everything) + teardown_errors)
    failures = [c for c in everything if c.find("failure") is not None]
    assert suite.get("failures") == str(len(failures)) == "7"
    failure = cases["test_bad"].find("failure")
    assert failure is not None
    assert failure.get("message", "") == "[rank 1/2] assert 1 == 0"
    out = cases["test_bad"].findtext("system-out") or ""
    assert "[rank 0/2]" in out and "bad 0" in out and "[rank 1/2]" in out and "bad 1" in out


def test_merge_hook_replaces_the_policy(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines(["test_merge_hook.py::test_rank0_decides PASSED*"])


def test_rank_setup_hook_runs_once_per_rank(outcomes: pytest.RunResult) -> None:
    outcomes.stdout.fnmatch_lines([f"*::test_seen[[]{i}[]] PASSED*" for i in range(3)])


def test_controller_fixtures_are_torn_down_after_a_distributed_test(
    outcomes: pytest.RunResult,
) -> None:
    outcomes.stdout.fnmatch_lines(
        [
            "test_teardown_a.py::test_plain PASSED*",
            "test_teardown_a.py::test_last_in_module PASSED*",
            "test_teardown_a.py::test_last_in_module ERROR*",
            "test_teardown_b.py::test_other_module PASSED*",
            "ERROR test_teardown_a.py::test_last_in_module - RuntimeError: module teardown in the "
            "controller failed",
        ]
    )


def test_junitxml_has_one_property_per_rank(outcomes: pytest.RunResult, junit: ET.Element) -> None:
    case = _cases(junit, "test_props")["test_bad_on_2"]
    props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
    assert sorted(props) == ["distrank rank 0/3", "distrank rank 1/3", "distrank rank 2/3"]
    assert props["distrank rank 0/3"].startswith("passed; ")
    assert props["distrank rank 2/3"].startswith("failed in call: assert 2 != 2; ")
    pids = {value.rsplit("pid ", 1)[1] for value in props.values()}
    assert len(pids) == 3 and all(pid.isdigit() for pid in pids)


def test_failure_report_ends_with_a_rerun_command(outcomes: pytest.RunResult) -> None:
    section(outcomes, "test_bad[a b]").fnmatch_lines(
        [
            "*- distrank: rerun just this test -*",
            "cd * && pytest -p distrank --distrank-seed=* 'test_rerun.py::test_bad[[]a b[]]'",
        ]
    )


def test_unpicklable_user_property_is_sent_as_its_repr(
    outcomes: pytest.RunResult, junit: ET.Element
) -> None:
    outcomes.stdout.fnmatch_lines(["test_props.py::test_prop PASSED*"])
    case = _cases(junit, "test_props")["test_prop"]
    values = [p.get("value", "") for p in case.iter("property") if p.get("name") == "lock"]
    assert values and all("lock" in v for v in values)
