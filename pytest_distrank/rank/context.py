"""Who this rank is, for the fixtures: the rank context that either mode builds.

Runs in rank processes of both modes: a pool's rank (:mod:`pool.worker.rankgroup` builds it from its
start-up message) and a launched rank (:mod:`launch.group` builds it from the launcher's
environment). The fixtures (:mod:`fixtures`) read it from ``config.stash[RANK_CONTEXT]`` and import
nothing of either mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import pytest

from ..outcome.records import RunTest
from ..planning.crossize import RANK_CONTEXT as IN_RANK

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


@dataclasses.dataclass
class RankContext:
    """What the fixtures of a rank process read: who this rank is, its store and group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    #: The store shared by the ranks (``dist_store`` gives each test its own prefix of it).
    store: Any
    #: The default process group the rank serves tests with; None under init_process_group=False.
    pg: Any | None
    #: The test being run (its index, node id and shared folder).
    test: RunTest = dataclasses.field(default_factory=lambda: RunTest(-1, "", None, ""))
    #: Pool mode, on rank 0: the TCPStore server behind MASTER_PORT (kept alive while in use).
    master_server: Any = None
    #: A simulated world's ``device`` type ("cpu" or "meta"); "" leaves it to the backend.
    device_type: str = ""
    #: A local-mode world: the ``rank`` fixture's value, a ``torch.SymInt`` of every rank.
    symbolic_rank: Any = None
    #: Pool mode: the CUDA device index the pool gave this rank (-1: none, or the backend's rule).
    cuda_device: int = -1

    def device(self) -> torch.device:
        import torch

        if self.device_type:
            return torch.device(self.device_type)
        if self.cuda_device >= 0:
            return torch.device("cuda", self.cuda_device)
        if "nccl" in self.backend:
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def test_store(self) -> dist.Store:
        import torch.distributed as dist

        return dist.PrefixStore(f"test{self.test.index}/", self.store)


#: Where a rank keeps its context (``config.stash``): planning's key (planning/crossize.py reads the
#: test from it, below ``rank/``), typed here as the whole context.
RANK_CONTEXT = cast("pytest.StashKey[RankContext]", IN_RANK)


#: ``(code, source, injected line, phase)`` -> the controller (pool mode; None elsewhere).
Channel = Callable[[int | None, str, str, str], None]
_channel: Channel | None = None


def set_channel(channel: Channel | None) -> None:
    """Pool mode: how this rank tells its controller, during a test, what it must know (an
    injected fault about to fire, :mod:`api.faults`; an exit it is meant to make)."""
    global _channel
    _channel = channel


def channel() -> Channel | None:
    """The channel :func:`set_channel` set; None outside a pool's rank."""
    return _channel


def announce_exit(code: int | None, source: str) -> None:
    """This rank is meant to end the running test with ``code`` (``-6``: SIGABRT), for
    ``source``'s reason (a harness class's ``special_return_code_checks``); None: it is not
    any more (it lived, and was judged in place)."""
    if _channel is not None:
        _channel(code, source, "", "call")
