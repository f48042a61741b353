"""End-to-end: ranks meant to die (``expect_rank_exit``) and faults injected at a chosen
collective (the ``faults`` fixture), in pool mode. A harness class's return code that expects a
signal is a case of tests/e2e/test_existing_suites.py (``TestAbort``), whose session imports
PyTorch's harness anyway (seconds).

The cases share one inner session (``INJECTION``), each followed, where it breaks its pool, by a
healthy test that must pass on a new pool; ``XDIST`` runs a kill and a raised fault under
``-n 2``. Every case is bounded: a 60 s deadline, 2 s for the hang. A kill whose signal a
handler takes is checked in a plain process (no session).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ..helpers import SharedSession
from .test_faults import HEADER, Session, healthy

CASES = (
    HEADER
    + """
from capture_off import loud
from pytest_distrank import assert_equal_across_ranks, reference


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


@pytest.mark.world_size(2)
@pytest.mark.expect_rank_exit(rank=1, exit_code=3)
def test_marker_and_kill(rank, faults):
    faults.kill(rank=1, at="barrier")
    if rank == 1:
        dist.barrier()


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
    if rank == 0:  # the delayed rank (its peer may start its clock after the delay began)
        assert time.monotonic() - started >= 0.5


@pytest.mark.world_size(2)
@pytest.mark.distrank_isolate  # fresh ranks: no earlier test imported it
def test_delay_imports_no_dynamo(rank, faults):
    faults.delay(rank=0, at="all_reduce", seconds=0.01)
    dist.all_reduce(torch.ones(1))
    assert "torch._dynamo" not in sys.modules


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


@pytest.mark.world_size(2)
def test_kill_after_a_check(rank, faults):
    faults.kill(rank=1, at="all_gather", nth=1)
    assert_equal_across_ranks(torch.ones(2), name="weights")  # the plugin's all_gathers
    out = [torch.zeros(1), torch.zeros(1)]
    if rank == 0:
        with pytest.raises(RuntimeError):  # gloo: "Connection closed by peer"
            dist.all_gather(out, torch.ones(1))
    else:
        dist.all_gather(out, torch.ones(1))
"""
    + healthy("kill_after_a_check")
    + """

@pytest.mark.world_size(2)
def test_raise_after_a_reference(rank, faults):
    faults.raise_in(rank=1, at="all_reduce", nth=1)
    assert reference(lambda: dist.all_reduce(torch.ones(1)) or 1) == 1  # its own world's
    if rank == 1:
        with pytest.raises(RuntimeError, match="injected"):
            dist.all_reduce(torch.ones(1))


@pytest.mark.world_size(3)
def test_fault_on_a_subgroup(rank, faults):
    faults.raise_in(rank=1, at="all_reduce", nth=2)
    sub = dist.new_group([1, 2])
    dist.all_reduce(torch.ones(1))
    if rank:
        dist.all_reduce(torch.ones(1), group=sub)
    if rank == 1:
        with pytest.raises(RuntimeError, match="injected"):
            dist.all_reduce(torch.ones(1), group=sub)
    dist.destroy_process_group(sub)


@pytest.mark.world_size(2, init_process_group=False)
def test_fault_in_a_world_made_after_the_fixture(rank, faults):
    faults.raise_in(rank=1, at="barrier", nth=2)
    dist.init_process_group("gloo")  # env://, from the variables the plugin set
    dist.barrier()
    if rank == 1:
        with pytest.raises(RuntimeError, match="injected"):
            dist.barrier()
    dist.destroy_process_group()


@pytest.mark.world_size(2)
@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2"])
def test_kill_by_a_rank_signal(rank, faults, sig):
    faults.kill(rank=1, at="barrier", signal=sig)
    if rank == 1:
        dist.barrier()
"""
    + healthy("kill_by_a_rank_signal")
    + """

@pytest.mark.world_size(2)
def test_kill_by_a_handled_signal(rank, faults):
    faults.kill(rank=1, at="barrier", signal="SIGTERM")
    if rank == 1:
        signal.signal(signal.SIGTERM, lambda *args: None)  # the test's: not for a kill
        dist.barrier()


@pytest.mark.world_size(2)
@pytest.mark.parametrize("sig", ["SIGCHLD", "SIGTSTP"])
def test_kill_by_a_signal_that_does_not_end(rank, faults, sig):
    faults.kill(rank=1, at="barrier", signal=sig)
"""
    + healthy("kill_by_a_signal_that_does_not_end")
    + """
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
    assert (
        shared.outcomes(
            "test_survived", "test_other_death", "test_no_match", "test_marker_and_kill"
        )
        == ["failed"] * 4
    )
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
        [
            "  rank 1/2  crashed in call with exit code 0, but it printed nothing matching 'never "
            "written' in its last 50 lines of output (*expects it with the exit code 0 it exited*"
        ]
    )
    # Hostile review a, f7: the kill's expectation replaced the marker's; both count.
    shared.section("test_marker_and_kill").fnmatch_lines(
        [
            "  rank 1/2  crashed *, but it was expected to exit with code 3 "
            "(@pytest.mark.expect_rank_exit(rank=1, exit_code=3)), not SIGKILL(-9)*"
        ]
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
            "injected: SIGKILL to rank 2 at all_reduce #2 on the default group (its 2nd "
            "all_reduce), * s into call (faults.kill(rank=2, at='all_reduce', nth=2, "
            "signal='SIGKILL'))"
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
        ["injected: ValueError raised on rank 1 at broadcast #1 on the default group (its 1st *"]
    )
    shared.section("test_delay").fnmatch_lines(
        ["injected: 0.5 s delay of rank 0 at barrier #1 on the default group *"]
    )


def test_the_faults_mode_imports_no_dynamo(shared_session: SharedSession) -> None:
    """torch's wrapper of a dispatch mode imports torch._dynamo at its first op: ~2 s of CPU in
    every fresh rank, where fault tests kill ranks (api/faults.py)."""
    shared = INJECTION.run(shared_session)
    assert shared.outcomes("test_delay_imports_no_dynamo") == ["passed"]


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


def test_the_plugins_own_collectives_are_not_counted(shared_session: SharedSession) -> None:
    """A check across ranks (its twin group's all_gathers) and a reference (its one-rank
    world's all_reduce) before the test's first op of that kind: the fault fires at the test's
    own first one (hostile-4 D9)."""
    shared = INJECTION.run(shared_session)
    cases = ("test_kill_after_a_check", "test_kill_after_a_check_then_healthy")
    assert shared.outcomes(*cases, "test_raise_after_a_reference") == ["passed"] * 3
    shared.section("test_kill_after_a_check").fnmatch_lines(
        [
            "injected: SIGKILL to rank 1 at all_gather #1 on the default group (its 1st "
            "all_gather), * s into call (*)"
        ]
    )
    shared.section("test_raise_after_a_reference").fnmatch_lines(
        ["injected: RuntimeError raised on rank 1 at all_reduce #1 on the default group *"]
    )
    # A test's world made after the fixture's setup is the test's, not a reference's.
    assert shared.outcome("test_fault_in_a_world_made_after_the_fixture") == "passed"
    shared.section("test_fault_in_a_world_made_after_the_fixture").fnmatch_lines(
        ["injected: RuntimeError raised on rank 1 at barrier #2 on the default group (its 2nd *"]
    )


def test_a_fault_names_its_group_and_counts_as_the_verdicts_do(
    shared_session: SharedSession,
) -> None:
    """The 2nd all_reduce on a subgroup, the rank's 3rd: named by its members and both counts
    (hostile-4 D19)."""
    shared = INJECTION.run(shared_session)
    assert shared.outcome("test_fault_on_a_subgroup") == "passed"
    shared.section("test_fault_on_a_subgroup").fnmatch_lines(
        [
            "injected: RuntimeError raised on rank 1 at all_reduce #2 on the group of ranks 1, 2 "
            "(its 2nd all_reduce there, its 3rd in all), * s into call (*)"
        ]
    )


def test_a_kill_ends_the_rank_by_its_signal_or_is_refused(shared_session: SharedSession) -> None:
    """SIGUSR1 and SIGUSR2 (a rank's dump signals) and a signal the test handles end the rank
    by that signal, as expected; a signal that ignores or stops is refused at arming, naming it
    and why, and breaks no pool (hostile-4 D10)."""
    shared = INJECTION.run(shared_session)
    killed = [f"test_kill_by_a_rank_signal[{sig}]" for sig in ("SIGUSR1", "SIGUSR2")]
    killed += ["test_kill_by_a_handled_signal", "test_kill_by_a_rank_signal_then_healthy"]
    assert shared.outcomes(*killed) == ["passed"] * 4
    shared.about("test_kill_by_a_rank_signal[SIGUSR2]").fnmatch_lines(
        ["pool killed after a fault: *rank 1 exited (SIGUSR2(-12)) as expected in *"]
    )
    refused = [f"test_kill_by_a_signal_that_does_not_end[{sig}]" for sig in ("SIGCHLD", "SIGTSTP")]
    assert shared.outcomes(*refused) == ["failed"] * 2
    shared.section(refused[0]).fnmatch_lines(
        [
            "*faults.kill(rank=1, at='barrier', nth=1, signal='SIGCHLD'): SIGCHLD is ignored "
            "by default*"
        ]
    )
    shared.section(refused[1]).fnmatch_lines(["*SIGTSTP stops a process without ending it*"])
    assert shared.outcome("test_kill_by_a_signal_that_does_not_end_then_healthy") == "passed"
    broken = [line for line in shared.result.outlines if line.startswith("pool killed")]
    assert not [line for line in broken if "does_not_end" in line], broken


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


#: A "rank" whose kill fires in a thread while the test's SIGTERM handler is set: the handler
#: takes the signal (only the main thread may reset it); the kit's notes go to stdout.
HANDLED_IN_A_THREAD = """
import signal, sys, threading
from pytest_distrank.api import faults
from pytest_distrank.api.faultplan import make_fault
from pytest_distrank.rank.context import set_channel

set_channel(lambda *note: print(repr(note), flush=True))
signal.signal(signal.SIGTERM, lambda *args: None)
fault = make_fault("kill", 2, rank=1, at="barrier", signal_="SIGTERM", call="C")
thread = threading.Thread(target=faults._die, args=(fault, "line", "call"))
thread.start()
thread.join()
sys.exit(3)
"""


@pytest.mark.timeout(30)
def test_a_kill_whose_signal_does_not_end_the_rank_ends_it_by_an_announced_sigkill() -> None:
    """A handler the kit cannot reset takes the signal: the rank announces SIGKILL as its
    expected exit, then dies by it, so the kit never fails a test for the exit it produced
    (hostile-4 D10)."""
    done = subprocess.run(
        [sys.executable, "-c", HANDLED_IN_A_THREAD], capture_output=True, text=True, timeout=25
    )
    assert done.returncode == -signal.SIGKILL, done
    why = (
        "C: SIGTERM did not end the rank within 2 s (a handler the kit cannot reset took it), "
        "so the kit ended it by SIGKILL"
    )
    assert done.stdout.splitlines() == [repr((-9, why, "", "call"))], done
