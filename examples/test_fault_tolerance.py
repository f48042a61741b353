"""Fault tolerance: a rank killed mid-training, and a peer too slow for a group's timeout.

The ``faults`` fixture injects a fault at a chosen collective, on one rank
(docs/fault-tolerance.md). A fired ``faults.kill`` is an expected exit of that rank: the test
passes when the other ranks pass. Both tests run on gloo, on the CPU.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

STEPS = 6
#: The global batch of every step; each rank takes an equal share of it.
BATCH = 12
#: The test kills this rank just before its third all_reduce (the third training step).
VICTIM = 2


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: the same on every rank, whatever the world size."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, 4, generator=g, dtype=torch.float64)
    return x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)


def gradient(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sum over these samples of d/dw (x.w - y)^2 (divided by BATCH after the all_reduce)."""
    return 2 * x.T @ (x @ w - y)


def uninterrupted() -> torch.Tensor:
    """What the training gives with no fault: the whole global batch in one process."""
    w = torch.zeros(4, dtype=torch.float64)
    for step in range(STEPS):
        x, y = data(step)
        w = w - 0.05 * gradient(w, x, y) / BATCH
    return w


def train(
    checkpoint: dict[str, object], group: dist.ProcessGroup, members: list[int], me: int
) -> torch.Tensor:
    """The steps after ``checkpoint``, the global batch split among ``members``; the checkpoint
    is saved after each step (in memory here; torch.save or DCP in a real job)."""
    share = BATCH // len(members)
    part = members.index(me)
    first, w = checkpoint["step"], checkpoint["w"]
    assert isinstance(first, int) and isinstance(w, torch.Tensor)
    for step in range(first, STEPS):
        x, y = data(step)
        mine = slice(part * share, (part + 1) * share)
        grad = gradient(w, x[mine], y[mine])
        dist.all_reduce(grad, group=group)  # a dead peer makes this raise (or time out)
        w = w - 0.05 * grad / BATCH
        checkpoint.update(step=step + 1, w=w.clone())
    return w


class Heartbeat:
    """Each rank writes the time into the store every 0.1 s; a rank silent for 1 s is dead."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        self.store, self.rank = store, rank
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stop.is_set():
            self.store.set(f"beat/{self.rank}", repr(time.time()))
            self.stop.wait(0.1)

    def alive(self, world_size: int) -> list[int]:
        now = time.time()
        return [r for r in range(world_size) if now - float(self.store.get(f"beat/{r}")) < 1.0]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.world_size(4)
def test_survivors_finish_without_the_killed_rank(rank, world_size, dist_store, faults):
    faults.kill(rank=VICTIM, at="all_reduce", nth=3)  # armed on rank 2; every rank makes the call
    heartbeat = Heartbeat(dist_store, rank)
    try:
        time.sleep(0.3)  # every rank has beaten once
        # The training's own group, with a short timeout: a stuck collective raises in 3 s.
        group = dist.new_group(list(range(world_size)), timeout=timedelta(seconds=3))
        checkpoint: dict[str, object] = {"step": 0, "w": torch.zeros(4, dtype=torch.float64)}
        with pytest.raises(RuntimeError):  # a peer died: the survivors go on without it
            train(checkpoint, group, list(range(world_size)), rank)
        time.sleep(1.5)  # a dead rank's heartbeat is now stale
        survivors = heartbeat.alive(world_size)
        assert survivors == [r for r in range(world_size) if r != VICTIM]
        smaller = dist.new_group(survivors, use_local_synchronization=True)
        assert checkpoint["step"] == 2  # the last checkpoint: the step that failed runs again
        w = train(checkpoint, smaller, survivors, rank)
        torch.testing.assert_close(w, uninterrupted())
        dist.destroy_process_group(smaller)
        dist.destroy_process_group(group)
    finally:
        heartbeat.close()


@pytest.mark.world_size(2)
def test_a_slow_peer_makes_the_collective_time_out(rank, faults):
    faults.delay(rank=1, at="all_reduce", seconds=3.0)
    group = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    started = time.monotonic()
    with pytest.raises(RuntimeError):  # rank 0 waits 1 s for rank 1, rank 1 then finds it gone
        dist.all_reduce(torch.ones(1), group=group)
    if rank == 0:
        assert time.monotonic() - started < 3.0  # the group's timeout ended it, not the delay
    dist.destroy_process_group(group)
