"""Distributed code checked at world sizes no CI machine has, in one process (simulated worlds).

Fake mode, for a sharding plan:

``@pytest.mark.simulate("fake", 1024)`` runs the test once more, as one rank of a simulated world
of 1024 ranks, in one process: the default group is PyTorch's fake process group, so a
``DeviceMesh`` of 8 x 128 can be built and DTensors placed on it, while every collective returns
at once and moves no data. Check what does not depend on other ranks' data (shapes, placements,
which rank holds what); check numbers at a real world size, as the ``ws4`` id of the same test
does here. ``ranks=(0, 1023)`` plays the first and the last rank, one test each.

Local mode, for numbers: ``@pytest.mark.simulate("local", 4, 64)`` runs the test once per size
under PyTorch's LocalTensorMode, which holds every rank's tensors in the one process and computes
each collective exactly. The same assertions hold for the real run at ``ws4`` and the local runs
at 4 and 64 ranks. ``rank`` there is a symbolic int of every rank: use it in tensor arithmetic,
not as one number (docs/simulation.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

#: The plan: data parallel over rows of the mesh, tensor parallel within a row.
TP = {4: 2, 1024: 128}
HIDDEN, FFN = 1024, 4096


@pytest.mark.world_size(4)
@pytest.mark.simulate("fake", 1024, ranks=(0, 1023))
def test_the_plan_gives_each_rank_its_shard(rank, world_size, device):
    tp = TP[world_size]
    dp = world_size // tp
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    assert mesh["tp"].size() == tp and mesh["dp"].size() == dp
    assert tuple(mesh.get_coordinate() or ()) == (rank // tp, rank % tp)

    # Column-parallel up projection, row-parallel down projection, replicated over dp.
    up = distribute_tensor(torch.zeros(FFN, HIDDEN), mesh, [Replicate(), Shard(0)])
    down = distribute_tensor(torch.zeros(HIDDEN, FFN), mesh, [Replicate(), Shard(1)])
    assert up.to_local().shape == (FFN // tp, HIDDEN)
    assert down.to_local().shape == (HIDDEN, FFN // tp)
    # A batch of 64 * dp sequences, split over dp, whole within a tp row.
    batch = distribute_tensor(torch.zeros(64 * dp, HIDDEN), mesh, [Shard(0), Replicate()])
    assert batch.to_local().shape == (64, HIDDEN)
    # What each rank holds, in bytes: the memory estimate of the plan (float32).
    held = sum(t.to_local().numel() * 4 for t in (up, down, batch))
    assert held == (2 * FFN * HIDDEN // tp + 64 * HIDDEN) * 4


@pytest.mark.world_size(4)
@pytest.mark.simulate("local", 4, 64)
def test_a_row_sharded_matmul_and_its_gradient_norm(rank, world_size, device):
    mesh = init_device_mesh(device.type, (world_size,))
    x = torch.arange(world_size * 8, dtype=torch.float32).reshape(world_size * 2, 4) / 10
    w = torch.linspace(-1, 1, 12).reshape(4, 3)
    rows = distribute_tensor(x, mesh, [Shard(0)])
    weight = distribute_tensor(w, mesh, [Replicate()])
    assert rows.to_local().shape == (2, 4)

    out = rows @ weight  # stays sharded by rows: no communication
    assert out.placements == (Shard(0),)
    torch.testing.assert_close(out.full_tensor(), x @ w)
    # A reduction across ranks: the global sum of squares, as a gradient-norm check would do it.
    norm = (out * out).sum().full_tensor().sqrt()
    torch.testing.assert_close(norm, (x @ w).norm())

    # Each rank's own value, then all of them summed: 1 + 2 + ... + world_size.
    mine = torch.ones(1) * (rank + 1)
    dist.all_reduce(mine)
    assert mine.item() == world_size * (world_size + 1) // 2
