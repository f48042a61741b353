"""The basic collectives on NCCL, one GPU per rank.

``@pytest.mark.requires_nccl`` implies ``backend="nccl"`` and skips the test, before any rank
starts, unless this torch build has NCCL and at least world-size GPUs are visible; on a CPU-only
machine every test here is reported as skipped with that reason. ``device`` is ``cuda:<local
rank>`` (already the current device), so the same test body works on any number of GPUs.

Differences from gloo that these tests rely on: NCCL has ReduceOp.AVG, the "stacked" output
form of all_gather_single, and unequal tensor sizes in the list form of all_to_all. Barriers get
``device_ids`` because the group is bound to no device, and a barrier without one warns.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD_SIZES = (2, 3, 4)

# Every test of this module: NCCL, on 2, 3 and 4 GPUs.
pytestmark = [pytest.mark.requires_nccl, pytest.mark.world_size(*WORLD_SIZES)]


def tri(n: int) -> int:
    return n * (n + 1) // 2


def test_device_is_this_ranks_gpu(rank, local_rank, device, backend):
    assert backend == "nccl"
    assert device == torch.device("cuda", local_rank)
    assert torch.cuda.current_device() == local_rank


def test_all_reduce_ops(rank, world_size, device):
    n = world_size
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):

        def reduced(op, dtype=dtype):
            t = torch.tensor([rank + 1, -(rank + 1)], dtype=dtype, device=device)
            dist.all_reduce(t, op=op)
            assert (t.device, t.dtype) == (device, dtype)
            return t.tolist()

        assert reduced(dist.ReduceOp.SUM) == [tri(n), -tri(n)]
        assert reduced(dist.ReduceOp.PRODUCT) == [math.factorial(n), (-1) ** n * math.factorial(n)]
        assert reduced(dist.ReduceOp.MIN) == [1, -n]
        assert reduced(dist.ReduceOp.MAX) == [n, -1]


def test_all_reduce_avg(rank, world_size, device):
    t = torch.tensor([float(rank), 2.0 * rank + 1.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert t.tolist() == [(world_size - 1) / 2, float(world_size)]


def test_broadcast_and_reduce(rank, world_size, device):
    for src in range(world_size):
        t = torch.tensor([100 * rank + 1], device=device)
        dist.broadcast(t, src=src)
        assert t.item() == 100 * src + 1
    r = torch.tensor([rank + 1.0], device=device)
    dist.reduce(r, dst=0)
    if rank == 0:
        assert r.item() == tri(world_size)


def test_all_gather_forms(rank, world_size, device):
    mine = torch.tensor([rank, rank * rank], device=device)
    as_list = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(as_list, mine)
    assert [t.tolist() for t in as_list] == [[r, r * r] for r in range(world_size)]

    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    stacked = torch.empty(world_size, 2, dtype=torch.int64, device=device)  # NCCL-only form
    gather_single(stacked, mine)
    assert stacked.tolist() == [[r, r * r] for r in range(world_size)]


def test_reduce_scatter(rank, world_size, device):
    """Block d of rank s holds 10 s + d; rank d receives the sum over s."""
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    inp = torch.tensor([10 * rank + d for d in range(world_size)], device=device)
    out = torch.zeros(1, dtype=torch.int64, device=device)
    rs_single(out, inp)
    n = world_size
    assert out.item() == 10 * n * (n - 1) // 2 + n * rank


def test_all_to_all_unequal(rank, world_size, device):
    """Rank s sends s + d + 1 copies of 100 s + d to rank d, in both API forms."""
    in_splits = [rank + d + 1 for d in range(world_size)]
    out_splits = [s + rank + 1 for s in range(world_size)]
    expected = [[100 * s + rank] * (s + rank + 1) for s in range(world_size)]

    inp = torch.cat(
        [torch.full((k,), 100 * rank + d, device=device) for d, k in enumerate(in_splits)]
    )
    out = torch.empty(sum(out_splits), dtype=torch.int64, device=device)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    assert [p.tolist() for p in out.split(out_splits)] == expected

    inputs = list(inp.split(in_splits))
    outputs = [torch.empty(k, dtype=torch.int64, device=device) for k in out_splits]
    dist.all_to_all(outputs, inputs)
    assert [o.tolist() for o in outputs] == expected


def test_gather_scatter(rank, world_size, device):
    g = [torch.zeros(1, device=device) for _ in range(world_size)] if rank == 0 else None
    dist.gather(torch.tensor([rank + 0.5], device=device), g, dst=0)
    if rank == 0:
        assert [t.item() for t in g] == [r + 0.5 for r in range(world_size)]
    s = [torch.tensor([r * 3.0], device=device) for r in range(world_size)] if rank == 0 else None
    out = torch.zeros(1, device=device)
    dist.scatter(out, s, src=0)
    assert out.item() == rank * 3.0


def test_point_to_point_ring(rank, world_size, device):
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    got = torch.zeros(1, dtype=torch.int64, device=device)
    ops = [
        dist.P2POp(dist.isend, torch.tensor([10 * rank + 1], device=device), nxt),
        dist.P2POp(dist.irecv, got, prv),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert got.item() == 10 * prv + 1

    blocking = torch.zeros(1, dtype=torch.int64, device=device)
    if rank % 2 == 0:
        dist.send(torch.tensor([rank], device=device), dst=nxt)
        dist.recv(blocking, src=prv)
    else:
        dist.recv(blocking, src=prv)
        dist.send(torch.tensor([rank], device=device), dst=nxt)
    assert blocking.item() == prv


def test_async_and_barrier(rank, world_size, device, local_rank):
    t = torch.tensor([rank + 1.0], device=device)
    work = dist.all_reduce(t, async_op=True)
    work.wait()  # orders the CUDA stream; .item() below synchronises with the GPU
    assert t.item() == tri(world_size)
    dist.barrier(device_ids=[local_rank])


def test_object_collectives(rank, world_size, device):
    """Object collectives on NCCL move their bytes through the current CUDA device."""
    out = [None] * world_size
    dist.all_gather_object(out, {"rank": rank, "tag": "x" * rank})
    assert out == [{"rank": r, "tag": "x" * r} for r in range(world_size)]


def test_ddp_on_gpus_matches_single_gpu(rank, world_size, device):
    with torch.random.fork_rng(devices=[device]):
        torch.manual_seed(0)
        reference = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double().to(device)
    model = DDP(copy.deepcopy(reference), device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4 * world_size, 4, generator=g, dtype=torch.float64).to(device)
        y = torch.randn(4 * world_size, 1, generator=g, dtype=torch.float64).to(device)
        opt.zero_grad()
        ((model(x.chunk(world_size)[rank]) - y.chunk(world_size)[rank]) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((reference(x) - y) ** 2).mean().backward()
        ref_opt.step()
    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0.0, atol=1e-10)


@pytest.mark.world_size(*WORLD_SIZES, backend="cpu:gloo,cuda:nccl")
def test_mixed_backends_cpu_and_cuda(rank, world_size, device, backend):
    """One default group, two backends: CPU tensors go through gloo, CUDA tensors through NCCL.

    (The closest world_size marker wins over the module's, so this test keeps requires_nccl for
    the GPU check and uses the device:backend mapping as its backend.)
    """
    assert backend == "cpu:gloo,cuda:nccl"
    on_cpu = torch.tensor([rank + 1])
    on_gpu = torch.tensor([rank + 1], device=device)
    dist.all_reduce(on_cpu)
    dist.all_reduce(on_gpu)
    assert on_cpu.item() == on_gpu.item() == tri(world_size)
