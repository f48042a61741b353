"""Collectives over picklable Python objects: all_gather_object, broadcast_object_list,
gather_object and scatter_object_list.

These pickle the objects, exchange their sizes, then the bytes, so each rank may send an object of
a different size and type. Objects must be picklable by reference in every rank: a class defined
at the top of a test module is fine, because every rank imports the same module. (Never
unpickle data from ranks you do not trust: these collectives call ``pickle.loads``.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

WORLD_SIZES = (2, 3, 4)


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """A small record a rank might report about itself."""

    rank: int
    rows: tuple[int, ...]
    name: str


def shard_info(rank: int, world_size: int) -> ShardInfo:
    # rows r, r + n, r + 2n, ... of a 10-row table, as a DistributedSampler would give them
    return ShardInfo(rank, tuple(range(rank, 10, world_size)), f"worker-{rank}")


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_gather_object(rank, world_size, pg):
    """Every rank ends up with every rank's object, in rank order; sizes differ per rank."""
    out = [None] * world_size
    dist.all_gather_object(out, {"rank": rank, "square": rank * rank, "pad": "x" * (1000 * rank)})
    assert [o["rank"] for o in out] == list(range(world_size))
    assert [o["square"] for o in out] == [r * r for r in range(world_size)]
    assert [len(o["pad"]) for o in out] == [1000 * r for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_all_gather_object_dataclass(rank, world_size, pg):
    out = [None] * world_size
    dist.all_gather_object(out, shard_info(rank, world_size))
    assert out[0] == ShardInfo(0, tuple(range(0, 10, world_size)), "worker-0")
    # the gathered shards partition the rows 0..9 exactly
    rows = sorted(row for info in out for row in info.rows)
    assert rows == list(range(10))
    assert [info.name for info in out] == [f"worker-{r}" for r in range(world_size)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_broadcast_object_list(rank, world_size, pg):
    """The source's list replaces the others' list elements in place (same length on all)."""
    src = world_size - 1
    if rank == src:
        objects = [{"lr": 0.5, "steps": [1, 2, 3]}, "config-v2", 42, torch.tensor([1.5, -2.0])]
    else:
        objects = [None, None, None, None]
    dist.broadcast_object_list(objects, src=src)
    assert objects[0] == {"lr": 0.5, "steps": [1, 2, 3]}
    assert objects[1] == "config-v2"
    assert objects[2] == 42
    assert objects[3].tolist() == [1.5, -2.0]


@pytest.mark.world_size(*WORLD_SIZES)
def test_broadcast_object_list_from_each_rank(rank, world_size, pg):
    for src in range(world_size):
        objects = [("from", rank, [rank] * rank)]
        dist.broadcast_object_list(objects, src=src)
        assert objects == [("from", src, [src] * src)]


@pytest.mark.world_size(*WORLD_SIZES)
def test_gather_object(rank, world_size, pg):
    """Only the destination passes a list to fill; the other ranks pass None."""
    dst = world_size - 1
    out = [None] * world_size if rank == dst else None
    dist.gather_object((rank, "y" * rank, {rank: rank + 0.5}), out, dst=dst)
    if rank == dst:
        assert out == [(r, "y" * r, {r: r + 0.5}) for r in range(world_size)]
    else:
        assert out is None


@pytest.mark.world_size(*WORLD_SIZES)
def test_scatter_object_list(rank, world_size, pg):
    """Rank 0 hands object i to rank i; each rank receives into a 1-element list."""
    inputs = (
        [{"for": r, "work": list(range(r * 3, r * 3 + 3))} for r in range(world_size)]
        if rank == 0
        else None
    )
    received = [None]
    dist.scatter_object_list(received, inputs, src=0)
    assert received == [{"for": rank, "work": [3 * rank, 3 * rank + 1, 3 * rank + 2]}]


@pytest.mark.world_size(*WORLD_SIZES)
def test_scatter_object_list_from_last_rank(rank, world_size, pg):
    src = world_size - 1
    inputs = [shard_info(r, world_size) for r in range(world_size)] if rank == src else None
    received = [None]
    dist.scatter_object_list(received, inputs, src=src)
    assert received[0] == ShardInfo(rank, tuple(range(rank, 10, world_size)), f"worker-{rank}")
