"""The fixtures distributed tests take: rank, world_size, local_rank, backend, pg, device,
dist_store, shared_tmp_path, faults, mesh.

Registered in the controller and in every rank process; their values exist only in ranks. In the
controller a distributed test never sets them up (it runs in its ranks), and an ordinary test that
asks for one gets an error naming the test and the marker to add (raised by the controller before
any fixture runs; the check here is the fallback).

``rank``, ``world_size``, ``local_rank``, ``backend``, ``pg`` and ``device`` are session-scoped:
a rank process belongs to one pool, so they never change within it, and user fixtures of any scope
may depend on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import _compat
from .api.faults import Faults
from .planning.capabilities import misuse_message
from .planning.meshes import missing_message, shape_of
from .rank.context import RANK_CONTEXT, RankContext
from .rank.meshes import device_mesh

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

RANK_FIXTURES = (
    "rank",
    "world_size",
    "local_rank",
    "backend",
    "pg",
    "device",
    "dist_store",
    "shared_tmp_path",
    "faults",
    "mesh",
)


def rank_fixtures_used(item: pytest.Item) -> list[str]:
    """The plugin's rank fixtures an item would set up (not same-named ones of its own).

    A test may parametrize an argument called ``backend`` or define its own ``rank`` fixture;
    only names that resolve to the definitions here count.
    """
    info = _compat.fixture_info(item)
    if info is None:
        return []
    used = []
    for name in RANK_FIXTURES:
        defs = info.name2fixturedefs.get(name)
        if defs and getattr(defs[-1].func, "__module__", None) == __name__:
            used.append(name)
    return used


def _context(request: pytest.FixtureRequest) -> RankContext:
    ctx = request.config.stash.get(RANK_CONTEXT, None)
    if ctx is None:
        item = _compat.request_item(request)
        pytest.fail(misuse_message(item.nodeid, [str(request.fixturename)]), pytrace=False)
    return ctx


@pytest.fixture(scope="session")
def rank(request: pytest.FixtureRequest) -> int:
    """This process's global rank, ``0 <= rank < world_size``; in a local-mode simulated world a
    ``torch.SymInt`` that is each rank at once (docs/simulation.md)."""
    ctx = _context(request)
    return ctx.rank if ctx.symbolic_rank is None else ctx.symbolic_rank


@pytest.fixture(scope="session")
def world_size(request: pytest.FixtureRequest) -> int:
    """Number of ranks running this test (the size from ``@pytest.mark.world_size``)."""
    return _context(request).world_size


@pytest.fixture(scope="session")
def local_rank(request: pytest.FixtureRequest) -> int:
    """This process's rank on its machine (equal to ``rank`` on one machine)."""
    return _context(request).local_rank


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The process group backend of this test, e.g. ``"gloo"`` or ``"nccl"``."""
    return _context(request).backend


@pytest.fixture(scope="session")
def pg(request: pytest.FixtureRequest) -> dist.ProcessGroup:
    """The initialised default (world) process group; created once per pool."""
    ctx = _context(request)
    if ctx.pg is None:
        pytest.fail(
            "fixture 'pg' does not exist in tests marked "
            "@pytest.mark.world_size(..., init_process_group=False): those ranks start without "
            "a default process group. Call torch.distributed.init_process_group() in the test "
            "(RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set) and use the group it makes.",
            pytrace=False,
        )
    return ctx.pg


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """``cuda:<local_rank>`` (already made current) for nccl, ``cpu`` otherwise."""
    return _context(request).device()


@pytest.fixture
def dist_store(request: pytest.FixtureRequest) -> dist.Store:
    """A c10d ``Store`` shared by the ranks of this test, with keys private to the test."""
    return _context(request).test_store()


@pytest.fixture
def shared_tmp_path(request: pytest.FixtureRequest) -> Path:
    """An empty folder, the same for every rank of this test (unlike ``tmp_path``)."""
    path = Path(_context(request).test.shared_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> Iterator[Faults]:
    """Inject a fault at a chosen collective, for this test only: ``faults.kill``,
    ``raise_in``, ``delay``, ``hang`` (docs/fault-tolerance.md)."""
    ctx = _context(request)
    with Faults.for_test(ctx.rank, ctx.world_size, _compat.request_item(request)) as armed:
        yield armed


@pytest.fixture
def mesh(request: pytest.FixtureRequest) -> DeviceMesh:
    """The test's named ``DeviceMesh`` (``@pytest.mark.mesh(dp=2, tp=2)``) on the ``device``
    fixture's device type; made once per pool and shape, owned by the plugin (docs/fixtures.md)."""
    ctx = _context(request)
    item = _compat.request_item(request)
    shape = shape_of(item)
    if shape is None:
        pytest.fail(missing_message(item.nodeid), pytrace=False)
    return device_mesh(shape, ctx.device().type)
