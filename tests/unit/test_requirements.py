"""Unit tests of the skips decided before any process starts (planning/capabilities.py)."""

from __future__ import annotations

from pytest_distrank.planning.capabilities import MIN_POOL_LIMIT, too_many_ranks


def test_a_pool_this_machine_can_start_is_not_refused() -> None:
    assert too_many_ranks(12, cores=2, nproc=0) is None
    assert too_many_ranks(MIN_POOL_LIMIT, cores=2, nproc=0) is None
    assert too_many_ranks(512, cores=8, nproc=0) is None


def test_a_huge_world_is_skipped_naming_the_limit_and_what_to_do() -> None:
    reason = too_many_ranks(1024, cores=2, nproc=0)
    assert reason == (
        "world size 1024 needs 1024 rank processes on this machine, at most 256 ranks in one pool "
        "on 2 CPU cores; simulate the world instead (@pytest.mark.simulate('fake', 1024), "
        "docs/simulation.md) or run it across nodes under a launcher (docs/multi-node.md)"
    )


def test_the_process_limit_counts_and_no_simulation_beyond_its_size() -> None:
    reason = too_many_ranks(300, cores=64, nproc=200)
    assert reason is not None and "at most 200 processes for this user (ulimit -u)" in reason
    reason = too_many_ranks(2**40, cores=2, nproc=0)
    assert reason is not None and "simulate" not in reason
