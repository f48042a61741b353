"""The controller's plan: what each collected distributed test needs, before anything runs.

Runs in the controller (pool mode), once, at the first test's setup (:class:`controller.
Controller`'s ``_get_plan``). For every item, planning's decision (:func:`planning.plan.
plan_item`: its spec, deadline, an error, a skip that needs no ranks) with this mode's own part:
its expected exits, a skip marker, too many ranks for the machine, and the key of the pool it
runs in; for each pool, its tests in order (the last test of a pool lets the pool stop after
it) and their files (the pool's ranks collect only those).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from .. import _compat
from ..fixtures import rank_fixtures_used
from ..outcome.expectations import item_expectations
from ..planning.capabilities import too_many_ranks
from ..planning.gpuplan import GpuPolicy
from ..planning.plan import ItemPlan, Rules, plan_item
from ..planning.spec import ISOLATE_INI, DistSpec, wants_fresh_ranks
from ..settings import Settings, Value
from .pools.poolkey import PoolKey


@dataclasses.dataclass
class Planned(ItemPlan):
    """Planning's plan of one distributed test, the pool it runs in and its pool's next test."""

    key: PoolKey | None = None
    next_nodeid: str | None = None


@dataclasses.dataclass
class Plan:
    """Every distributed test's entry by node id, and each pool's tests and files."""

    plan: dict[str, Planned] = dataclasses.field(default_factory=dict)
    nodeids: dict[PoolKey, list[str]] = dataclasses.field(default_factory=dict)
    files: dict[PoolKey, set[str]] = dataclasses.field(default_factory=dict)


def pool_check(item: pytest.Item, spec: DistSpec, timeout: Value[float]) -> ItemPlan | None:
    """Pool mode's own check of a test (planning.plan.ModeCheck)."""
    item_expectations(item, spec.world_size)  # a bad marker errors here
    if _compat.skip_mark_reason(item) is not None:  # pytest skips it: no pool for it
        return ItemPlan(spec, by_mark=True)
    reason = too_many_ranks(spec.world_size)
    return ItemPlan(spec, timeout, skip=reason) if reason else None


def make_plan(items: Sequence[pytest.Item], settings: Settings, gpu_policy: GpuPolicy) -> Plan:
    """The plan of ``items`` (ordinary tests have no entry)."""
    rules = Rules(settings.world_size.value, settings.backend.value, settings.timeout, gpu_policy)
    out = Plan()
    plan = out.plan
    last: dict[PoolKey, Planned] = {}
    fresh = list(items[0].config.getini(ISOLATE_INI)) if items else []
    for item in items:
        got = plan_item(item, rules, rank_fixtures_used(item), pool_check)
        if got.spec is None and got.error is None:
            continue
        entry = Planned(**vars(got))
        plan[item.nodeid] = entry
        if got.spec is None or got.gpus is None:
            continue
        spec, gpus = got.spec, got.gpus
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
