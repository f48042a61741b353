"""torch.distributed.checkpoint (DCP): every rank saves its shards, every rank loads its shards.

``shared_tmp_path`` is one folder for all ranks of a test (``tmp_path`` would be one per rank),
which is what a checkpoint directory must be. The loads go into freshly made objects, so a test
passes only if the values really came back from disk; loading may use a different sharding
than saving (DCP reshards), or no process group at all (``no_dist=True``).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

WORLD_SIZES = (2, 3, 4)


@pytest.fixture(scope="module")
def mesh(world_size, pg):
    return init_device_mesh("cpu", (world_size,))


def table(rows: int, cols: int) -> torch.Tensor:
    """The value at (i, j) is i * cols + j."""
    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


@pytest.mark.world_size(*WORLD_SIZES)
def test_save_and_load_sharded_state(rank, world_size, mesh, shared_tmp_path):
    rows = 2 * world_size + 1  # uneven on purpose: the last rank's shard is smaller
    state = {
        "weight": distribute_tensor(table(rows, 3), mesh, [Shard(0)]),
        "bias": distribute_tensor(torch.tensor([0.5, -1.5]), mesh, [Replicate()]),
        "plain": torch.tensor([1, 2, 3]),  # an ordinary tensor, the same on every rank
        "step": 17,
    }
    dcp.save(state, checkpoint_id=shared_tmp_path)
    dist.barrier()

    assert (shared_tmp_path / ".metadata").is_file()
    assert len(list(shared_tmp_path.glob("*.distcp"))) == world_size  # one data file per rank

    fresh = {
        "weight": distribute_tensor(torch.zeros(rows, 3), mesh, [Shard(0)]),
        "bias": distribute_tensor(torch.zeros(2), mesh, [Replicate()]),
        "plain": torch.zeros(3, dtype=torch.int64),
        "step": 0,
    }
    dcp.load(fresh, checkpoint_id=shared_tmp_path)
    assert torch.equal(fresh["weight"].full_tensor(), table(rows, 3))
    assert fresh["bias"].to_local().tolist() == [0.5, -1.5]
    assert fresh["plain"].tolist() == [1, 2, 3]
    assert fresh["step"] == 17


@pytest.mark.world_size(*WORLD_SIZES)
def test_load_into_a_different_sharding(rank, world_size, mesh, shared_tmp_path):
    """Saved row-sharded; loaded column-sharded, replicated, and without any process group."""
    full = table(world_size, 2 * world_size)
    dcp.save({"w": distribute_tensor(full, mesh, [Shard(0)])}, checkpoint_id=shared_tmp_path)

    by_columns = {"w": distribute_tensor(torch.zeros_like(full), mesh, [Shard(1)])}
    dcp.load(by_columns, checkpoint_id=shared_tmp_path)
    cols = 2 * world_size
    expected = [[i * cols + j for j in (2 * rank, 2 * rank + 1)] for i in range(world_size)]
    assert by_columns["w"].to_local().tolist() == expected

    replicated = {"w": distribute_tensor(torch.zeros_like(full), mesh, [Replicate()])}
    dcp.load(replicated, checkpoint_id=shared_tmp_path)
    assert torch.equal(replicated["w"].to_local(), full)

    dist.barrier()  # everyone has finished with the group before rank 0 reads on its own
    if rank == 0:
        plain = {"w": torch.zeros_like(full)}
        # no_dist=True reads everything in this process; DCP says so with a UserWarning
        with pytest.warns(UserWarning, match="load in a single process"):
            dcp.load(plain, checkpoint_id=shared_tmp_path, no_dist=True)
        assert torch.equal(plain["w"], full)


def tiny_mlp(seed: int) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()


def sharded(model: nn.Sequential, mesh) -> nn.Sequential:
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int, n: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(2 * n, 3, generator=g, dtype=torch.float64)
    y = torch.randn(2 * n, 2, generator=g, dtype=torch.float64)
    opt.zero_grad()
    ((model(x.chunk(n)[rank]) - y.chunk(n)[rank]) ** 2).mean().backward()
    opt.step()


@pytest.mark.world_size(*WORLD_SIZES)
def test_fsdp_model_and_optimizer_resume(rank, world_size, mesh, shared_tmp_path):
    """Checkpoint an FSDP2 model and its Adam state after 2 steps, load both into a model built
    from a different seed, and check that step 3 gives the same weights as an uninterrupted run."""
    model = sharded(tiny_mlp(seed=0), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(2):
        train_step(model, opt, step, rank, world_size)

    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=shared_tmp_path)
    saved = {n: p.full_tensor() for n, p in model.named_parameters()}
    saved_avg = {n: opt.state[p]["exp_avg"].full_tensor() for n, p in model.named_parameters()}

    other = sharded(tiny_mlp(seed=1), mesh)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.05)
    other_model_sd, other_optim_sd = get_state_dict(other, other_opt)
    target = {"model": other_model_sd, "optim": other_optim_sd}
    dcp.load(target, checkpoint_id=shared_tmp_path)
    set_state_dict(
        other, other_opt, model_state_dict=target["model"], optim_state_dict=target["optim"]
    )

    for name, param in other.named_parameters():
        assert torch.equal(param.full_tensor(), saved[name])
        state = other_opt.state[param]
        assert isinstance(state["exp_avg"], DTensor)
        assert torch.equal(state["exp_avg"].full_tensor(), saved_avg[name])
        assert state["step"].item() == 2

    train_step(model, opt, 2, rank, world_size)
    train_step(other, other_opt, 2, rank, world_size)
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(p.full_tensor(), q.full_tensor())
    assert not torch.equal(
        next(iter(model.parameters())).full_tensor(), saved["0.weight"]
    )  # step 3 did move the weights


@pytest.mark.world_size(*WORLD_SIZES)
def test_plain_module_checkpoint_matches_torch_save(rank, world_size, shared_tmp_path):
    """A replicated (DDP-style) model: DCP writes each tensor once; a single-process load and a
    torch.save of the same weights agree."""
    model = tiny_mlp(seed=5)
    dcp.save(model.state_dict(), checkpoint_id=shared_tmp_path / "dcp")
    if rank == 0:
        torch.save(model.state_dict(), shared_tmp_path / "model.pt")
    dist.barrier()

    fresh = copy.deepcopy(tiny_mlp(seed=6).state_dict())
    dcp.load(fresh, checkpoint_id=shared_tmp_path / "dcp")
    reference = torch.load(shared_tmp_path / "model.pt", weights_only=True)
    assert set(fresh) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for name, value in reference.items():
        assert torch.equal(fresh[name], value)
