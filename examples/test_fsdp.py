"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU with gloo.

``fully_shard`` replaces every parameter by a DTensor sharded on dim 0 over a 1-D device mesh;
forward and backward all-gather the parameters and reduce-scatter the gradients. So, as with DDP,
n ranks training on their 1/n of each batch must match one process training on the whole batch,
and gathering the shards must give back the single-process weights.

Shard sizes follow ``torch.chunk``: 6 rows on 4 ranks are 2, 2, 2, 0 rows (the last rank holds
an empty shard), 1 row on n ranks is 1, 0, ..., 0.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard

WORLD_SIZES = (2, 3, 4)
LR = 0.1
TIGHT = {"rtol": 0.0, "atol": 1e-12}


def tiny_mlp(seed: int = 0) -> nn.Sequential:
    """Linear(4, 6) -> tanh -> Linear(6, 1), float64, from a seed; global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()


def make_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + step)
    return (
        torch.randn(size, 4, generator=g, dtype=torch.float64),
        torch.randn(size, 1, generator=g, dtype=torch.float64),
    )


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


@pytest.fixture(scope="module")
def mesh(world_size, pg):
    """A 1-D CPU mesh over all ranks (it reuses the default gloo group)."""
    return init_device_mesh("cpu", (world_size,))


def shard(model: nn.Sequential, mesh) -> nn.Sequential:
    """The usual FSDP2 recipe: shard each layer, then the root."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


@pytest.mark.world_size(*WORLD_SIZES)
def test_parameters_are_sharded_on_dim0(rank, world_size, mesh):
    model = shard(tiny_mlp(), mesh)
    assert isinstance(model, FSDPModule)
    full = tiny_mlp().state_dict()
    rows_of_6 = {2: [3, 3], 3: [2, 2, 2], 4: [2, 2, 2, 0]}[world_size]
    rows_of_1 = [1] + [0] * (world_size - 1)
    expected_rows = {"0.weight": rows_of_6, "0.bias": rows_of_6, "2.weight": rows_of_1}
    expected_rows["2.bias"] = rows_of_1
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor)
        assert param.placements == (Shard(0),)
        local = param.to_local()
        assert local.shape[0] == expected_rows[name][rank]
        start = sum(expected_rows[name][:rank])
        assert torch.equal(local, full[name][start : start + local.shape[0]])
        assert param.shape == full[name].shape  # the DTensor still has the global shape


@pytest.mark.world_size(*WORLD_SIZES)
@pytest.mark.parametrize("optim", ["sgd", "adam"])
def test_fsdp_matches_single_process_training(rank, world_size, mesh, optim):
    reference = tiny_mlp()
    model = shard(copy.deepcopy(reference), mesh)
    make_opt = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9),
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    }[optim]
    opt, ref_opt = make_opt(model.parameters()), make_opt(reference.parameters())

    for step in range(3):
        x, y = make_batch(step, 4 * world_size)
        opt.zero_grad()
        mse(model(x.chunk(world_size)[rank]), y.chunk(world_size)[rank]).backward()
        opt.step()
        ref_opt.zero_grad()
        mse(reference(x), y).backward()
        ref_opt.step()

    for (name, param), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert isinstance(param.grad, DTensor)  # gradients are sharded like the parameters
        torch.testing.assert_close(param.grad.full_tensor(), ref.grad, **TIGHT)
        torch.testing.assert_close(param.full_tensor(), ref.detach(), **TIGHT)
        assert not torch.equal(ref.detach(), tiny_mlp().state_dict()[name])  # it did train


@pytest.mark.world_size(*WORLD_SIZES)
def test_optimizer_state_is_sharded(rank, world_size, mesh):
    """Adam's moments live next to the local shards: same placements, same local shapes."""
    model = shard(tiny_mlp(), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = make_batch(0, 2 * world_size)
    mse(model(x.chunk(world_size)[rank]), y.chunk(world_size)[rank]).backward()
    opt.step()
    for param in model.parameters():
        state = opt.state[param]
        for key in ("exp_avg", "exp_avg_sq"):
            assert isinstance(state[key], DTensor)
            assert state[key].placements == (Shard(0),)
            assert state[key].to_local().shape == param.to_local().shape


@pytest.mark.world_size(*WORLD_SIZES)
def test_gradient_accumulation_without_sync(rank, world_size, mesh):
    """set_requires_gradient_sync(False) is FSDP2's no_sync: reduce only on the last micro-batch."""
    reference = tiny_mlp()
    model = shard(copy.deepcopy(reference), mesh)
    x, y = make_batch(5, 8 * world_size)
    mx, my = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
    (x0, x1), (y0, y1) = mx.chunk(2), my.chunk(2)

    model.set_requires_gradient_sync(False)
    (mse(model(x0), y0) / 2).backward()
    model.set_requires_gradient_sync(True)
    (mse(model(x1), y1) / 2).backward()

    mse(reference(x), y).backward()
    for param, ref in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad.full_tensor(), ref.grad, **TIGHT)


@pytest.mark.world_size(*WORLD_SIZES)
def test_sharded_state_dict_gathers_to_full(rank, world_size, mesh):
    """state_dict() holds DTensor shards; full_tensor() and full_state_dict give the weights."""
    reference = tiny_mlp(seed=3)
    model = shard(copy.deepcopy(reference), mesh)
    expected = reference.state_dict()

    sharded = model.state_dict()
    assert set(sharded) == set(expected)
    for name, value in sharded.items():
        assert isinstance(value, DTensor)
        assert torch.equal(value.full_tensor(), expected[name])

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    for name, value in full.items():
        assert not isinstance(value, DTensor)
        assert torch.equal(value, expected[name])

    # cpu_offload=True gathers to rank 0 only; the other ranks get an empty dict
    on_rank0 = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if rank == 0:
        assert {k: v.tolist() for k, v in on_rank0.items()} == {
            k: v.tolist() for k, v in expected.items()
        }
    else:
        assert on_rank0 == {}


@pytest.mark.world_size(*WORLD_SIZES)
def test_load_full_state_dict_from_rank0(rank, world_size, mesh):
    """A full checkpoint held by rank 0 only is broadcast and sharded into a fresh model."""
    source = tiny_mlp(seed=11)
    model = shard(tiny_mlp(seed=0), mesh)
    full = source.state_dict() if rank == 0 else {}
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    for name, param in model.named_parameters():
        assert torch.equal(param.full_tensor(), source.state_dict()[name])
    # and the loaded model computes what the source computes
    x, _ = make_batch(9, 3)
    torch.testing.assert_close(model(x), source(x), **TIGHT)


@pytest.mark.world_size(*WORLD_SIZES)
def test_forward_all_gathers_and_reshards(rank, world_size, mesh):
    """unshard() all-gathers one FSDP module's parameters into plain full tensors, reshard()
    frees them again; forward does the same per layer (and, by default, reshards after it).

    Each fully_shard call owns its own parameters: unshard() on the root would not touch the
    Linear layers, which were sharded separately.
    """
    reference = tiny_mlp(seed=4)
    model = shard(copy.deepcopy(reference), mesh)
    layer = model[0]
    layer.unshard()
    assert not isinstance(layer.weight, DTensor)
    assert torch.equal(layer.weight.detach(), reference[0].weight.detach())
    layer.reshard()
    assert isinstance(layer.weight, DTensor)
    model(make_batch(0, 2)[0])  # a forward pass leaves every layer sharded again
    assert all(isinstance(p, DTensor) for p in model.parameters())
    total = torch.tensor([layer.weight.to_local().numel()])
    dist.all_reduce(total)
    assert total.item() == 6 * 4  # the shards add up to the full weight
