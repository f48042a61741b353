"""End-to-end: a hung test says which collective each rank is in and who is out of step.

The ranks' flight recorders (PyTorch's, on by default with gloo) are read when the deadline or
the failure grace ends a test: a thread in each rank answers while its main thread is stuck in
C++. The cases share the inner sessions of tests/e2e/test_faults.py: ``DEADLINE`` (a 4 s deadline,
no grace, ``--distrank-deadlocks=wait``: the deadline path), ``FAULTS`` (the default grace) and
``NO_RECORDER`` (TORCH_FR_BUFFER_SIZE=0). The deadlocks that end early are in
tests/e2e/test_deadlocks.py.
"""

from __future__ import annotations

from ..helpers import SharedSession
from .test_faults import (
    DEADLINE,
    DEADLINE_CASES,
    FAULTS,
    NO_RECORDER,
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
