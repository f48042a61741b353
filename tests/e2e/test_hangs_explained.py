"""End-to-end: a hung test says which collective each rank is in and who is out of step.

The ranks' flight recorders (PyTorch's, on by default with gloo) are read when the deadline or
the failure grace ends a test: a thread in each rank answers while its main thread is stuck in
C++.
"""

from __future__ import annotations

import pytest

from ..helpers import RunPytest


def test_a_rank_that_never_enters_the_collective_is_named(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import time
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(3)
        def test_missing(rank):
            t = torch.ones(4)
            dist.all_reduce(t)
            if rank == 2:
                time.sleep(60)
            dist.all_reduce(t)
        """
    )
    result = run_pytest("--distrank-timeout=4")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "collectives: ranks 0, 1 wait in all_reduce #2 on the default group; rank 2 never "
            "entered it: it is blocked in test_missing at *.py:9 (after all_reduce #1)",
            "  rank 0/3  timed out in call after 4 s; in all_reduce #2 on the default group "
            "(float32[[]4[]]); blocked in all_reduce at *, called from test_missing at "
            "test_a_rank_that_never_enters_the_collective_is_named.py:10*",
            "  rank 2/3  timed out in call after 4 s; blocked in test_missing at *.py:9",
        ]
    )


def test_ranks_in_different_collectives_are_a_mismatch(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_mismatch(rank):
            t = torch.ones(4)
            dist.all_reduce(t)
            if rank == 0:
                dist.all_reduce(t)
            else:
                dist.broadcast(t, src=0)
        """
    )
    result = run_pytest("--distrank-timeout=4")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "collectives: rank 1 entered broadcast #2 while rank 0 entered all_reduce #2 (the "
            "default group)",
            "  rank 1/2  timed out in call after 4 s; in broadcast #2 on the default group "
            "(float32[[]4[]]); *",
        ]
    )


def test_a_shape_mismatch_that_aborts_a_rank_names_the_collective_and_the_peers_tensors(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_shapes(rank):
            dist.all_reduce(torch.ones(2))
            t = torch.ones(4 if rank == 0 else 8)
            dist.all_reduce(t)
        """
    )
    result = run_pytest("--distrank-timeout=30")
    result.assert_outcomes(failed=1)
    # gloo aborts the rank that receives more bytes than it passed (rank 0 here), silently.
    result.stdout.fnmatch_lines(
        [
            "collectives: rank 0 crashed (SIGABRT(-6)) inside all_reduce, called from "
            "test_shapes at test_*.py:7; rank 1 was in all_reduce #2 on the default group "
            "(float32[[]8[]]): gloo aborts a rank that receives a different size than it passed, "
            "so compare the tensors (shape, dtype) each rank passes to this all_reduce",
            "  rank 0/2  crashed in call with SIGABRT(-6) inside all_reduce  <- root cause",
        ]
    )


def test_after_a_failure_the_waiting_ranks_say_who_left(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_one_rank_fails(rank):
            assert rank == 0, "rank 1 gives up"
            dist.all_reduce(torch.ones(2, dtype=torch.float64))
        """
    )
    result = run_pytest("--distrank-failure-grace=1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "collectives: rank 0 waits in all_reduce #1 on the default group; rank 1 never "
            "entered it",
            "  rank 0/2  killed in call * after rank 1 failed; in all_reduce #1 on the default "
            "group (float64[[]2[]]); blocked in all_reduce at *",
        ]
    )


def test_without_the_flight_recorder_the_stacks_still_say_where(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    pytester.makepyfile(
        """
        import time
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_missing(rank):
            if rank == 1:
                time.sleep(60)
            dist.all_reduce(torch.ones(1))
        """
    )
    result = run_pytest("--distrank-timeout=3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["  rank 0/2  timed out in call after 3 s; blocked in all_reduce at *"]
    )
    assert "collectives:" not in result.stdout.str()
