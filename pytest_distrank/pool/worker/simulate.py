"""A simulated world in one rank process (``@pytest.mark.simulate``): fake and local modes.

Runs in pool-mode rank processes whose pool plays a simulated world (:mod:`rankgroup` calls
:func:`simulate` at start-up; :mod:`main` registers :class:`LocalMode` for local pools). The
process is rank 0 of a pool of one as far as the plugin's own store goes; torch.distributed and
the fixtures see the simulated world:

- **fake**: PyTorch's fake process group (``torch.testing``'s ``FakeStore``) as rank ``r`` of
  ``n``; collectives return at once and move no data.
- **local**: the same fake group as rank 0 of ``n``, and every test runs (setup, call, teardown)
  under ``LocalTensorMode`` over all ``n`` ranks, as PyTorch's ``LocalDTensorTestBase`` does: each
  tensor holds every rank's value, collectives compute what real ones would. The ``rank`` fixture
  is a ``torch.SymInt`` of every rank (``LocalIntNode``). LocalTensor runs a collective on a
  subgroup for every rank, each in its own copy of the group, as DeviceMesh dimensions mean it;
  what that would compute wrongly (a group made with ``new_group``, which only its members hold)
  is refused with :class:`LocalModeRefusal` (:func:`refusal` says when and why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ... import _compat
from ...outcome.collectives import group_of_ranks
from ...outcome.merge import ranks_words
from ...rank.context import RankContext

#: Collectives that move no data: skipping one where the process's rank is not a member changes
#: no number, so local mode lets torch skip them as it does.
NO_DATA = ("barrier", "monitored_barrier")


def simulate(ctx: RankContext, mode: str, size: int, rank: int, device: str) -> RankContext:
    """Play a simulated world of ``size``: the fixtures see its rank and size, the default group
    is PyTorch's fake group (as ``rank``, or as rank 0 of all ranks in local mode)."""
    import torch.distributed as dist

    dist.init_process_group("fake", store=_compat.fake_store(), rank=rank, world_size=size)
    ctx.rank, ctx.world_size, ctx.backend, ctx.pg = rank, size, "fake", dist.group.WORLD
    ctx.device_type = device
    if mode == "local":
        ctx.symbolic_rank = _compat.every_rank_int(size)
        _compat.watch_local_collectives(_GroupCheck(size), _refuse_not_member)
    return ctx


class LocalModeRefusal(NotImplementedError):
    """A collective local mode cannot compute exactly; the message says which and why."""


def refusal(op: str, ranks: Sequence[int] | None, size: int, mesh_dim: bool) -> str:
    """Why local mode refuses ``op`` on a group of ``ranks`` (None: a group without rank 0, the
    rank the process is to torch), or "" where LocalTensor computes it exactly: on a group of
    every rank (the world) or a DeviceMesh dimension, and any op that moves no data.

    LocalTensor runs a subgroup collective on every copy of the group shifted across the world
    (for ``[0, 1]`` of 4 ranks: ``[0, 1]`` and ``[2, 3]``), each rank in its own, which is what a
    mesh dimension means. A group from ``new_group`` exists for its members only: in a real
    world the other ranks skip the collective (torch warns), here they would compute one.
    """
    if op in NO_DATA or (ranks is not None and (mesh_dim or sorted(ranks) == [*range(size)])):
        return ""
    tail = (
        " Local mode computes collectives exactly on the world (the default group, or a group "
        "of every rank) and on DeviceMesh dimensions (init_device_mesh(...), mesh.get_group("
        "dim)). Check this test at a real world size (world_size marker), or make the group a "
        "DeviceMesh dimension."
    )
    if ranks is None:
        return (
            f"{op} on a group without rank 0: local mode cannot compute it exactly. It plays "
            "every rank in one process, which is rank 0 to torch, so a group without rank 0 "
            "(new_group gave GroupMember.NON_GROUP_MEMBER) is one it does not hold: torch would "
            "skip the collective on every rank, where in a real world the group's members run "
            "it." + tail
        )
    others = [r for r in range(size) if r not in ranks]
    return (
        f"{op} on {group_of_ranks(ranks)}, which is not a DeviceMesh dimension: local mode cannot "
        f"compute it exactly. In a real world {ranks_words(others)} are not members: "
        "the collective is skipped there. LocalTensor would run it on them too, in copies of "
        "the group of its own making (as for a mesh dimension, where every rank is in one), "
        "giving numbers no real run gives." + tail
    )


class _GroupCheck:
    """``check`` of :func:`_compat.watch_local_collectives`: raise :class:`LocalModeRefusal`
    where :func:`refusal` says so."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, op: str, group: Any) -> None:
        import torch.distributed as dist

        if group is dist.group.WORLD:
            return
        ranks = dist.get_process_group_ranks(group)
        why = refusal(op, ranks, self.size, group.group_name in _compat.mesh_dim_groups())
        if why:
            raise LocalModeRefusal(why)


def _refuse_not_member(op: str) -> None:
    why = refusal(op, None, 0, False)
    if why:
        raise LocalModeRefusal(why)


class LocalMode:
    """Runs every test of a local pool under ``LocalTensorMode`` over the simulated ranks.

    Setup, call and teardown all run inside it, so function-scoped fixtures make the same
    per-rank tensors the test does (:func:`_compat.local_tensor_mode` says what else is set
    around it, as PyTorch's ``LocalDTensorTestBase`` does).
    """

    def __init__(self, size: int) -> None:
        self.size = size

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        with _compat.local_tensor_mode(self.size):
            return (yield)


def local_mode_plugin(simulated: tuple[str, int, int, str] | None) -> LocalMode | None:
    """The plugin a rank process of this simulated world needs, if any."""
    if simulated is None or simulated[0] != "local":
        return None
    return LocalMode(simulated[1])
