"""End-to-end: distributed tests under the pytest features users already rely on."""

from __future__ import annotations

import pytest

from ..helpers import RunPytest

MIXED = """
import pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2, 3)
@pytest.mark.parametrize("i", range(3))
def test_sum(rank, world_size, pg, i):
    t = torch.ones(1) * i
    dist.all_reduce(t)
    assert t.item() == i * world_size

@pytest.mark.world_size(2)
def test_fails(rank):
    assert rank == 0

def test_plain():
    pass
"""


def test_xdist_gives_the_same_outcomes(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(test_mixed=MIXED)
    run_pytest().assert_outcomes(passed=7, failed=1)
    result = run_pytest("-n", "2")
    result.assert_outcomes(passed=7, failed=1)
    result.stdout.fnmatch_lines(["*[[]rank 1/2[]] assert 1 == 0*"])


def test_collect_only_starts_no_process(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(test_mixed=MIXED)
    result = run_pytest("--co", "-q")
    result.stdout.fnmatch_lines(["test_mixed.py::test_sum[[]ws2-0[]]", "*8 tests collected*"])
    result.stdout.no_fnmatch_line("*pools started*")
    assert not list(pytester.path.rglob("pool*-rank*.log"))


def test_keyword_marker_and_last_failed_selection(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_mixed=MIXED)
    run_pytest("-k", "ws3").assert_outcomes(passed=3)
    run_pytest("-m", "world_size").assert_outcomes(passed=6, failed=1)
    run_pytest("-m", "not world_size").assert_outcomes(passed=1)
    # the runs above filled the cache: --lf reruns just the distributed test that failed
    result = run_pytest("--lf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["run-last-failure: rerun previous 1 failure*"])


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(["--distrank-start-method=forkserver"], id="forkserver"),
        pytest.param(["--distrank-start-method=spawn"], id="spawn"),
        pytest.param(["-n", "2"], id="xdist"),
    ],
)
def test_coverage_counts_lines_run_only_in_ranks(
    pytester: pytest.Pytester, run_pytest: RunPytest, how: list[str]
) -> None:
    pytester.makepyfile(
        **{
            "mypkg/__init__.py": """
            def pick(rank):
                if rank == 1:
                    return "one"
                return "other"
            """,
            "test_cov.py": """
            import pytest
            import mypkg

            @pytest.mark.world_size(2)
            def test_pick(rank):
                assert mypkg.pick(rank) == ("one" if rank == 1 else "other")
            """,
        }
    )
    result = run_pytest(
        *how,
        "--cov=mypkg",
        "--cov-branch",
        "--cov-report=term-missing",
        "-p",
        "pytest_cov",
    )
    result.assert_outcomes(passed=1)
    # Lines 3 and 4 run only in ranks (line 3 only on rank 1); without the ranks' data they would
    # be listed as missing.
    result.stdout.fnmatch_lines(["mypkg*__init__.py * 4 * 0 * 2 * 0 * 100%*"])


FLAKY = """
import pathlib, pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2)
def test_flaky(rank, pg):
    marker = pathlib.Path("attempted-once")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.barrier()
    if rank == 1 and not marker.exists():
        marker.write_text("")
        raise AssertionError("rank 1 fails the first attempt")
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_always_fails(rank):
    assert rank == 0, "rank 1 always fails"

@pytest.mark.flaky(reruns=1)
@pytest.mark.world_size(2)
def test_marked(rank):
    if rank == 0:
        with open("rank0-attempts", "a") as f:
            f.write("x")
    marker = pathlib.Path("marked-once")
    if rank == 1 and not marker.exists():
        marker.write_text("")
        raise AssertionError("rank 1 fails the first attempt")
"""


def test_reruns_rerun_a_distributed_test_on_all_ranks(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_flaky=FLAKY)
    result = run_pytest("-p", "rerunfailures", "--reruns=2", "-rfR")
    assert result.parseoutcomes() == {"passed": 2, "failed": 1, "rerun": 4}
    result.stdout.fnmatch_lines(["test_flaky.py R.RRFR.*"])
    # flaky(reruns=1) reran the test on both ranks, not on rank 1 alone.
    assert (pytester.path / "rank0-attempts").read_text() == "xx"
    result.stdout.fnmatch_lines(
        ["RERUN test_flaky.py::test_flaky", "PASSED test_flaky.py::test_flaky"]
    )
    result.stdout.fnmatch_lines(
        ["FAILED test_flaky.py::test_always_fails - *[[]rank 1/2[]] AssertionError: rank 1 alw*"]
    )
    # Both attempts of test_flaky ran on the same warm pool.
    result.stdout.fnmatch_lines(["*pools started: 1 at world size 2"])
