"""Private torch access for :func:`pytest_distrank.reference`: a one-rank world swapped in for
the rank's own while a function runs, and the test's world put back after it.

Runs in rank processes of both modes, inside a test (``api/reference.py`` calls it). torch is
imported only when a function is called. Through :mod:`pytest_distrank._compat`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: ``torch.distributed.distributed_c10d``'s module globals that hold its world (torch 2.x keeps
#: the ``_World`` object's maps in these, not in the object): swapped for fresh ones, then put back.
_WORLD_GLOBALS = (
    "_world",
    "_pg_map",
    "_pg_names",
    "_pg_group_ranks",
    "_pg_backend_config",
    "_group_count",
    "_tags_to_pg",
    "_pg_to_tag",
    "_backend",
    "_default_pg_init_method",
)
#: Names given to the groups a reference function creates start here, so that none of them is
#: registered under a name of the test's own groups ("0", "1", ...) in torch's C++ registry.
_FOREIGN_GROUP_COUNT = 1_000_000


@contextlib.contextmanager
def one_rank_world() -> Iterator[None]:
    """A world of one rank (rank 0, size 1, on gloo, with NCCL for CUDA tensors where the
    test's world has it, over an in-process ``HashStore``) as the default group while the
    block runs.

    torch.distributed keeps one process-wide world in private module globals of
    ``distributed_c10d`` (``_world`` and the maps its properties read, ``_pg_map``,
    ``_pg_names``, ...) and the global rank in C++ (``_set_global_rank``). Those are saved,
    replaced by fresh ones for the block (``init_process_group`` there), and put back
    after it; the names of the test's groups are registered again in torch's C++ group registry
    (``_register_process_group``), so functional collectives and DTensor find them as before.
    The test's groups, their sequence numbers and its group counter are never touched. DTensor's
    random-number tracker (``_rng_tracker``) is saved and put back too. A rename in torch makes
    this raise (AttributeError, KeyError): the reference then fails, naming the error.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    saved = {name: getattr(c10d, name) for name in _WORLD_GLOBALS}
    saved_rank = dist.get_rank() if dist.is_initialized() else -1
    backend = "gloo"
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        backend = "cpu:gloo,cuda:nccl"
    names = dict(saved["_pg_names"])
    rng = _rng_tracker()
    c10d._world = c10d._World()
    c10d._pg_map, c10d._pg_names, c10d._pg_group_ranks = {}, {}, {}
    c10d._pg_backend_config, c10d._tags_to_pg, c10d._pg_to_tag = {}, {}, {}
    c10d._group_count = _FOREIGN_GROUP_COUNT
    c10d._backend = None
    c10d._default_pg_init_method = None
    try:
        dist.init_process_group(
            backend,
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            _ranks=[_FOREIGN_GROUP_COUNT],  # a hashed name no group of the test has
        )
        yield
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            for name, value in saved.items():
                setattr(c10d, name, value)
            torch._C._distributed_c10d._set_global_rank(saved_rank)
            for pg, name in names.items():
                with contextlib.suppress(Exception):
                    c10d._register_process_group(name, pg)
            _set_rng_tracker(rng)


def _rng_tracker() -> Any:
    import sys

    module = sys.modules.get("torch.distributed.tensor._random")
    return None if module is None else getattr(module, "_rng_tracker", None)


def _set_rng_tracker(tracker: Any) -> None:
    import sys

    module = sys.modules.get("torch.distributed.tensor._random")
    if module is not None and hasattr(module, "_rng_tracker"):
        setattr(module, "_rng_tracker", tracker)  # noqa: B010
