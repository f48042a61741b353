"""DistributedDataParallel: what "data parallel" promises, checked against one process.

The central check: DDP on n ranks, each with its 1/n slice of every batch, must train exactly
like a single process on the whole batch, because DDP averages the gradients and a mean loss
over the whole batch is the mean of the per-slice mean losses. Each rank computes that
single-process reference itself (same seed, whole batch), so no rank needs another's data.

Also shown: gradient accumulation with ``no_sync``, ``find_unused_parameters`` with ranks that
use different parts of the model, communication hooks, the ``Join`` context manager for ranks
with different numbers of batches, and how ``DistributedSampler`` partitions a data set.

The models are tiny and in float64 so that parity holds to ~1e-12. Seeds are set inside
``torch.random.fork_rng`` so that no global RNG state leaks into later tests of the warm ranks.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD_SIZES = (2, 3, 4)
LR = 0.1
TIGHT = {"rtol": 0.0, "atol": 1e-12}


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class TwoHeads(nn.Module):
    """A trunk and two heads; ``head_b`` is used only when asked, ``never`` is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(4, 4)
        self.head_a = nn.Linear(4, 1)
        self.head_b = nn.Linear(4, 1)
        self.never = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        out = self.head_a(h)
        if use_b:
            out = out + self.head_b(h)
        return out


def seeded(factory, seed: int = 0) -> nn.Module:
    """Build a float64 model from a fixed seed without touching the global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory().double()


def make_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole (global) batch of a step; every rank can build every batch."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 4, generator=g, dtype=torch.float64)
    y = torch.randn(size, 1, generator=g, dtype=torch.float64)
    return x, y


def my_slice(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    return t.chunk(world_size)[rank]


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {
        n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()
    }


def assert_same_on_all_ranks(model: nn.Module, world_size: int) -> None:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(everyone, flat)
    for other in everyone:
        assert torch.equal(other, flat)


# -- parity with a single process ------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_ddp_matches_single_process_training(rank, world_size, pg):
    reference = seeded(TinyNet)
    initial = copy.deepcopy(reference.state_dict())
    model = DDP(copy.deepcopy(reference))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    per_rank = 4
    for step in range(3):
        x, y = make_batch(step, per_rank * world_size)
        opt.zero_grad()
        loss = mse(model(my_slice(x, rank, world_size)), my_slice(y, rank, world_size))
        loss.backward()
        opt.step()

        ref_opt.zero_grad()
        mse(reference(x), y).backward()
        ref_opt.step()

        for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, **TIGHT)

    for name, value in model.module.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], **TIGHT)
        assert not torch.equal(value, initial[name]), f"{name} did not train"
    assert_same_on_all_ranks(model.module, world_size)


@pytest.mark.world_size(*WORLD_SIZES)
def test_ddp_broadcasts_rank0_weights_at_construction(rank, world_size, pg):
    """Ranks that start from different weights all hold rank 0's weights once wrapped."""
    local = seeded(TinyNet, seed=rank)
    rank0 = seeded(TinyNet, seed=0)
    model = DDP(local)
    for p, q in zip(model.module.parameters(), rank0.parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach())


# -- gradient accumulation -------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_no_sync_gradient_accumulation(rank, world_size, pg):
    """Two micro-batches per rank; only the last backward (outside no_sync) communicates."""
    reference = seeded(TinyNet)
    model = DDP(copy.deepcopy(reference))
    x, y = make_batch(0, 8 * world_size)
    mx, my = my_slice(x, rank, world_size), my_slice(y, rank, world_size)
    (x0, x1), (y0, y1) = mx.chunk(2), my.chunk(2)

    with model.no_sync():
        (mse(model(x0), y0) / 2).backward()
    # Inside no_sync nothing was reduced: the gradient is this rank's first micro-batch only.
    local = copy.deepcopy(reference)
    (mse(local(x0), y0) / 2).backward()
    for p, q in zip(model.module.parameters(), local.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TIGHT)

    (mse(model(x1), y1) / 2).backward()
    # Now the accumulated gradient was averaged over ranks: the whole-batch gradient.
    mse(reference(x), y).backward()
    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TIGHT)


# -- unused parameters -----------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_find_unused_parameters(rank, world_size, pg):
    """Odd ranks use head_b, even ranks do not; nobody uses ``never``.

    DDP counts an unused parameter as a zero gradient on that rank, so head_b's gradient is
    (sum of the odd ranks' gradients) / world_size. A parameter no rank used keeps grad None.
    """
    reference = seeded(TwoHeads)
    model = DDP(copy.deepcopy(reference), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)

    for step in range(2):
        x, y = make_batch(step, 2 * world_size)
        # odd ranks use head_b at step 0, even ranks at step 1: the unused set changes per step
        uses_b = (rank + step) % 2 == 1
        opt.zero_grad(set_to_none=True)
        mse(model(my_slice(x, rank, world_size), uses_b), my_slice(y, rank, world_size)).backward()

        ref_opt.zero_grad(set_to_none=True)
        for s in range(world_size):
            s_uses_b = (s + step) % 2 == 1
            out = reference(my_slice(x, s, world_size), s_uses_b)
            (mse(out, my_slice(y, s, world_size)) / world_size).backward()

        got, want = grads(model.module), grads(reference)
        assert got["never.weight"] is None and got["never.bias"] is None
        assert want["never.weight"] is None
        for name in ("trunk.weight", "trunk.bias", "head_a.weight", "head_b.weight", "head_b.bias"):
            torch.testing.assert_close(got[name], want[name], **TIGHT)
        assert want["head_b.bias"].abs().sum() > 0
        opt.step()
        ref_opt.step()

    assert_same_on_all_ranks(model.module, world_size)


# -- communication hooks ---------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_comm_hook_custom_sum_instead_of_mean(rank, world_size, pg):
    """A hook that all-reduces without dividing: gradients become world_size x the mean.

    The hook also records what DDP handed it: the buckets together hold every gradient element.
    """
    reference = seeded(TinyNet)
    model = DDP(copy.deepcopy(reference))
    seen = {"calls": 0, "numel": 0}

    def sum_hook(state, bucket):
        state["calls"] += 1
        state["numel"] += bucket.buffer().numel()
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    model.register_comm_hook(seen, sum_hook)
    x, y = make_batch(0, 3 * world_size)
    mse(model(my_slice(x, rank, world_size)), my_slice(y, rank, world_size)).backward()
    mse(reference(x), y).backward()

    assert seen["calls"] >= 1
    assert seen["numel"] == 4 * 8 + 8 + 8 * 1 + 1  # fc1 weight, fc1 bias, fc2 weight, fc2 bias
    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, world_size * q.grad, **TIGHT)


@pytest.mark.world_size(*WORLD_SIZES)
def test_comm_hook_builtin_allreduce(rank, world_size, pg):
    """default_hooks.allreduce_hook reproduces DDP's own averaging."""
    reference = seeded(TinyNet)
    model = DDP(copy.deepcopy(reference))
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    x, y = make_batch(1, 2 * world_size)
    mse(model(my_slice(x, rank, world_size)), my_slice(y, rank, world_size)).backward()
    mse(reference(x), y).backward()
    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TIGHT)


@pytest.mark.world_size(*WORLD_SIZES)
def test_comm_hook_fp16_compression(rank, world_size, pg):
    """fp16_compress_hook sends gradients as float16: close to the mean, and fp16-exact."""
    reference = seeded(TinyNet)
    model = DDP(copy.deepcopy(reference))
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    x, y = make_batch(2, 2 * world_size)
    mse(model(my_slice(x, rank, world_size)), my_slice(y, rank, world_size)).backward()
    mse(reference(x), y).backward()
    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-2, atol=2e-3)
        # every value went through float16, so it survives a round trip through float16
        assert torch.equal(p.grad.to(torch.float16).to(torch.float64), p.grad)


# -- uneven inputs ---------------------------------------------------------------------------------


@pytest.mark.world_size(*WORLD_SIZES)
def test_join_with_uneven_inputs(rank, world_size, pg):
    """Rank r has r + 1 batches. Under Join, ranks that ran out shadow the all-reduces with
    zeros, so at step k the gradient is (sum over ranks s >= k of their gradient) / world_size;
    at the end every rank holds the last joiner's weights."""
    reference = seeded(TinyNet)
    model = DDP(copy.deepcopy(reference))
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def batch(s: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = make_batch(100 * s + k, 2)
        return x, y

    with Join([model]):
        for k in range(rank + 1):
            x, y = batch(rank, k)
            opt.zero_grad()
            mse(model(x), y).backward()
            opt.step()

    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    for k in range(world_size):
        ref_opt.zero_grad()
        for s in range(k, world_size):  # ranks that still have a batch at step k
            x, y = batch(s, k)
            (mse(reference(x), y) / world_size).backward()
        ref_opt.step()

    for p, q in zip(model.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TIGHT)
    assert_same_on_all_ranks(model.module, world_size)


# -- DistributedSampler ----------------------------------------------------------------------------

# Hand-computed partitions of range(10). Without drop_last the index list is padded to a multiple
# of n by repeating its start (0, 1, ...), then rank r takes every n-th index from position r.
PADDED = {
    2: [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]],
    3: [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]],
    4: [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]],
}
# With drop_last the tail is cut to a multiple of n instead: 10 -> 10, 9, 8.
DROPPED = {
    2: [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]],
    3: [[0, 3, 6], [1, 4, 7], [2, 5, 8]],
    4: [[0, 4], [1, 5], [2, 6], [3, 7]],
}


@pytest.mark.world_size(*WORLD_SIZES)
def test_distributed_sampler_pads_by_wrapping(rank, world_size, pg):
    sampler = DistributedSampler(range(10), shuffle=False)  # rank and size from the group
    mine = list(sampler)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    # (asserting after the last collective: a rank that failed earlier would leave its peers
    # blocked in all_gather_object until the plugin kills them)
    assert (sampler.num_replicas, sampler.rank) == (world_size, rank)
    assert mine == PADDED[world_size][rank]
    assert len(sampler) == math.ceil(10 / world_size)
    flat = [i for part in everyone for i in part]
    assert sorted(set(flat)) == list(range(10))  # nothing lost
    assert len(flat) - 10 == (-10) % world_size  # exactly this many duplicates of padding


@pytest.mark.world_size(*WORLD_SIZES)
def test_distributed_sampler_drop_last(rank, world_size, pg):
    sampler = DistributedSampler(range(10), shuffle=False, drop_last=True)
    mine = list(sampler)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    assert mine == DROPPED[world_size][rank]
    flat = [i for part in everyone for i in part]
    assert len(flat) == len(set(flat)) == 10 - 10 % world_size  # no overlap, tail dropped
    assert sorted(flat) == list(range(10 - 10 % world_size))


@pytest.mark.world_size(*WORLD_SIZES)
def test_distributed_sampler_shuffle_is_a_partition_per_epoch(rank, world_size, pg):
    """With shuffle the ranks agree on one permutation per (seed, epoch) and split it.

    12 items divide evenly by 2, 3 and 4: every epoch is an exact partition, no padding.
    """
    sampler = DistributedSampler(range(12), shuffle=True, seed=7)
    mine, everyone = {}, {}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        mine[epoch] = list(sampler)
        everyone[epoch] = [None] * world_size
        dist.all_gather_object(everyone[epoch], mine[epoch])

    per_epoch = []
    for epoch in range(2):
        assert len(mine[epoch]) == 12 // world_size
        flat = [i for part in everyone[epoch] for i in part]
        assert sorted(flat) == list(range(12))
        # the documented recipe: randperm seeded with seed + epoch, rank r takes r::n
        perm = torch.randperm(12, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        assert mine[epoch] == perm[rank::world_size]
        per_epoch.append(flat)
    assert per_epoch[0] != per_epoch[1]  # set_epoch reshuffles


@pytest.mark.world_size(*WORLD_SIZES)
def test_distributed_sampler_with_dataloader(rank, world_size, pg):
    """The sampler drives a DataLoader: rank r sees rows r, r + n, ... in batches of 2."""
    data = TensorDataset(torch.arange(12) * 10)
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=False))
    seen = [batch.tolist() for (batch,) in loader]
    rows = list(range(rank, 12, world_size))
    expected = [[10 * r for r in rows[i : i + 2]] for i in range(0, len(rows), 2)]
    assert seen == expected
    total = torch.tensor([sum(sum(b) for b in seen)])
    dist.all_reduce(total)
    assert total.item() == 10 * sum(range(12))
