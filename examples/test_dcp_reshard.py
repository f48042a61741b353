"""A checkpoint saved at one world size, loaded at others: DCP resharding, gloo on the CPU.

``checkpoint`` is a fixture at another world size (``pytest_distrank.fixture(world_size=4)``):
it trains an FSDP2-sharded model for two steps on 4 ranks of its own and saves the model and
its optimizer with torch.distributed.checkpoint into ``fixture_path``, once per session. The
tests load it at world sizes 2 and 3, into a model built from another seed and sharded over
their own mesh (3 ranks: uneven shards), and check every parameter and Adam state against the
full values the 4 ranks wrote beside the checkpoint. An ordinary test reads the checkpoint's
files without any rank.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import pytest_distrank

SAVED_AT = 4


def model_on(mesh, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small MLP (its sizes divide by neither 3 nor 4), sharded over ``mesh``, with Adam."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(7, 10), nn.Tanh(), nn.Linear(10, 5)).double()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every parameter and its Adam moments as full tensors (a collective: all ranks call it)."""
    state = {}
    for name, param in model.named_parameters():
        state[name] = param.full_tensor()
        for moment in ("exp_avg", "exp_avg_sq"):
            state[f"{name}.{moment}"] = opt.state[param][moment].full_tensor()
    return state


@pytest_distrank.fixture(world_size=SAVED_AT)
def checkpoint(rank, world_size, pg, fixture_path):
    """Two training steps at world size 4, then a DCP checkpoint of model and optimizer."""
    model, opt = model_on(init_device_mesh("cpu", (world_size,)), seed=0)
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 7, generator=g, dtype=torch.float64).chunk(world_size)[rank]
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=fixture_path / "ckpt")
    expected = full_state(model, opt)
    if rank == 0:
        torch.save(expected, fixture_path / "expected.pt")
    dist.barrier()


@pytest.mark.world_size(2, 3)
def test_load_at_another_world_size(checkpoint, rank, world_size, pg):
    model, opt = model_on(init_device_mesh("cpu", (world_size,)), seed=1)
    model_sd, optim_sd = get_state_dict(model, opt)
    target = {"model": model_sd, "optim": optim_sd}
    dcp.load(target, checkpoint_id=checkpoint / "ckpt")  # resharded from 4 ranks to this many
    set_state_dict(model, opt, model_state_dict=target["model"], optim_state_dict=target["optim"])

    expected = torch.load(checkpoint / "expected.pt", weights_only=True)
    loaded = full_state(model, opt)
    assert loaded.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name
    shard = next(iter(model.parameters())).to_local()  # this rank's rows of the first weight
    assert shard.shape[0] == torch.arange(10).chunk(world_size)[rank].numel()  # 3 ranks: 4, 4, 2


def test_the_checkpoint_has_a_file_per_saving_rank(checkpoint):
    """An ordinary test gets the folder too: the fixture ran once, on its own 4 ranks."""
    assert len(list((checkpoint / "ckpt").glob("*.distcp"))) == SAVED_AT
    assert (checkpoint / "ckpt" / ".metadata").is_file()
