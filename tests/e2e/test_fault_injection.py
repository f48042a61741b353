"""End-to-end: ranks meant to die (``expect_rank_exit``) and faults injected at a chosen
collective (the ``faults`` fixture), in pool mode. A harness class's return code that expects a
signal is a case of tests/e2e/test_existing_suites.py (``TestAbort``), whose session imports
PyTorch's harness anyway (seconds).

The cases share one inner session (``INJECTION``), each followed, where it breaks its pool, by a
healthy test that must pass on a new pool; ``XDIST`` runs a kill and a raised fault under
``-n 2``. Every case is bounded: a 60 s deadline, 2 s for the hang.
"""

from __future__ import annotations

import pytest

from ..helpers import SharedSession
from .test_faults import HEADER, Session, healthy

CASES = (
    HEADER
    + """
from capture_off import loud


@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1, signal="SIGKILL")
def test_kill_met(rank):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
"""
    + healthy("kill_met")
    + """

@pytest.mark.world_size(3)
@pytest.mark.expect_rank_exit(rank=(1, 2), exit_code=3, match="last words of rank [12]")
def test_code_met(rank, capsys):
    if rank:
        loud(capsys, f"last words of rank {rank}")
        os._exit(3)
"""
    + healthy("code_met", 3)
    + """

@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1, signal="SIGKILL")
def test_survived(rank):
    pass


@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1, signal="SIGKILL")
def test_other_death(rank):
    if rank == 1:
        os._exit(5)
"""
    + healthy("other_death")
    + """

@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1, match="never written")
def test_no_match(rank):
    if rank == 1:
        os._exit(0)
"""
    + healthy("no_match")
    + """

@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1)
def test_unexpected_rank(rank):
    os._exit(9)
"""
    + healthy("unexpected_rank")
    + """

@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1, signal="SIGKILL", exit_code=3)
def test_bad_marker(rank):
    pass


@pytest.mark.world_size(3)
def test_fault_kill(rank, faults):
    faults.kill(rank=2, at="all_reduce", nth=2)
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 2:
        dist.all_reduce(t)
"""
    + healthy("fault_kill", 3)
    + """

@pytest.mark.world_size(2)
def test_kill_never(rank, faults):
    faults.kill(rank=1, at="all_reduce", nth=3)
    dist.all_reduce(torch.ones(1))


@pytest.mark.world_size(2)
def test_kill_optional(rank, faults):
    faults.kill(rank=1, at="all_reduce", nth=3, optional=True)
    dist.all_reduce(torch.ones(1))


@pytest.mark.world_size(2)
def test_raise(rank, faults):
    faults.raise_in(rank=1, at="broadcast", exc=ValueError("injected boom"))
    if rank == 1:
        with pytest.raises(ValueError, match="injected boom"):
            dist.broadcast(torch.ones(1), 0)


@pytest.mark.world_size(2)
def test_raise_never(rank, faults):
    faults.raise_in(rank=0, at="all_gather_into_tensor")


@pytest.mark.world_size(2)
def test_delay(rank, faults):
    faults.delay(rank=0, at="barrier", seconds=0.5)
    started = time.monotonic()
    dist.barrier()
    assert time.monotonic() - started >= 0.5


@pytest.mark.world_size(2)
def test_delay_never(rank, faults):
    faults.delay(rank=0, at="barrier", nth=2, seconds=0.5)
    dist.barrier()


@pytest.mark.world_size(2)
@pytest.mark.timeout(2)
def test_hang(rank, faults):
    faults.hang(rank=1, at="all_reduce")
    dist.all_reduce(torch.ones(1))
"""
    + healthy("hang")
    + """

@pytest.mark.world_size(2)
def test_hang_optional(rank, faults):
    faults.hang(rank=1, at="all_to_all", optional=True)


@pytest.mark.world_size(2)
def test_bad_call(rank, faults):
    faults.kill(rank=1, at="allreduce")

"""
)

#: Straight to the rank's log: captured output of a rank that dies is lost with it.
CAPTURE_OFF = """
def loud(capsys, text):
    with capsys.disabled():
        print(text, flush=True)
"""

INJECTION = Session(
    "test_fault_injection.INJECTION",
    {"test_cases.py": CASES, "capture_off.py": CAPTURE_OFF},
    ("-ra", "-rP", "--distrank-timeout=60", "--distrank-replay=off"),
)


def test_expected_deaths_pass_and_the_next_test_is_unaffected(
    shared_session: SharedSession,
) -> None:
    shared = INJECTION.run(shared_session)
    for case in ("kill_met", "code_met"):
        assert shared.outcomes(f"test_{case}", f"test_{case}_then_healthy") == ["passed"] * 2
    shared.about("test_kill_met").fnmatch_lines(
        ["pool killed after a fault: *rank 1 exited (SIGKILL(-9)) as expected in *"]
    )


def test_unmet_expectations_fail_saying_which(shared_session: SharedSession) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcomes("test_survived", "test_other_death", "test_no_match") == ["failed"] * 3
    marker = "@pytest.mark.expect_rank_exit(rank=1, signal='SIGKILL')"
    shared.section("test_survived").fnmatch_lines(
        [f"  rank 1/2  did not exit: it was expected to exit by SIGKILL ({marker}) but finished*"]
    )
    shared.section("test_other_death").fnmatch_lines(
        [
            "  rank 1/2  crashed in call with exit code 5, but it was expected to exit by "
            f"SIGKILL ({marker}), not exit code 5*"
        ]
    )
    shared.section("test_no_match").fnmatch_lines(
        ["*exited with exit code 0 as expected, but its last 50 lines of output do not match*"]
    )
    shared.section("test_unexpected_rank").fnmatch_lines(
        ["  rank 0/2  crashed in call with exit code 9*", "  rank 1/2  exited as expected*"]
    )
    assert shared.outcome("test_other_death_then_healthy") == "passed"


def test_a_bad_marker_is_an_error_of_its_test(shared_session: SharedSession) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcome("test_bad_marker") == "error at setup"
    shared.about("test_bad_marker").fnmatch_lines(
        ["*signal='SIGKILL' and exit_code=3 contradict each other*"]
    )


def test_a_fired_kill_is_an_expected_exit_listed_in_the_report(
    shared_session: SharedSession,
) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcomes("test_fault_kill", "test_fault_kill_then_healthy") == ["passed"] * 2
    shared.section("test_fault_kill").fnmatch_lines(
        [
            "injected: SIGKILL to rank 2 at all_reduce #2 (the 2nd all_reduce, #2 on the default "
            "group), * s into call (faults.kill(rank=2, at='all_reduce', nth=2, signal='SIGKILL'))"
        ]
    )


def test_faults_that_never_fired_fail_unless_optional(shared_session: SharedSession) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcome("test_kill_never") == "passed, error at teardown"
    shared.section("test_kill_never").fnmatch_lines(
        [
            "*faults.kill(rank=1, at='all_reduce', nth=3, signal='SIGKILL') never fired: rank 1 "
            "issued 1 all_reduce (on the default group) since the test started*"
        ]
    )
    assert shared.outcome("test_raise_never") == "passed, error at teardown"
    assert shared.outcome("test_delay_never") == "passed, error at teardown"
    assert shared.outcomes("test_kill_optional", "test_hang_optional") == ["passed"] * 2


def test_raised_and_delayed_faults_fire(shared_session: SharedSession) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcomes("test_raise", "test_delay") == ["passed"] * 2
    shared.section("test_raise").fnmatch_lines(
        ["injected: ValueError raised on rank 1 at broadcast #1 (the 1st broadcast, *"]
    )
    shared.section("test_delay").fnmatch_lines(["injected: 0.5 s delay of rank 0 at barrier #1 *"])


def test_a_hang_is_ended_by_the_deadline_and_named(shared_session: SharedSession) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcomes("test_hang", "test_hang_then_healthy") == ["failed", "passed"]
    shared.section("test_hang").fnmatch_lines(
        ["*timed out in call after 2 s*", "injected: hang of rank 1 at all_reduce #1 *"]
    )


def test_a_bad_call_fails_its_test_naming_the_value(shared_session: SharedSession) -> None:
    shared = INJECTION.run(shared_session)
    assert shared.outcome("test_bad_call") == "failed"
    shared.section("test_bad_call").fnmatch_lines(["*unknown op 'allreduce'; at= takes one of*"])


XDIST_CASES = (
    HEADER
    + """
@pytest.mark.world_size(2)
def test_kill(rank, faults):
    faults.kill(rank=1, at="barrier")
    if rank == 1:
        dist.barrier()
    else:
        with pytest.raises(RuntimeError):  # gloo: "Connection closed by peer"
            dist.barrier()


@pytest.mark.world_size(2)
def test_raise(rank, faults):
    faults.raise_in(rank=0, at="all_reduce", nth=2)
    dist.all_reduce(torch.ones(1))
    if rank == 0:
        with pytest.raises(RuntimeError, match="injected by faults.raise_in"):
            dist.all_reduce(torch.ones(1))


@pytest.mark.flaky(reruns=1)
@pytest.mark.world_size(2)
def test_fault_then_rerun(rank, faults):
    # The first attempt arms a fault on rank 0; the rerun, on all its ranks, arms none.
    first = pathlib.Path(f"attempt-{rank}")
    if not first.exists():
        first.write_text("1")
        faults.raise_in(rank=0, at="all_reduce")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""
    + healthy("raise")
)


def test_faults_under_xdist(shared_session: SharedSession) -> None:
    shared = Session(
        "test_fault_injection.XDIST", {"test_cases.py": XDIST_CASES}, ("-n", "2", "-ra")
    ).run(shared_session)
    assert shared.outcomes("test_kill", "test_raise", "test_raise_then_healthy") == ["passed"] * 3
    # pytest-rerunfailures: the failed attempt (the fault fired) is rerun, faults disarmed.
    # (junit lists both attempts: the summary line says how it ended.)
    shared.result.stdout.fnmatch_lines(["*= 4 passed, 1 rerun in *"])


@pytest.mark.parametrize("case", ["code_met", "no_match"])
def test_no_rank_outlives_its_session(shared_session: SharedSession, case: str) -> None:
    assert INJECTION.run(shared_session).leftover == []
