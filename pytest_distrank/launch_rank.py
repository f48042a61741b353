"""Launcher mode, the rank's own side: its process group, and its reports on the wire.

Runs in every rank of a launched world, in the main thread (serialization also in the watchdog).
The default process group is initialised over the control store's ``data`` connection, in a key
space of its own per initialisation: once before the first distributed test, again when a test
asks for another backend, and again on every rank when a test left any rank's group destroyed or
replaced (rank 0's verdict carries a generation number that says so). The fixtures read
``config.stash[RANK_CONTEXT]``, exactly as in spawn-mode ranks.
"""

from __future__ import annotations

import contextlib
import traceback
import types
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.reports import TestReport

from . import fixtures as fixtures_module
from .protocol import RankConfig
from .worker import RANK_CONTEXT, RankContext, cap_section

if TYPE_CHECKING:
    from .launch import LaunchPlugin

#: Captured sections longer than this are cut before they travel to rank 0.
SECTION_LIMIT = 256 * 1024


def group_healthy(plugin: LaunchPlugin) -> bool:
    """Is the default group still the one this rank initialised?"""
    import torch.distributed as dist

    ctx = plugin.ctx
    return ctx is not None and dist.is_initialized() and dist.group.WORLD is ctx.pg


def ensure_group(plugin: LaunchPlugin, backend: str) -> None:
    """Initialise the default group for this backend and generation, unless it is up already."""
    import torch.distributed as dist

    key = (backend, plugin.gen)
    if plugin.group_key == key and group_healthy(plugin):
        return
    assert plugin.channel is not None and plugin.session is not None
    first = plugin.ctx is None
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    device_id = None
    local_rank = plugin.launch.local_rank
    if "nccl" in backend:
        import torch

        torch.cuda.set_device(local_rank)
        device_id = torch.device("cuda", local_rank)
    plugin.inits += 1
    plugin.group_key = None
    dist.init_process_group(
        backend,
        store=plugin.channel.pg_store(plugin.inits),
        rank=plugin.rank,
        world_size=plugin.world_size,
        device_id=device_id,
    )
    cfg = RankConfig(
        rank=plugin.rank,
        world_size=plugin.world_size,
        local_rank=local_rank,
        backend=backend,
        init_process_group=True,
        pool_id=plugin.inits,
        store_path="",
        pytest_args=(),
        env={},
        log_path=plugin.log_path,
        nodeids=(),
    )
    plugin.ctx = RankContext(cfg, plugin.channel.user_store, dist.group.WORLD)
    plugin.config.stash[RANK_CONTEXT] = plugin.ctx
    if not first:
        _reset_group_fixtures(plugin, plugin.session)
    plugin.config.hook.pytest_distrank_rank_setup(
        config=plugin.config, rank=plugin.rank, world_size=plugin.world_size
    )
    plugin.group_key = key


def _reset_group_fixtures(plugin: LaunchPlugin, session: pytest.Session) -> None:
    """The session-scoped ``pg``, ``backend`` and ``device`` hold the old group: finish them (and
    the user's fixtures that depend on them), so that the next test gets the new one."""
    shim: Any = types.SimpleNamespace(node=session)
    manager: Any = session._fixturemanager
    for name in ("pg", "backend", "device"):
        for fixturedef in manager.getfixturedefs(name, session) or ():
            if getattr(fixturedef.func, "__module__", None) != fixtures_module.__name__:
                continue
            try:
                fixturedef.finish(shim)
            except BaseException:
                plugin.log(
                    f"distrank: {plugin.launch.label()}: error tearing down fixtures that "
                    f"depend on {name!r} after the process group was replaced:\n"
                    + traceback.format_exc()
                )


def serialize(config: pytest.Config, report: TestReport) -> dict[str, Any]:
    """pytest's own serialization (as pytest-xdist ships reports), huge sections cut."""
    report.sections = [(title, cap_section(content)) for title, content in report.sections]
    data: dict[str, Any] = config.hook.pytest_report_to_serializable(config=config, report=report)
    return data


def deserialize(config: pytest.Config, data: dict[str, Any]) -> TestReport:
    """The inverse of :func:`serialize`, after a trip through JSON (which makes tuples lists:
    a skip's ``longrepr`` must be a tuple again)."""
    for key in ("longrepr", "location"):
        if isinstance(data.get(key), list):
            data[key] = tuple(data[key])
    data["user_properties"] = [tuple(p) for p in data.get("user_properties", [])]
    report = config.hook.pytest_report_from_serializable(config=config, data=data)
    assert isinstance(report, TestReport)
    return report
