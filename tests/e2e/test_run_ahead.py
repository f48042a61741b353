"""End-to-end: ranks run the pool's next test while the controller reports the last (dispatch
``ahead``, the default) without changing what is reported, or for which test.

The test that runs ahead is the second of each file here: the first passes, so its pool's next
test is sent before the first one's reports are replayed (controller.Controller._may_run_ahead).
"""

from __future__ import annotations

import pytest

from ..helpers import RunPytest

#: Controller side only (ranks load conftest.py too): while test_a's call report is replayed,
#: is test_b already running on rank 0? Waits for the sign for at most ``WAIT`` seconds.
WATCH_CONFTEST = """
import os, pathlib, time

WAIT = {wait}

def pytest_runtest_logreport(report):
    if os.environ.get("DISTRANK_RANK") is None and report.nodeid.endswith("test_a") \\
            and report.when == "call":
        sign = pathlib.Path("b-started")
        end = time.monotonic() + WAIT
        while not sign.exists() and time.monotonic() < end:
            time.sleep(0.01)
        pathlib.Path("seen").write_text("ahead" if sign.exists() else "not ahead")
"""
WATCHED = """
import pathlib, pytest

@pytest.mark.world_size(2)
def test_a(rank):
    pass

@pytest.mark.world_size(2)
def test_b(rank):
    if rank == 0:
        pathlib.Path("b-started").write_text("")
"""


@pytest.mark.parametrize(
    ("args", "wait", "seen"),
    [((), 60, "ahead"), (("--distrank-dispatch=lockstep",), 1, "not ahead")],
)
def test_the_next_test_starts_while_the_last_is_reported(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    args: tuple[str, ...],
    wait: int,
    seen: str,
) -> None:
    pytester.makeconftest(WATCH_CONFTEST.format(wait=wait))
    pytester.makepyfile(test_watched=WATCHED)
    run_pytest(*args).assert_outcomes(passed=2)
    assert (pytester.path / "seen").read_text() == seen


def test_bad_dispatch_value_names_the_option(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_watched=WATCHED)
    result = run_pytest("--distrank-dispatch=eager")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*invalid value 'eager' for --distrank-dispatch (ini: distrank_dispatch, env: "
            "DISTRANK_DISPATCH), from --distrank-dispatch=eager (command line):",
            "*expected one of ahead, lockstep",
        ]
    )


STOPS = """
import pathlib, pytest

@pytest.mark.world_size(2)
def test_a(rank):
    pass

@pytest.mark.world_size(2)
def test_b(rank):
    assert rank == 0, "rank 1 fails"

@pytest.mark.world_size(2)
def test_c(rank):
    pathlib.Path(f"c-ran-on-rank{rank}").write_text("")
"""


@pytest.mark.parametrize("stop", ["-x", "--maxfail=1"])
def test_stop_at_first_failure_runs_and_reports_nothing_after_it(
    pytester: pytest.Pytester, run_pytest: RunPytest, stop: str
) -> None:
    pytester.makepyfile(test_stops=STOPS)
    result = run_pytest(stop, "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*stopping after 1 failures*"])
    result.stdout.no_fnmatch_line("*::test_c*")
    assert not list(pytester.path.glob("c-ran-on-rank*")), "test_c ran on a rank"


def test_a_test_that_ran_ahead_is_rerun_on_all_ranks(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pathlib, pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_a(rank):
            pass

        @pytest.mark.world_size(2)
        def test_flaky(rank, pg):
            with open(f"attempts-rank{rank}", "a") as f:
                f.write("x")
            t = torch.ones(1)
            dist.all_reduce(t)
            marker = pathlib.Path("failed-once")
            dist.barrier()
            if rank == 1 and not marker.exists():
                marker.write_text("")
                raise AssertionError("rank 1 fails the first attempt")

        @pytest.mark.world_size(2)
        def test_c(rank):
            pass
        """
    )
    result = run_pytest("-p", "rerunfailures", "--reruns=1", "-v")
    assert result.parseoutcomes() == {"passed": 3, "rerun": 1}
    result.stdout.fnmatch_lines(
        [
            "*::test_a PASSED*",
            "*::test_flaky RERUN*",
            "*::test_flaky PASSED*",
            "*::test_c PASSED*",
        ]
    )
    for rank in (0, 1):
        assert (pytester.path / f"attempts-rank{rank}").read_text() == "xx"


FAULT_AHEAD = """
import os, signal, time, pytest

@pytest.mark.world_size(2)
def test_a(rank):
    pass

@pytest.mark.timeout(3)
@pytest.mark.world_size(2)
def test_b(rank):
    if rank == 1:
        {fault}

@pytest.mark.world_size(2)
def test_c(rank):
    pass
"""


@pytest.mark.parametrize(
    ("fault", "summary", "row"),
    [
        (
            "time.sleep(120)",
            "*rank 1/2*Timeout: still in call after 3 s*",
            "*rank 1/2*timed out in call after 3 s; blocked in test_b at test_fault.py:11*",
        ),
        (
            "os.kill(os.getpid(), signal.SIGKILL)",
            "*rank 1/2*crashed in call with SIGKILL*",
            "*rank 1/2*crashed in call with SIGKILL*<- root cause",
        ),
    ],
    ids=["hang", "crash"],
)
def test_a_fault_in_a_test_that_ran_ahead_fails_that_test_alone(
    pytester: pytest.Pytester, run_pytest: RunPytest, fault: str, summary: str, row: str
) -> None:
    pytester.makepyfile(test_fault=FAULT_AHEAD.format(fault=fault))
    result = run_pytest("-v", "-rf")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*::test_a PASSED*",
            "*::test_b FAILED*",
            "*::test_c PASSED*",
            row,
            f"FAILED test_fault.py::test_b - {summary}",
        ]
    )
    result.stdout.no_fnmatch_line("FAILED test_fault.py::test_a*")
    result.stdout.fnmatch_lines(["pool killed after a fault: *in test_fault.py::test_b"])


def test_ordinary_tests_and_other_pools_between_keep_their_order(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_mixed="""
        import pytest

        order = []

        @pytest.mark.world_size(2)
        def test_d1(rank):
            pass

        def test_plain1():
            pass

        @pytest.mark.world_size(2)
        def test_d2(rank):
            pass

        @pytest.mark.world_size(3)
        def test_w3(rank):
            pass

        @pytest.mark.world_size(2)
        def test_d3(rank):
            pass

        @pytest.mark.world_size(2)
        def test_d4(rank):
            pass

        def test_plain2():
            pass
        """
    )
    result = run_pytest("-v")
    result.assert_outcomes(passed=7)
    names = ["d1", "plain1", "d2", "w3", "d3", "d4", "plain2"]
    result.stdout.fnmatch_lines([f"*::test_{name} PASSED*" for name in names], consecutive=True)
