"""Initialising the process group yourself: ``world_size(n, init_process_group=False)``.

Code under test often calls ``dist.init_process_group()`` itself, the way it would under
torchrun. With ``init_process_group=False`` the ranks start without a default group but with
torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, where a fresh
store waits for every test. Whatever group a test leaves behind is destroyed after it, so a test
may end with its group still up; the next test starts clean either way (the tests below check).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

WORLD_SIZES = (2, 3, 4)


@pytest.mark.world_size(*WORLD_SIZES, init_process_group=False)
def test_env_variables_and_env_init(rank, world_size):
    assert not dist.is_initialized()
    assert os.environ["RANK"] == str(rank)
    assert os.environ["WORLD_SIZE"] == str(world_size)
    assert os.environ["LOCAL_RANK"] == str(rank)  # one machine: local rank == rank
    assert os.environ["MASTER_ADDR"]
    assert int(os.environ["MASTER_PORT"]) > 0

    dist.init_process_group("gloo")  # env:// is the default init_method
    assert dist.is_initialized()
    assert dist.get_backend() == "gloo"
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world_size)

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world_size * (world_size + 1) / 2
    # No destroy_process_group(): the plugin destroys what a test leaves (see the next test).


@pytest.mark.world_size(*WORLD_SIZES, init_process_group=False)
def test_explicit_env_init_and_clean_teardown(rank, world_size):
    """Starts without a group although the previous test left one; ends by destroying its own."""
    assert not dist.is_initialized()
    dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=60))
    try:
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
        dist.all_gather(out, torch.tensor([rank * rank]))
        assert [o.item() for o in out] == [r * r for r in range(world_size)]
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


@pytest.mark.world_size(*WORLD_SIZES, init_process_group=False)
def test_file_init_in_shared_tmp_path(rank, world_size, shared_tmp_path):
    """A file:// rendezvous needs a path all ranks see: shared_tmp_path is one."""
    assert not dist.is_initialized()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{shared_tmp_path / 'rendezvous'}",
        rank=rank,
        world_size=world_size,
    )
    try:
        t = torch.tensor([rank], dtype=torch.int64)
        dist.broadcast(t, src=world_size - 1)
        assert t.item() == world_size - 1
    finally:
        dist.destroy_process_group()


@pytest.mark.world_size(*WORLD_SIZES, init_process_group=False)
def test_explicit_store(rank, world_size, dist_store):
    """init_process_group(store=...) with the test's own store, as a launcher would pass one."""
    dist.init_process_group("gloo", store=dist_store, rank=rank, world_size=world_size)
    try:
        t = torch.tensor([1 << rank])
        dist.all_reduce(t, op=dist.ReduceOp.BOR)
        assert t.item() == (1 << world_size) - 1
    finally:
        dist.destroy_process_group()
