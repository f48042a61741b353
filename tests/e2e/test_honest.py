"""End-to-end: a PASS rests on evidence from every rank, and reports belong to their test.

The honest-outcomes issue (#11), items 1-4: a rank killed before its setup began or after its
teardown is not a pass; reports sent from a forked process are not credited to any test; a
collective one rank left unmatched fails the test that left it; a rank that died between tests
does not end the session. Each case is followed by healthy tests on a working pool.
"""

from __future__ import annotations

import re

import pytest

from ..helpers import RunPytest

HEADER = "import os, signal, sys, time, pytest, torch, torch.distributed as dist\n"

HEALTHY = """

@pytest.mark.world_size(2)
def test_zz_healthy(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2
"""

#: A conftest whose protocol wrapper blocks rank 1 before (or after) a test named "sleepy".
SLEEPY_CONFTEST = """
import os, time, pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if os.environ.get("RANK") == "1" and "sleepy_before" in item.name:
        time.sleep(600)
    result = yield
    if os.environ.get("RANK") == "1" and "sleepy_after" in item.name:
        time.sleep(600)
    return result
"""


def test_rank_stuck_before_its_setup_is_not_a_pass(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(SLEEPY_CONFTEST)
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
@pytest.mark.timeout(4)
def test_sleepy_before(rank):
    assert rank == 0
"""
        + HEALTHY
    )
    result = run_pytest("-ra")
    # Its setup never ran on rank 1: an error at setup, as pytest reports a setup that failed.
    result.assert_outcomes(errors=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "  rank 0/2  passed",
            "  rank 1/2  timed out before its setup began after 4 s; blocked in "
            "pytest_runtest_protocol at conftest.py:*",
            "ERROR *::test_sleepy_before - [[]rank 1/2[]] Timeout: its setup had not begun "
            "after 4 s (timeout from @pytest.mark.timeout(4))",
        ]
    )
    assert result.ret == 1


def test_rank_stuck_after_its_teardown_is_not_a_pass(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(SLEEPY_CONFTEST)
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
@pytest.mark.timeout(4)
def test_sleepy_after(rank):
    pass
"""
        + HEALTHY
    )
    result = run_pytest("-ra")
    # Setup and call passed on both ranks; the error is reported at teardown, as pytest does.
    result.assert_outcomes(errors=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "  rank 1/2  timed out after its teardown, before its reports were sent after 4 s; "
            "blocked in pytest_runtest_protocol at conftest.py:*",
        ]
    )


def test_a_tiny_deadline_fails_every_test(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_TIMEOUT", "1e-9")
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_one(rank):
    pass
"""
        + HEALTHY
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["FAILED *::test_one - *Timeout: * 1e-09 s *"])
    assert "passed" not in result.stdout.lines[-1]


def test_reports_from_a_forked_test_process_are_not_credited(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_forks(rank):
    if rank == 1:
        os.fork()  # the child returns into pytest and runs the rest of the protocol

@pytest.mark.world_size(2)
def test_next(rank):
    assert rank != 1
"""
        + HEALTHY
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=2, passed=1)
    text = result.stdout.str()
    # Rank 1 names the fork still running its code when the test ended or, if the child got
    # its reports out first, the controller names the pid they came from.
    forked = r"rank 1/2\s+forked pid \d+ which still ran the rank's own code when the test ended"
    foreign = r"rank 1/2\s+sent reports from pid \d+, not its own \(\d+\)"
    assert re.search(forked, text) or re.search(foreign, text), text
    result.stdout.fnmatch_lines(["FAILED *::test_forks - [[]rank 1/2[]] *"])
    result.stdout.fnmatch_lines(["FAILED *::test_next - *assert 1 != 1"])


def test_rank_dead_between_tests_does_not_end_the_run(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_alarm(rank):
    if rank == 1:
        signal.alarm(1)  # never cancelled: SIGALRM kills rank 1 while it is idle

def test_ordinary_wait():
    time.sleep(2.5)

@pytest.mark.world_size(2)
def test_after(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "pool killed after a fault: world_size=2, backend=gloo: rank 1/2 (pid *) died while "
            "idle (SIGALRM(-14)), after *::test_alarm",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()


def test_unmatched_collective_fails_the_test_that_left_it(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_culprit(rank, pg):
    if rank == 0:
        dist.all_reduce(torch.ones(1) * 100, group=pg, async_op=True)  # no peer matches it

@pytest.mark.world_size(2)
def test_innocent(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_point_to_point_is_not_a_desync(rank, pg):
    t = torch.zeros(1)
    if rank == 0:
        dist.send(torch.ones(1), 1)
    else:
        dist.recv(t, 0)
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "  rank 0/2  issued 1 more collective than its peers on the default group: an "
            "unmatched collective (its last: gloo:all_reduce)  <- root cause",
            "  rank 1/2  passed",
        ]
    )


@pytest.mark.parametrize("world_size", [3])
def test_point_to_point_on_some_ranks_keeps_the_pool(
    pytester: pytest.Pytester, run_pytest: RunPytest, world_size: int
) -> None:
    pytester.makepyfile(
        HEADER
        + f"""
@pytest.mark.world_size({world_size})
def test_p2p(rank, pg):
    if rank == 0:
        dist.send(torch.ones(1), 1)
    elif rank == 1:
        dist.recv(torch.zeros(1), 0)

@pytest.mark.world_size({world_size})
def test_then_collective(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == {world_size}
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(passed=2)
    assert "pool killed after a fault" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "env", "marker"),
    [
        ((), "inf", ""),
        (("--timeout=3000000",), "", ""),
        ((), "", "@pytest.mark.timeout(10**7)"),
        (("--distrank-timeout=1e308",), "", ""),
    ],
    ids=["env-inf", "pytest-timeout-3000000", "marker-1e7", "option-1e308"],
)
def test_huge_deadline_means_no_deadline(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    env: str,
    marker: str,
) -> None:
    if env:
        monkeypatch.setenv("DISTRANK_TIMEOUT", env)
    pytester.makepyfile(
        HEADER
        + f"""
{marker}
@pytest.mark.world_size(2)
def test_huge(rank, pg):
    dist.barrier(group=pg)
"""
        + HEALTHY
    )
    result = run_pytest("-ra", *args)
    result.assert_outcomes(passed=2)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            'pytest.exit("database gone", returncode=3)',
            "*stopped serving in call: pytest.exit('database gone') was called in *::test_stop "
            "(returncode=3)*",
        ),
        ("raise KeyboardInterrupt", "*stopped serving in call: KeyboardInterrupt was raised in *"),
    ],
    ids=["pytest-exit", "keyboard-interrupt"],
)
def test_session_ending_exception_in_a_rank_says_so(
    pytester: pytest.Pytester, run_pytest: RunPytest, body: str, line: str
) -> None:
    pytester.makepyfile(
        HEADER
        + f"""
@pytest.mark.world_size(2)
def test_stop(rank):
    if rank == 1:
        {body}
"""
        + HEALTHY
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([line])
    assert "exit code 0" not in result.stdout.str()


def test_failed_subtest_is_not_the_end_of_a_ranks_test(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytest.importorskip("_pytest.subtests", reason="the subtests fixture is pytest 9's")
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_steps(rank, pg, subtests):
    for i in range(3):
        with subtests.test(msg="step", i=i):
            time.sleep(1.0)  # longer than the grace period
            t = torch.ones(1)
            dist.all_reduce(t, group=pg)
            assert not (rank == 1 and i == 0), "rank 1 fails step 0"
"""
        + HEALTHY
    )
    result = run_pytest("-ra", "-v", "--distrank-failure-grace=0.5")
    # As plain pytest reports subtests: the later ones ran on every rank and passed.
    result.stdout.fnmatch_lines(
        [
            "*::test_steps SUBPASSED[[]step[]] (i=*2*) *",
            "SUBFAILED[[]step[]] (i=*0*) *::test_steps - [[]rank 1/2[]] AssertionError: rank 1 "
            "fails step 0",
            "FAILED *::test_steps - [[]rank 1/2[]] contains 1 failed subtest",
            "*2 failed, 1 passed, 2 subtests passed*",
        ]
    )
    assert "killed" not in result.stdout.str()  # no peer was ended after the grace period


def test_warnings_in_ranks_reach_the_warnings_summary(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
import threading, warnings

@pytest.mark.world_size(2)
def test_warns(rank):
    warnings.warn("deprecated thing", DeprecationWarning)
    if rank == 1:
        t = threading.Thread(target=lambda: 1 / 0)
        t.start()
        t.join()
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(passed=1, warnings=2)
    result.stdout.fnmatch_lines(
        [
            "*test_warnings_in_ranks_reach_the_warnings_summary.py:*: DeprecationWarning: "
            "[[]ranks 0, 1 of 2[]] deprecated thing",
            "*PytestUnhandledThreadExceptionWarning: [[]rank 1/2[]] Exception in thread *",
            "*ZeroDivisionError: division by zero",
        ]
    )


@pytest.mark.parametrize(
    "how",
    [
        "subprocess.Popen(['sleep', '600'])",
        # a daemon: its own session, its parent gone (re-parented to the rank, a subreaper)
        "subprocess.Popen(['setsid', 'sh', '-c', 'sleep 600 & exit 0']).wait()",
        # a rank that crashes after starting a child in a session of its own
        "subprocess.Popen(['setsid', 'sleep', '600']); time.sleep(0.5); os._exit(3)",
    ],
    ids=["child", "double-fork-setsid", "crashed-rank"],
)
def test_processes_a_test_starts_die_with_the_run(
    pytester: pytest.Pytester, run_pytest: RunPytest, how: str
) -> None:
    pytester.makepyfile(
        HEADER
        + f"""
import subprocess

@pytest.mark.world_size(2)
def test_starts(rank):
    if rank == 1:
        {how}
"""
    )
    result = run_pytest("-ra", "--distrank-failure-grace=1")
    assert result.ret in (0, 1), result.stdout.str()
    # The run_pytest fixture fails the test if any process of the run outlives it.


def test_session_fixture_teardown_hanging_at_stop_is_named(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(
        """
import os, time, pytest

@pytest.fixture(scope="session")
def slow_resource():
    yield "resource"
    if os.environ.get("RANK") == "1":
        time.sleep(600)
"""
    )
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_uses(rank, slow_resource):
    assert slow_resource == "other"  # fails: -x ends the session with the fixture set up

@pytest.mark.world_size(2)
def test_later(rank, slow_resource):
    pass
"""
    )
    result = run_pytest("-ra", "-x")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*distrank: errors tearing down fixtures at session end*",
            "rank 1/2 of pool world_size=2, backend=gloo did not finish tearing down its "
            "remaining fixtures (session, module, class scope) within 10 s and was killed; "
            "blocked in slow_resource at conftest.py:7",
        ]
    )


def test_a_tests_own_tcp_rendezvous_works_without_a_process_group(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
import socket

@pytest.mark.world_size(2, init_process_group=False)
@pytest.mark.timeout(60)
def test_own_tcp(rank, world_size, dist_store):
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dist_store.set("port", str(s.getsockname()[1]))
    port = dist_store.get("port").decode()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # left as torchrun sets it
    dist.destroy_process_group()

@pytest.mark.world_size(2, init_process_group=False)
def test_env_rendezvous_still_uses_the_plugins_store(rank, world_size):
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(passed=2)
