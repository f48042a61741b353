"""A simulated world in one rank process (``@pytest.mark.simulate``): fake and local modes.

Runs in pool-mode rank processes whose pool plays a simulated world (:mod:`rankgroup` calls
:func:`simulate` at start-up; :mod:`worker` registers :class:`LocalMode` for local pools). The
process is rank 0 of a pool of one as far as the plugin's own store goes; torch.distributed and
the fixtures see the simulated world:

- **fake**: PyTorch's fake process group (``torch.testing``'s ``FakeStore``) as rank ``r`` of
  ``n``; collectives return at once and move no data.
- **local**: the same fake group as rank 0 of ``n``, and every test runs (setup, call, teardown)
  under ``LocalTensorMode`` over all ``n`` ranks, as PyTorch's ``LocalDTensorTestBase`` does: each
  tensor holds every rank's value, collectives compute what real ones would. The ``rank`` fixture
  is a ``torch.SymInt`` of every rank (``LocalIntNode``).
"""

from __future__ import annotations

from typing import Any

import pytest

from .. import _compat
from ..context import RankContext


def simulate(ctx: RankContext, mode: str, size: int, rank: int, device: str) -> RankContext:
    """Play a simulated world of ``size``: the fixtures see its rank and size, the default group
    is PyTorch's fake group (as ``rank``, or as rank 0 of all ranks in local mode)."""
    import torch.distributed as dist

    dist.init_process_group("fake", store=_compat.fake_store(), rank=rank, world_size=size)
    ctx.rank, ctx.world_size, ctx.backend, ctx.pg = rank, size, "fake", dist.group.WORLD
    ctx.device_type = device
    if mode == "local":
        ctx.symbolic_rank = _compat.every_rank_int(size)
    return ctx


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
