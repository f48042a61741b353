"""The controller's plan: what each collected distributed test needs, before anything runs.

Runs in the controller (pool mode), once, at the first test's setup (:class:`controller.
Controller`'s ``_get_plan``). For every item: its spec from the markers (or the marker's error),
its deadline, a skip that needs no ranks (too many ranks for the machine, no GPU, no NCCL), and
the key of the pool it runs in; for each pool, its tests in order (the last test of a pool lets
the pool stop after it) and their files (the pool's ranks collect only those).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from .. import _compat
from ..markers import ISOLATE_INI, DistSpec, MarkerError, wants_fresh_ranks
from ..outcome.expectations import item_expectations
from ..planning.capabilities import gpu_plan, too_many_ranks
from ..planning.gpuplan import GpuPolicy
from ..settings import Value, item_timeout
from .pools.poolkey import PoolKey


@dataclasses.dataclass
class Planned:
    """What the controller decided about one distributed test before running anything."""

    spec: DistSpec | None
    key: PoolKey | None = None
    next_nodeid: str | None = None
    error: str | None = None
    skip: str | None = None
    #: The test's deadline and where it came from (see settings.item_timeout).
    timeout: Value[float] | None = None
    #: A skip or skipif marker skips it: pytest's skipping plugin does, here, without a pool.
    by_mark: bool = False


@dataclasses.dataclass
class Plan:
    """Every distributed test's entry by node id, and each pool's tests and files."""

    plan: dict[str, Planned] = dataclasses.field(default_factory=dict)
    nodeids: dict[PoolKey, list[str]] = dataclasses.field(default_factory=dict)
    files: dict[PoolKey, set[str]] = dataclasses.field(default_factory=dict)


def make_plan(
    items: Sequence[pytest.Item],
    spec_of: Callable[[pytest.Item], DistSpec | None],
    session_timeout: Value[float],
    gpu_policy: GpuPolicy,
) -> Plan:
    """The plan of ``items`` (ordinary tests have no entry)."""
    out = Plan()
    plan = out.plan
    last: dict[PoolKey, Planned] = {}
    fresh = list(items[0].config.getini(ISOLATE_INI)) if items else []
    for item in items:
        try:
            spec = spec_of(item)
            if spec is not None:
                timeout = item_timeout(item, session_timeout)
                item_expectations(item, spec.world_size)  # a bad marker errors here
        except (MarkerError, ValueError) as exc:
            plan[item.nodeid] = Planned(None, error=f"{item.nodeid}: {exc}")
            continue
        if spec is None:
            continue
        if _compat.skip_mark_reason(item) is not None:  # pytest skips it: no pool for it
            plan[item.nodeid] = Planned(spec, by_mark=True)
            continue
        gpus = too_many_ranks(spec.world_size) or gpu_plan(spec, gpu_policy)
        entry = Planned(spec, skip=gpus if isinstance(gpus, str) else None, timeout=timeout)
        plan[item.nodeid] = entry
        if isinstance(gpus, str):
            continue
        entry.key = PoolKey(
            spec.world_size,
            gpus.backend,
            spec.init_process_group,
            gpus=gpus.gpus,
            simulated=spec.simulated,
            gpu_share=gpus.shared,
            gpu_memory=spec.gpu_memory if gpus.gpus else 0,
        )
        if wants_fresh_ranks(item, fresh):  # a key of its own: a pool for this test alone
            entry.key = dataclasses.replace(entry.key, isolated=-len(plan))
        previous = last.get(entry.key)
        if previous is not None:
            previous.next_nodeid = item.nodeid
        last[entry.key] = entry
        out.nodeids.setdefault(entry.key, []).append(item.nodeid)
        out.files.setdefault(entry.key, set()).add(str(item.path))
    return out
