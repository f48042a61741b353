"""End-to-end: a deadlock its ranks' flight records prove ends within seconds, not at its deadline.

Issue 28. One inner session (``DEADLOCKS``, a 60 s deadline): four deadlocks the records prove
(a rank that leaves, an op mismatch, a shape mismatch, a rank stuck on a group its peer left),
each ending within 10 s with the root cause in the head, ``-ra`` and junit's message; and what
must never end early: a rank that joins 8 s late, a legal uneven ``all_to_all_single``, object
collectives and point-to-point ops of different sizes. ``DISTRANK_TEST_WAITS=1`` (the suite's
seam) makes the quiet time before a look 1 s.
"""

from __future__ import annotations

import pytest

from ..helpers import SharedSession
from .test_faults import Session, Shared

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

"""

#: Legal uneven sizes, each with a rank standing still beyond the quiet time (1 s here): never
#: a mismatch (launcher mode's worlds run them too: ``test_launch.LEGAL``).
LEGAL_SIZES = """@pytest.mark.world_size(3)
def test_uneven_all_to_all_passes(rank, pg):
    inp = torch.full((3 * (rank + 1),), float(rank))
    out = torch.empty(1 + 2 + 3)
    if rank == 2:
        time.sleep(1.5)
    dist.all_to_all_single(
        out, inp, output_split_sizes=[1, 2, 3], input_split_sizes=[rank + 1] * 3
    )
    assert out.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]


@pytest.mark.world_size(3)
def test_object_collectives_and_p2p_of_different_sizes_pass(rank, pg):
    if rank == 0:
        time.sleep(1.5)
    got = [None] * 3
    dist.all_gather_object(got, "x" * (10 ** rank))
    assert [len(g) for g in got] == [1, 10, 100]
    if rank == 1:
        dist.send(torch.ones(5), 2)
    elif rank == 2:
        time.sleep(1.5)
        buf = torch.empty(5)
        dist.recv(buf, 1)
        assert buf.sum() == 5
"""

DEADLOCKS = Session(
    "test_hangs_explained.DEADLOCKS",
    {"test_cases.py": DEADLOCK_CASES + LEGAL_SIZES},
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
