"""End-to-end: how per-rank outcomes fold into one report (fail, skip, xfail, output, junit)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ..helpers import RunPytest


def test_failure_on_one_rank_names_the_rank(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        def test_one_rank(rank):
            assert rank == 0, f"rank {rank} disagrees"

        @pytest.mark.world_size(2)
        def test_healthy_after(rank):
            pass
        """
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_one_rank _*",
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "  rank 0/2  passed",
            "  rank 1/2  failed in call: AssertionError: rank 1 disagrees*<- root cause",
            "*traceback of rank 1/2*",
            "E       AssertionError: rank 1 disagrees",
            "FAILED *::test_one_rank - [[]rank 1/2[]] AssertionError: rank 1 disagrees*",
        ]
    )


def test_failures_on_several_ranks_show_every_traceback(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(3)
        def test_all_fail(rank):
            raise ValueError(f"bad value on {rank}")
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["distrank: 3 of 3 ranks failed; root cause: rank *"])
    for rank in range(3):
        result.stdout.fnmatch_lines([f"*traceback of rank {rank}/3*"])
        result.stdout.fnmatch_lines([f"E *ValueError: bad value on {rank}"])


def test_skip_on_all_ranks(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        def test_skip(rank):
            pytest.skip("not today")
        """
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *.py:5: not today"])


def test_skip_on_some_ranks_says_which(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(3)
        def test_partial(rank):
            if rank == 2:
                pytest.skip("rank 2 has no data")
        """
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] *: skipped on rank 2 of 3 (ranks 0, 1 did not): rank 2 has no data"]
    )


def test_skip_marker_is_honoured_in_ranks(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.skipif(True, reason="condition")
        def test_marked():
            raise AssertionError("must not run")
        """
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*condition"])


XFAIL_TESTS = """
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
@pytest.mark.xfail(reason="fixed now", strict=STRICT)
def test_xpass(rank):
    pass
"""


def test_xfail_not_strict(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(XFAIL_TESTS.replace("STRICT", "False"))
    result = run_pytest("-rxX")
    result.assert_outcomes(xfailed=2, xpassed=1)
    result.stdout.fnmatch_lines(["XFAIL*test_xfail_one_rank*known bug on rank 1*"])


def test_xfail_strict_xpass_fails(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(XFAIL_TESTS.replace("STRICT", "True"))
    result = run_pytest("-ra")
    result.assert_outcomes(xfailed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED*test_xpass*XPASS(strict)*fixed now*"])


def test_captured_output_per_rank(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        """
        import sys, pytest

        @pytest.mark.world_size(2)
        def test_talks(rank):
            print(f"hello from {rank}")
            print(f"warning from {rank}", file=sys.stderr)
            assert False
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
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


def test_junitxml_one_testcase_per_test(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2, 3)
        def test_ok(rank):
            print(f"out {rank}")

        @pytest.mark.world_size(2)
        def test_bad(rank):
            print(f"bad {rank}")
            assert rank == 0
        """
    )
    result = run_pytest("--junitxml=out.xml", "-o", "junit_logging=all")
    result.assert_outcomes(passed=2, failed=1)
    root = ET.parse(pytester.path / "out.xml").getroot()
    cases = root.findall(".//testcase")
    assert sorted(c.get("name", "") for c in cases) == ["test_bad", "test_ok[ws2]", "test_ok[ws3]"]
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "1"
    bad = next(c for c in cases if c.get("name") == "test_bad")
    failure = bad.find("failure")
    assert failure is not None
    assert failure.get("message", "") == "[rank 1/2] assert 1 == 0"
    out = bad.findtext("system-out") or ""
    assert "[rank 0/2]" in out and "bad 0" in out and "[rank 1/2]" in out and "bad 1" in out


def test_rank_addopts_and_junit_do_not_leak_into_ranks(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeini(
        """
        [pytest]
        addopts = -x --junitxml=session.xml
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(2))
        def test_fails(rank, i):
            assert False
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)  # -x in the controller stops after the first
    assert sorted(p.name for p in pytester.path.glob("*.xml")) == ["session.xml"]
    assert not list(pytester.path.rglob("rank*.xml"))


def test_merge_hook_replaces_the_policy(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makeconftest(
        """
        def pytest_distrank_merge_reports(item, reports):
            # rank 0 decides alone
            return list(reports[0])
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        def test_rank0_decides(rank):
            assert rank == 0
        """
    )
    run_pytest().assert_outcomes(passed=1)


def test_rank_setup_hook_runs_once_per_rank(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(
        """
        import torch.distributed as dist
        SEEN = []

        def pytest_distrank_rank_setup(config, rank, world_size):
            assert dist.is_initialized() and dist.get_rank() == rank
            SEEN.append((rank, world_size))
        """
    )
    pytester.makepyfile(
        """
        import pytest, conftest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(3))
        def test_seen(rank, world_size, i):
            assert conftest.SEEN == [(rank, world_size)]
        """
    )
    run_pytest().assert_outcomes(passed=3)


def test_controller_fixtures_are_torn_down_after_a_distributed_test(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_a="""
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
        test_b="""
        def test_other_module():
            pass
        """,
    )
    result = run_pytest("-ra")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "ERROR test_a.py::test_last_in_module - RuntimeError: module teardown in the "
            "controller failed"
        ]
    )


def test_junitxml_has_one_property_per_rank(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(3)
        def test_bad(rank):
            assert rank != 2
        """
    )
    run_pytest("--junitxml=out.xml").assert_outcomes(failed=1)
    root = ET.parse(pytester.path / "out.xml").getroot()
    props = {p.get("name", ""): p.get("value", "") for p in root.iter("property")}
    assert sorted(props) == ["distrank rank 0/3", "distrank rank 1/3", "distrank rank 2/3"]
    assert props["distrank rank 0/3"].startswith("passed; ")
    assert props["distrank rank 2/3"].startswith("failed in call: assert 2 != 2; ")
    pids = {value.rsplit("pid ", 1)[1] for value in props.values()}
    assert len(pids) == 3 and all(pid.isdigit() for pid in pids)


def test_failure_report_ends_with_a_rerun_command(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("x", ["a b"])
        def test_bad(rank, x):
            assert rank == 0
        """
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- distrank: rerun just this test -*",
            "cd * && pytest -p distrank 'test_failure_report_ends_with_a_rerun_command.py::"
            "test_bad[[]a b[]]'",
        ]
    )


def test_unpicklable_user_property_is_sent_as_its_repr(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import threading, pytest

        @pytest.mark.world_size(2)
        def test_prop(rank, record_property):
            record_property("lock", threading.Lock())
        """
    )
    run_pytest("--junitxml=out.xml").assert_outcomes(passed=1)
    root = ET.parse(pytester.path / "out.xml").getroot()
    values = [p.get("value", "") for p in root.iter("property") if p.get("name") == "lock"]
    assert values and all("lock" in v for v in values)


def test_capture_no_shows_every_ranks_output_labelled(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import sys, pytest

        @pytest.mark.world_size(2)
        def test_talk(rank):
            print(f"hello from rank {rank}")
            print(f"problem on rank {rank}", file=sys.stderr)
        """
    )
    result = run_pytest("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines_random(
        [
            "[[]rank 0/2[]] hello from rank 0",
            "[[]rank 1/2[]] hello from rank 1",
            "[[]rank 0/2[]] problem on rank 0",
            "[[]rank 1/2[]] problem on rank 1",
        ]
    )
