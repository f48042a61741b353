"""DTensor on a CPU DeviceMesh: placements, redistribution, and a 2-D mesh.

A DTensor is a global tensor described by a mesh and one placement per mesh dimension:
``Shard(d)`` cuts tensor dimension d across that mesh dimension (in ``torch.chunk`` sizes, so the
last ranks may hold fewer rows, or none), ``Replicate()`` gives everyone the whole tensor, and
``Partial()`` means each rank holds a summand of the global value. ``full_tensor()`` gathers the
global tensor on every rank; ``to_local()`` is this rank's piece.

The meshes are module-scoped fixtures: a 1-D mesh over the world reuses the default group, while
a 2-D mesh creates one sub-group per row and column (collective, so it is made once per pool).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

WORLD_SIZES = (2, 3, 4)


def tri(n: int) -> int:
    return n * (n + 1) // 2


@pytest.fixture(scope="module")
def mesh(world_size, pg):
    return init_device_mesh("cpu", (world_size,))


@pytest.fixture(scope="module")
def mesh_2x2(world_size, pg):
    """dp x tp = 2 x 2 over ranks [[0, 1], [2, 3]]: rank r sits at (r // 2, r % 2)."""
    assert world_size == 4
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def table(rows: int, cols: int) -> torch.Tensor:
    """[[0, 1, 2], [3, 4, 5], ...] as float32: the value at (i, j) is i * cols + j."""
    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


# -- placements ------------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_shard_rows_evenly(rank, world_size, mesh):
    full = table(2 * world_size, 3)
    d = distribute_tensor(full, mesh, [Shard(0)])
    assert isinstance(d, DTensor)
    assert d.shape == (2 * world_size, 3)  # global shape
    # rank r holds rows 2r and 2r + 1, i.e. the values 6r .. 6r + 5
    assert d.to_local().tolist() == [
        [6 * rank + j for j in range(3)],
        [6 * rank + 3 + j for j in range(3)],
    ]
    assert torch.equal(d.full_tensor(), full)


@pytest.mark.world_size(*WORLD_SIZES)
def test_shard_columns_unevenly(rank, world_size, mesh):
    """5 columns in torch.chunk sizes: 3+2 on 2 ranks, 2+2+1 on 3, 2+2+1+0 on 4."""
    full = table(2, 5)
    widths = {2: [3, 2], 3: [2, 2, 1], 4: [2, 2, 1, 0]}[world_size]
    start = sum(widths[:rank])
    d = distribute_tensor(full, mesh, [Shard(1)])
    local = d.to_local()
    assert local.shape == (2, widths[rank])
    assert local.tolist() == [
        [i * 5 + j for j in range(start, start + widths[rank])] for i in range(2)
    ]
    assert torch.equal(d.full_tensor(), full)


@pytest.mark.world_size(*WORLD_SIZES)
def test_replicate(rank, world_size, mesh):
    full = table(3, 2)
    d = distribute_tensor(full, mesh, [Replicate()])
    assert d.to_local().tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert torch.equal(d.full_tensor(), full)


@pytest.mark.world_size(*WORLD_SIZES)
def test_distribute_tensor_takes_rank0_data(rank, world_size, mesh):
    """By default rank 0's tensor is the source; src_data_rank=None skips the communication
    and each rank just keeps its own chunk (only right when the ranks agree on the data)."""
    mine = torch.full((world_size, 2), float(rank))
    from_rank0 = distribute_tensor(mine, mesh, [Shard(0)])
    assert from_rank0.to_local().tolist() == [[0.0, 0.0]]
    local_only = distribute_tensor(mine, mesh, [Shard(0)], src_data_rank=None)
    assert local_only.to_local().tolist() == [[float(rank), float(rank)]]


@pytest.mark.world_size(*WORLD_SIZES)
def test_from_local_partial_sums(rank, world_size, mesh):
    """Partial: the global value is the sum of the ranks' local tensors (1 + 2 + ... + n)."""
    d = DTensor.from_local(torch.full((2, 2), rank + 1.0), mesh, [Partial()])
    assert d.full_tensor().tolist() == [[float(tri(world_size))] * 2] * 2


# -- redistribute ----------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_redistribute_shard_to_replicate(rank, world_size, mesh):
    """Shard -> Replicate is an all-gather."""
    full = table(world_size, 4)
    d = distribute_tensor(full, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    assert d.placements == (Replicate(),)
    assert torch.equal(d.to_local(), full)


@pytest.mark.world_size(*WORLD_SIZES)
def test_redistribute_shard_rows_to_columns(rank, world_size, mesh):
    """Shard(0) -> Shard(1) is an all-to-all: rank r ends with column block r of every row."""
    full = table(world_size, 2 * world_size)
    d = distribute_tensor(full, mesh, [Shard(0)]).redistribute(mesh, [Shard(1)])
    expected = [
        [i * 2 * world_size + j for j in (2 * rank, 2 * rank + 1)] for i in range(world_size)
    ]
    assert d.to_local().tolist() == expected
    assert torch.equal(d.full_tensor(), full)


@pytest.mark.world_size(*WORLD_SIZES)
def test_redistribute_replicate_to_shard(rank, world_size, mesh):
    """Replicate -> Shard needs no communication: every rank keeps its chunk."""
    full = table(world_size, 3)
    d = distribute_tensor(full, mesh, [Replicate()]).redistribute(mesh, [Shard(0)])
    assert d.to_local().tolist() == [[3.0 * rank, 3.0 * rank + 1, 3.0 * rank + 2]]


@pytest.mark.world_size(*WORLD_SIZES)
def test_redistribute_partial(rank, world_size, mesh):
    """Partial -> Replicate is an all-reduce; Partial -> Shard(0) is a reduce-scatter."""
    local = torch.arange(world_size, dtype=torch.float32).reshape(world_size, 1) + rank
    partial = DTensor.from_local(local, mesh, [Partial()])
    # row i of the sum is sum over r of (i + r) = n i + n (n - 1) / 2
    n = world_size
    rows = [n * i + n * (n - 1) / 2 for i in range(n)]
    assert partial.redistribute(mesh, [Replicate()]).to_local().flatten().tolist() == rows
    assert partial.redistribute(mesh, [Shard(0)]).to_local().flatten().tolist() == [rows[rank]]


# -- operators on DTensors -------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_sharded_matmul_and_reduction(rank, world_size, mesh):
    """Row-sharded x times replicated w stays row-sharded; a sum of a shard becomes Partial."""
    x_full = table(2 * world_size, 3)
    w_full = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x = distribute_tensor(x_full, mesh, [Shard(0)])
    w = distribute_tensor(w_full, mesh, [Replicate()])
    y = x @ w
    assert y.placements == (Shard(0),)
    # row i of x is [3i, 3i + 1, 3i + 2]: times w gives [6i + 2, 6i + 3]
    assert y.full_tensor().tolist() == [[6.0 * i + 2, 6.0 * i + 3] for i in range(2 * world_size)]

    total = x.sum()
    assert total.placements == (Partial(),)
    m = 6 * world_size  # x holds 0 .. m - 1
    assert total.full_tensor().item() == m * (m - 1) / 2

    z = (x * 2 + 1).redistribute(mesh, [Replicate()])
    assert torch.equal(z.to_local(), x_full * 2 + 1)


# -- a 2-D mesh ------------------------------------------------------------------------------------


@pytest.mark.world_size(4)
def test_2d_mesh_coordinates_and_groups(rank, world_size, mesh_2x2):
    assert tuple(mesh_2x2.get_coordinate()) == (rank // 2, rank % 2)
    assert mesh_2x2["dp"].size() == mesh_2x2["tp"].size() == 2
    # the tp group is this rank's row of the mesh, the dp group its column
    assert dist.get_process_group_ranks(mesh_2x2.get_group("tp")) == [
        2 * (rank // 2),
        2 * (rank // 2) + 1,
    ]
    assert dist.get_process_group_ranks(mesh_2x2.get_group("dp")) == [rank % 2, rank % 2 + 2]
    t = torch.tensor([rank])
    dist.all_reduce(t, group=mesh_2x2.get_group("tp"))
    assert t.item() == 4 * (rank // 2) + 1  # 0 + 1 or 2 + 3


@pytest.mark.world_size(4)
def test_2d_mesh_shard_both_dims(rank, world_size, mesh_2x2):
    """[Shard(0), Shard(1)] on a 4x4 table: rank (i, j) holds the 2x2 block at (2i, 2j)."""
    full = table(4, 4)
    d = distribute_tensor(full, mesh_2x2, [Shard(0), Shard(1)])
    i, j = rank // 2, rank % 2
    expected = [[4.0 * row + col for col in (2 * j, 2 * j + 1)] for row in (2 * i, 2 * i + 1)]
    assert d.to_local().tolist() == expected
    assert torch.equal(d.full_tensor(), full)

    # Shard rows over dp, replicate over tp: both ranks of a tp row hold the same two rows.
    rows = distribute_tensor(full, mesh_2x2, [Shard(0), Replicate()])
    assert rows.to_local().tolist() == [[4.0 * r + c for c in range(4)] for r in (2 * i, 2 * i + 1)]
    # and back to fully replicated
    assert torch.equal(d.redistribute(mesh_2x2, [Replicate(), Replicate()]).to_local(), full)


@pytest.mark.world_size(4)
def test_2d_mesh_partial_over_one_dim(rank, world_size, mesh_2x2):
    """Partial over tp only: each tp pair sums its two summands, dp rows are replicas."""
    local = torch.tensor([float(rank % 2 + 1)])  # 1 on tp rank 0, 2 on tp rank 1
    d = DTensor.from_local(local, mesh_2x2, [Replicate(), Partial()])
    assert d.redistribute(mesh_2x2, [Replicate(), Replicate()]).to_local().item() == 3.0
