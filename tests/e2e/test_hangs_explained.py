"""End-to-end: a hung test says which collective each rank is in and who is out of step, and a
deadlock its flight records prove ends early.

The ranks' flight recorders (PyTorch's, on by default with gloo) are read when the deadline or
the failure grace ends a test: a thread in each rank answers while its main thread is stuck in
C++. The cases share the inner sessions of tests/e2e/test_faults.py: ``DEADLINE`` (a 4 s deadline,
no grace, ``--distrank-deadlocks=wait``: the deadline path), ``FAULTS`` (the default grace) and
``NO_RECORDER`` (TORCH_FR_BUFFER_SIZE=0); the deadlocks that end early share ``DEADLOCKS``.
"""

from __future__ import annotations

import pytest

from ..helpers import SharedSession
from .test_faults import (
    DEADLINE,
    DEADLINE_CASES,
    FAULTS,
    NO_RECORDER,
    Session,
    Shared,
    line_of,
)


def test_a_rank_that_never_enters_the_collective_is_named(shared_session: SharedSession) -> None:
    deadline = DEADLINE.run(shared_session)
    assert deadline.outcome("test_missing") == "failed"
    sleep = line_of(DEADLINE_CASES, "missing: rank 2 blocked here")
    reduce = line_of(DEADLINE_CASES, "missing: the others blocked here")
    deadline.section("test_missing").fnmatch_lines(
        [
            "collectives: ranks 0, 1 wait in all_reduce #2 on the default group; rank 2 never "
            f"entered it: it is blocked in test_missing at test_cases.py:{sleep} (after "
            "all_reduce #1)",
            # Rank 0 only waited for rank 2 (collateral); rank 2 is the root cause (issue 28).
            "  rank 0/3  waited in all_reduce #2 on the default group for rank 2; timed out in "
            "call after 4 s",
            "  rank 2/3  timed out in call after 4 s; blocked in test_missing at "
            f"test_cases.py:{sleep}  <- root cause",
            "*- traceback of rank 0/3 -*",
            "rank 0/3: Timeout: still in call after 4 s *",
            "in all_reduce #2 on the default group (float32[[]4[]]); blocked in all_reduce at *, "
            f"called from test_missing at test_cases.py:{reduce}",
        ]
    )


def test_ranks_in_different_collectives_are_a_mismatch(shared_session: SharedSession) -> None:
    deadline = DEADLINE.run(shared_session)
    assert deadline.outcome("test_collective_mismatch") == "failed"
    # --distrank-deadlocks=wait: the proven deadlock waits for its deadline, as it did before.
    deadline.section("test_collective_mismatch").no_fnmatch_line("*a deadlock*")
    deadline.section("test_collective_mismatch").fnmatch_lines(
        [
            "collectives: rank 1 entered broadcast #2 while rank 0 entered all_reduce #2 (the "
            "default group)",
            "  rank 1/2  timed out in call after 4 s; in broadcast #2 on the default group "
            "(float32[[]4[]]); *",
        ]
    )


def test_a_shape_mismatch_that_aborts_a_rank_names_the_collective_and_the_peers_tensors(
    shared_session: SharedSession,
) -> None:
    deadline = DEADLINE.run(shared_session)
    assert deadline.outcome("test_shapes") == "failed"
    line = line_of(DEADLINE_CASES, "shapes: rank 0 aborts here")
    # gloo aborts the rank that receives more bytes than it passed (rank 0 here), silently.
    deadline.section("test_shapes").fnmatch_lines(
        [
            "collectives: rank 0 crashed (SIGABRT(-6)) inside all_reduce, called from "
            f"test_shapes at test_cases.py:{line}; rank 1 was in all_reduce #2 on the default "
            "group (float32[[]8[]]): gloo aborts a rank that receives a different size than it "
            "passed, so compare the tensors (shape, dtype) each rank passes to this all_reduce",
            "  rank 0/2  crashed in call with SIGABRT(-6) inside all_reduce  <- root cause",
        ]
    )


def test_after_a_failure_the_waiting_ranks_say_who_left(shared_session: SharedSession) -> None:
    faults = FAULTS.run(shared_session)
    assert faults.outcome("test_one_rank_fails") == "failed"
    faults.section("test_one_rank_fails").fnmatch_lines(
        [
            "collectives: rank 0 waits in all_reduce #1 on the default group; rank 1 never "
            "entered it: it left the test",
            "  rank 0/2  killed in call * after rank 1 failed; in all_reduce #1 on the default "
            "group (float64[[]2[]]); blocked in all_reduce at *",
        ]
    )


def test_without_the_flight_recorder_the_stacks_still_say_where(
    shared_session: SharedSession,
) -> None:
    no_recorder = NO_RECORDER.run(shared_session)
    assert no_recorder.outcome("test_unrecorded") == "failed"
    no_recorder.section("test_unrecorded").fnmatch_lines(
        ["  rank 0/2  timed out in call after 3 s; blocked in all_reduce at *"]
    )
    assert "collectives:" not in no_recorder.text  # the session runs without flight recorders


#: Issue 28: deadlocks the flight records prove end within seconds of a 60 s deadline, with the
#: root cause in the head, ``-ra`` and junit's message; slow ranks and legal uneven sizes pass.
#: A clock test before and after each deadlock measures how long it took.
DEADLOCK_CASES = """import os, pathlib, time, pytest, torch, torch.distributed as dist

CLOCK = pathlib.Path(os.environ["DEADLOCK_CLOCK"])
CLOCK.mkdir(exist_ok=True)


def clock(name):
    (CLOCK / name).write_text(repr(time.time()))


def test_clock_0():
    clock("0")


@pytest.mark.world_size(4)
def test_rank_two_leaves(rank, pg):
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank != 2:
        dist.all_reduce(t)  # leaves: the others wait here


def test_clock_1():
    clock("1")


@pytest.mark.world_size(4)
def test_op_mismatch(rank, pg):
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 1:
        dist.broadcast(t, 0)
    else:
        dist.all_gather([torch.empty(2) for _ in range(4)], t)


def test_clock_2():
    clock("2")


@pytest.mark.world_size(4)
def test_shape_mismatch(rank, pg):
    dist.all_reduce(torch.ones(8 if rank == 1 else 4))


def test_clock_3():
    clock("3")


@pytest.fixture(scope="module")
def pair():
    return dist.new_group([0, 1])  # outlives the test: rank 1 leaves it open


@pytest.mark.world_size(4)
def test_group_left(rank, pg, pair):
    if rank == 0:
        dist.all_reduce(torch.ones(2), group=pair)


def test_clock_4():
    clock("4")


@pytest.mark.world_size(4)
def test_late_joiner_passes(rank, pg):
    if rank == 2:
        time.sleep(8)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 4


@pytest.mark.world_size(3)
def test_uneven_all_to_all_passes(rank, pg):
    inp = torch.full((3 * (rank + 1),), float(rank))
    out = torch.empty(1 + 2 + 3)
    if rank == 2:
        time.sleep(3)
    dist.all_to_all_single(
        out, inp, output_split_sizes=[1, 2, 3], input_split_sizes=[rank + 1] * 3
    )
    assert out.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]


@pytest.mark.world_size(3)
def test_object_collectives_and_p2p_of_different_sizes_pass(rank, pg):
    if rank == 0:
        time.sleep(3)
    got = [None] * 3
    dist.all_gather_object(got, "x" * (10 ** rank))
    assert [len(g) for g in got] == [1, 10, 100]
    if rank == 1:
        dist.send(torch.ones(5), 2)
    elif rank == 2:
        time.sleep(3)
        buf = torch.empty(5)
        dist.recv(buf, 1)
        assert buf.sum() == 5
"""

DEADLOCKS = Session(
    "test_hangs_explained.DEADLOCKS",
    {"test_cases.py": DEADLOCK_CASES},
    ("-ra", "--distrank-timeout=60"),
    {"DEADLOCK_CLOCK": "{folder}/clock"},
)


def _took(shared: Shared, before: str, after: str) -> float:
    clock = shared.folder / "clock"
    return float((clock / after).read_text()) - float((clock / before).read_text())


def _junit_message(shared: Shared, test: str) -> str:
    (runs,) = shared._cases[test]
    return next(message for tag, message in runs if tag == "failure")


@pytest.mark.parametrize(
    ("test", "clocks", "cause"),
    [
        (
            "test_rank_two_leaves",
            ("0", "1"),
            "rank 2/4 never entered all_reduce #2 on the default group (ranks 0, 1, 3 wait in it)",
        ),
        (
            "test_op_mismatch",
            ("1", "2"),
            "rank 1/4 entered broadcast #2 while ranks 0, 2, 3 entered all_gather #2 on the "
            "default group",
        ),
        (
            "test_shape_mismatch",
            ("2", "3"),
            "rank 1/4 entered all_reduce #1 with float32[[]8[]] while ranks 0, 2, 3 entered "
            "all_reduce #1 with float32[[]4[]] on the default group",
        ),
        (
            "test_group_left",
            ("3", "4"),
            "rank 1/4 never entered all_reduce #1 on the group of ranks 0, 1 (rank 0 waits in it)",
        ),
    ],
)
def test_a_proven_deadlock_ends_early_and_names_its_root_cause(
    shared_session: SharedSession, test: str, clocks: tuple[str, str], cause: str
) -> None:
    shared = DEADLOCKS.run(shared_session)
    assert shared.outcome(test) == "failed"
    assert _took(shared, *clocks) < 10  # the deadline is 60 s
    shared.section(test).fnmatch_lines([f"distrank: * ranks failed; root cause: {cause}"])
    ended = "*ended in call after * s: a deadlock (deadline was 60 s)*"
    shared.section(test).fnmatch_lines([ended])
    root = cause.split(" ", 2)[1]  # "2/4"
    shared.about(test).fnmatch_lines([f"FAILED test_cases.py::{test} - [[]rank {root}[]] *"])
    message = _junit_message(shared, test)
    assert message.startswith(f"[rank {root}] ")
    assert "Deadlock: still in call after" in message
    assert "ended early (deadline was 60 s, timeout from --distrank-timeout=60" in message


def test_the_waiting_ranks_are_collateral_and_a_root_cause_that_passed_is_marked(
    shared_session: SharedSession,
) -> None:
    shared = DEADLOCKS.run(shared_session)
    shared.section("test_rank_two_leaves").fnmatch_lines(
        [
            "collectives: ranks 0, 1, 3 wait in all_reduce #2 on the default group; rank 2 never "
            "entered it: it left the test (after all_reduce #1)",
            "  rank 0/4  waited in all_reduce #2 on the default group for rank 2; ended in call "
            "after * s: a deadlock (deadline was 60 s)",
            "  rank 2/4  passed  <- root cause",
            "---------- traceback of rank 0/4 ----------",
        ]
    )
    shared.about("test_rank_two_leaves").fnmatch_lines(
        ["pool killed after a fault: * rank(s) 0, 1, 3 ended after * s in a deadlock in *"]
    )


def test_slow_ranks_and_legal_uneven_sizes_are_never_ended_early(
    shared_session: SharedSession,
) -> None:
    shared = DEADLOCKS.run(shared_session)
    assert shared.outcomes(
        "test_late_joiner_passes",
        "test_uneven_all_to_all_passes",
        "test_object_collectives_and_p2p_of_different_sizes_pass",
    ) == ["passed", "passed", "passed"]
