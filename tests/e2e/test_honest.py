"""End-to-end: a PASS rests on evidence from every rank, and reports belong to their test.

The honest-outcomes issue (#11), items 1-4: a rank killed before its setup began or after its
teardown is not a pass; reports sent from a forked process are not credited to any test; a
collective one rank left unmatched fails the test that left it; a rank that died between tests
does not end the session. Each case is followed by healthy tests on a working pool.

The cases share one inner session (``HONEST``; a failure grace of 0.5 s, a session deadline of
1e308 s from the command line, 60 s by marker for every case that can hang), except those whose
session-wide options would change the others: they run in the sessions ``NO_RECORDER`` of
tests/e2e/test_faults.py and ``ERRORS`` of tests/e2e/test_errors.py, which run beside
``HONEST``, at the same time (``Session.beside``; a file that runs them too reuses them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..helpers import SharedSession
from .test_errors import ERRORS
from .test_faults import (
    HEADER,
    NO_RECORDER,
    Session,
    Shared,
    check_huge_deadline,
    healthy,
    huge_deadline_case,
)

#: A conftest whose protocol wrapper blocks rank 1 before test_sleepy_before, after
#: test_sleepy_after.
SLEEPY_CONFTEST = """
import os, time, pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if os.environ.get("RANK") == "1" and item.name == "test_sleepy_before":
        time.sleep(600)
    result = yield
    if os.environ.get("RANK") == "1" and item.name == "test_sleepy_after":
        time.sleep(600)
    return result
"""

HONEST_CASES = (
    HEADER
    + """
pytestmark = pytest.mark.timeout(60)


@pytest.mark.world_size(2)
@pytest.mark.timeout(2)
def test_sleepy_before(rank):
    assert rank == 0
"""
    + healthy("sleepy_before")
    + """

@pytest.mark.world_size(2)
@pytest.mark.timeout(2)
def test_sleepy_after(rank):
    pass
"""
    + healthy("sleepy_after")
    + """

@pytest.mark.world_size(2)
def test_forks(rank):
    if rank == 1:
        os.fork()  # the child returns into pytest and runs the rest of the protocol


@pytest.mark.world_size(2)
def test_next(rank):
    assert rank != 1
"""
    + healthy("next")
    + """

@pytest.mark.world_size(2)
def test_alarm(rank):
    if rank == 1:
        signal.alarm(1)  # never cancelled: SIGALRM kills rank 1 while it is idle


def test_ordinary_wait():
    time.sleep(1.5)  # rank 1's alarm comes 1 s after it was set


@pytest.mark.world_size(2)
def test_after(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2


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


@pytest.mark.world_size(3)
def test_p2p(rank, pg):
    if rank == 0:
        dist.send(torch.ones(1), 1)
    elif rank == 1:
        dist.recv(torch.zeros(1), 0)


@pytest.mark.world_size(3)
def test_then_collective(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 3


@pytest.mark.world_size(2)
def test_stop_by_exit(rank):
    if rank == 1:
        pytest.exit("database gone", returncode=3)
"""
    + healthy("stop_by_exit")
    + """

@pytest.mark.world_size(2)
def test_stop_by_interrupt(rank):
    if rank == 1:
        raise KeyboardInterrupt
"""
    + healthy("stop_by_interrupt")
    + """

@pytest.mark.world_size(2)
def test_steps(rank, pg, subtests):
    for i in range(3):
        with subtests.test(msg="step", i=i):
            time.sleep(0.75)  # longer than the grace period (0.5 s)
            t = torch.ones(1)
            dist.all_reduce(t, group=pg)
            assert not (rank == 1 and i == 0), "rank 1 fails step 0"
"""
    + healthy("steps")
    + """

import socket


@pytest.mark.world_size(2, init_process_group=False)
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

#: Each case writes the pid of the process it leaves behind to $PIDS/<case>.
PROCESSES = {
    "child": "pid = subprocess.Popen(['sleep', '600']).pid",
    # a daemon: its own session, its parent gone (re-parented to the rank, a subreaper)
    "daemon": (
        "subprocess.Popen(['setsid', 'sh', '-c', "
        "f'sleep 600 & echo $! > {PIDS}/daemon; exit 0']).wait(); pid = None"
    ),
    # a rank that crashes after starting a child in a session of its own
    "crash": "pid = subprocess.Popen(['setsid', 'sleep', '600']).pid",
}
PROCESSES_CASES = (
    HEADER
    + """
import subprocess

PIDS = os.environ["PIDS"]
pytestmark = pytest.mark.timeout(60)
"""
    + "".join(
        f"""

@pytest.mark.world_size(2)
def test_starts_{case}(rank):
    if rank == 1:
        {how}
        if pid is not None:
            pathlib.Path(PIDS, "{case}").write_text(str(pid))
        if "{case}" == "crash":
            time.sleep(0.5)
            os._exit(3)
"""
        for case, how in PROCESSES.items()
    )
)

WARNINGS_CASE = (
    HEADER
    + """
import threading, warnings

pytestmark = pytest.mark.timeout(60)


@pytest.mark.world_size(2)
def test_warns(rank):
    warnings.warn("deprecated thing", DeprecationWarning)
    if rank == 1:
        t = threading.Thread(target=lambda: 1 / 0)
        t.start()
        t.join()
"""
)

#: DeepSpeed's way (issue 38): a session-scoped autouse fixture warns in the controller (for
#: the ordinary test) and in every rank (for the distributed one, which runs first). The same
#: words from another line in the ranks and the controller are two warnings; what rank 1 alone
#: says names rank 1.
WARNED_CONFTEST = """
import os, warnings, pytest


@pytest.fixture(scope="session", autouse=True)
def check_environment():
    warnings.warn("environment looks odd", UserWarning)
    if os.environ.get("RANK") == "1":
        warnings.warn("rank 1 looks odd too", UserWarning)
    if "RANK" in os.environ:
        warnings.warn("said from two lines", UserWarning)
    else:
        warnings.warn("said from two lines", UserWarning)
"""

WARNED_CASE = """
import pytest


@pytest.mark.world_size(2)
def test_warned_in_ranks(rank):
    pass


def test_warned_in_the_controller():
    pass
"""

#: No timeout marker: the deadline is the command line's 1e308 s.
HUGE_OPTION_CASE = HEADER + huge_deadline_case("huge_option")

HONEST = Session(
    "test_honest.HONEST",
    {
        "conftest.py": SLEEPY_CONFTEST,
        "test_cases.py": HONEST_CASES,
        "test_processes.py": PROCESSES_CASES,
        "test_warnings.py": WARNINGS_CASE,
        "warned/conftest.py": WARNED_CONFTEST,
        "warned/test_warned.py": WARNED_CASE,
        "test_huge_option.py": HUGE_OPTION_CASE,
        "pids/.keep": "",
    },
    ("-ra", "-v", "--distrank-failure-grace=0.5", "--distrank-timeout=1e308"),
    {"PIDS": "{folder}/pids"},
    beside=(NO_RECORDER, ERRORS),
)


@pytest.fixture
def honest(shared_session: SharedSession) -> Shared:
    return HONEST.run(shared_session)


def test_rank_stuck_before_its_setup_is_not_a_pass(honest: Shared) -> None:
    tests = ("test_sleepy_before", "test_sleepy_before_then_healthy")
    # Its setup never ran on rank 1: an error at setup, as pytest reports a setup that failed.
    assert honest.outcomes(*tests) == ["error at setup", "passed"]
    honest.section("test_sleepy_before").fnmatch_lines(
        [
            "  rank 0/2  passed",
            "  rank 1/2  timed out before its setup began after 2 s; blocked in "
            "pytest_runtest_protocol at conftest.py:*",
        ]
    )
    honest.about("test_sleepy_before").fnmatch_lines(
        [
            "ERROR *::test_sleepy_before - [[]rank 1/2[]] Timeout: its setup had not begun "
            "after 2 s (timeout from @pytest.mark.timeout(2))",
        ]
    )
    assert honest.result.ret == 1


def test_rank_stuck_after_its_teardown_is_not_a_pass(honest: Shared) -> None:
    tests = ("test_sleepy_after", "test_sleepy_after_then_healthy")
    # Setup and call passed on both ranks; the error is reported at teardown, as pytest does.
    assert honest.outcomes(*tests) == ["passed, error at teardown", "passed"]
    honest.section("test_sleepy_after").fnmatch_lines(
        [
            "  rank 1/2  timed out after its teardown, before its reports were sent after 2 s; "
            "blocked in pytest_runtest_protocol at conftest.py:*",
        ]
    )


def test_a_tiny_deadline_fails_every_test(shared_session: SharedSession) -> None:
    """DISTRANK_TIMEOUT=1e-9 in the NO_RECORDER session: its tests without a timeout marker.
    The deadline may pass in setup or in call, as the ranks' setup reports come before or
    after the controller's first look (a loaded clean-clone CI saw 'error at setup' once):
    either fails the test."""
    no_recorder = HONEST.run_beside(shared_session, NO_RECORDER)
    outcomes = no_recorder.outcomes("test_tiny", "test_tiny_then_healthy")
    assert all(o in ("failed", "error at setup") for o in outcomes), outcomes
    # FAILED, or ERROR at setup: the -ra line says why either way.
    no_recorder.about("test_tiny").fnmatch_lines(["*::test_tiny - *Timeout: * 1e-09 s *"])


def test_reports_from_a_forked_test_process_are_not_credited(honest: Shared) -> None:
    tests = ("test_forks", "test_next", "test_next_then_healthy")
    assert honest.outcomes(*tests) == ["failed", "failed", "passed"]
    text = "\n".join(honest.section("test_forks").lines)
    # Rank 1 names the fork still running its code when the test ended or, if the child got
    # its reports out first, the controller names the pid they came from.
    forked = r"rank 1/2\s+forked pid \d+ which still ran the rank's own code when the test ended"
    foreign = r"rank 1/2\s+sent reports from pid \d+, not its own \(\d+\)"
    assert re.search(forked, text) or re.search(foreign, text), text
    honest.about("test_forks").fnmatch_lines(["FAILED *::test_forks - [[]rank 1/2[]] *"])
    honest.about("test_next").fnmatch_lines(["FAILED *::test_next - *assert 1 != 1"])


def test_rank_dead_between_tests_does_not_end_the_run(honest: Shared) -> None:
    tests = ("test_alarm", "test_ordinary_wait", "test_after")
    assert honest.outcomes(*tests) == ["passed", "passed", "passed"]
    honest.about("test_alarm").fnmatch_lines(
        [
            "pool killed after a fault: world_size=2, backend=gloo: rank 1/2 (pid *) died while "
            "idle (SIGALRM(-14)), after *::test_alarm",
        ]
    )
    assert "INTERNALERROR" not in honest.text


def test_unmatched_collective_fails_the_test_that_left_it(honest: Shared) -> None:
    tests = ("test_culprit", "test_innocent", "test_point_to_point_is_not_a_desync")
    assert honest.outcomes(*tests) == ["failed", "passed", "passed"]
    honest.section("test_culprit").fnmatch_lines(
        [
            "  rank 0/2  issued 1 more collective than its peers on the default group: an "
            "unmatched collective (its last: gloo:all_reduce)  <- root cause",
            "  rank 1/2  passed",
        ]
    )


def test_point_to_point_on_some_ranks_keeps_the_pool(honest: Shared) -> None:
    """World size 3 (was parametrized with it); the session's only pool of that size."""
    assert honest.outcomes("test_p2p", "test_then_collective") == ["passed", "passed"]
    assert "pool killed after a fault: world_size=3" not in honest.text


@pytest.mark.parametrize(
    ("session", "test", "source"),
    [
        (ERRORS, "test_huge_pytest_timeout", "--timeout=3000000* (pytest-timeout, command line)"),
        (NO_RECORDER, "test_huge_marker", "@pytest.mark.timeout(10**7)"),
        (HONEST, "test_huge_option", "--distrank-timeout=1e308 (command line)"),
    ],
    ids=["pytest-timeout-3000000", "marker-1e7", "option-1e308"],
)
def test_huge_deadline_means_no_deadline(
    shared_session: SharedSession, session: Session, test: str, source: str
) -> None:
    """DISTRANK_TIMEOUT=inf is checked in tests/e2e/test_faults.py, whose ``EXITFIRST``
    session holds it (a session that file runs anyway)."""
    shared = (
        HONEST.run(shared_session)
        if session is HONEST
        else HONEST.run_beside(shared_session, session)
    )
    check_huge_deadline(shared, test, source)


@pytest.mark.parametrize(
    ("test", "line"),
    [
        (
            "test_stop_by_exit",
            "*stopped serving in call: pytest.exit('database gone') was called in "
            "*::test_stop_by_exit (returncode=3)*",
        ),
        ("test_stop_by_interrupt", "*stopped serving in call: KeyboardInterrupt was raised in *"),
    ],
    ids=["pytest-exit", "keyboard-interrupt"],
)
def test_session_ending_exception_in_a_rank_says_so(honest: Shared, test: str, line: str) -> None:
    assert honest.outcomes(test, f"{test}_then_healthy") == ["failed", "passed"]
    honest.section(test).fnmatch_lines([line])
    assert "exit code 0" not in honest.text


def test_failed_subtest_is_not_the_end_of_a_ranks_test(honest: Shared) -> None:
    pytest.importorskip("_pytest.subtests", reason="the subtests fixture is pytest 9's")
    assert honest.outcome("test_steps_then_healthy") == "passed"
    about = honest.about("test_steps")
    # As plain pytest reports subtests: the later ones ran on every rank and passed.
    about.fnmatch_lines(
        [
            "*::test_steps SUBPASSED[[]step[]] (i=*2*) *",
            "SUBFAILED[[]step[]] (i=*0*) *::test_steps - [[]rank 1/2[]] AssertionError: rank 1 "
            "fails step 0",
            "FAILED *::test_steps - [[]rank 1/2[]] contains 1 failed subtest",
        ]
    )
    # 2 failed (the subtest and the test), 2 subtests passed.
    assert len([line for line in about.lines if " SUBPASSED" in line]) == 2, about.lines
    assert len([line for line in about.lines if line.startswith("SUBFAILED")]) == 1
    assert len([line for line in about.lines if line.startswith("FAILED")]) == 1
    # No peer was ended after the grace period.
    assert not [line for line in about.lines if "killed" in line], about.lines
    honest.section("test_steps").no_fnmatch_line("*killed*")


def test_warnings_in_ranks_reach_the_warnings_summary(honest: Shared) -> None:
    assert honest.outcome("test_warns") == "passed"
    summary = honest.text.split(" warnings summary ", 1)[1].split("-- Docs: ", 1)[0]
    assert summary.count("test_warnings.py::test_warns") == 2, summary  # two warnings
    pytest.LineMatcher(summary.splitlines()).fnmatch_lines(
        [
            "*test_warnings.py:*: DeprecationWarning: deprecated thing",
            "*PytestUnhandledThreadExceptionWarning: [[]rank 1/2[]] Exception in thread *",
            "*ZeroDivisionError: division by zero",
        ]
    )


def test_a_warning_of_the_controller_and_every_rank_is_shown_once(honest: Shared) -> None:
    tests = ("test_warned_in_ranks", "test_warned_in_the_controller")
    assert honest.outcomes(*tests) == ["passed", "passed"]
    summary = honest.text.split(" warnings summary ", 1)[1].split("-- Docs: ", 1)[0]
    groups = [group.splitlines() for group in summary.strip("= \n").split("\n\n")]
    odd = [group for group in groups if any("environment looks odd" in line for line in group)]
    assert len(odd) == 1, summary
    pytest.LineMatcher(odd[0]).fnmatch_lines(
        [
            "warned/test_warned.py::test_warned_in_ranks",
            "warned/test_warned.py::test_warned_in_the_controller",
            "  *conftest.py:7: UserWarning: environment looks odd",
        ]
    )
    pytest.LineMatcher(summary.splitlines()).fnmatch_lines(
        ["warned/test_warned.py::test_warned_in_ranks", "  *: [[]rank 1/2[]] rank 1 looks odd too"]
    )
    # The same words from two lines: two warnings, each once.
    two = re.findall(r"conftest\.py:(\d+): UserWarning: said from two lines", summary)
    assert sorted(two) == ["11", "13"], summary


@pytest.mark.parametrize(
    ("case", "outcome"),
    [("child", "passed"), ("daemon", "passed"), ("crash", "failed")],
    ids=["child", "double-fork-setsid", "crashed-rank"],
)
def test_processes_a_test_starts_die_with_the_run(honest: Shared, case: str, outcome: str) -> None:
    """The process the case left behind is gone when the session ends (the leak check of
    ``run_pytest`` also fails the test that ran the session if any process is left)."""
    assert honest.outcome(f"test_starts_{case}") == outcome
    assert honest.result.ret in (0, 1), honest.text
    pid = int(Path(honest.folder, "pids", case).read_text())
    assert pid not in honest.leftover, f"{case}: pid {pid} outlived the session"


def test_a_tests_own_tcp_rendezvous_works_without_a_process_group(honest: Shared) -> None:
    tests = ("test_own_tcp", "test_env_rendezvous_still_uses_the_plugins_store")
    assert honest.outcomes(*tests) == ["passed", "passed"]
