"""One test's plan, the same in both modes: its spec and deadline, and an error, a skip or the
GPUs of its ranks, decided before any rank starts.

Runs where tests are planned: the controller (:mod:`pool.plan` adds the key of the pool a test
runs in) and rank 0 of a launched world (:mod:`launch.plan`). A mode hands in what planning does
not read itself: the plugin's rank fixtures the test sets up (``fixtures.rank_fixtures_used``)
and its own check of a distributed test, made after the markers and before the GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from ..settings import Value, item_timeout
from .capabilities import gpu_plan
from .gpuplan import GpuPlan, GpuPolicy
from .meshes import missing_message, shape_of
from .spec import DistSpec, MarkerError, spec_of


@dataclasses.dataclass(frozen=True)
class Rules:
    """The session's default size, backend and deadline, and its GPU options."""

    world_size: int
    backend: str
    timeout: Value[float]
    gpu_policy: GpuPolicy


@dataclasses.dataclass
class ItemPlan:
    """What planning decided about one test; ``spec`` None: an ordinary test (or an error)."""

    spec: DistSpec | None
    #: The test's deadline and where it came from (see settings.item_timeout).
    timeout: Value[float] | None = None
    error: str | None = None
    skip: str | None = None
    #: How its ranks use GPUs, when it runs.
    gpus: GpuPlan | None = None
    #: A skip or skipif marker skips it: pytest's skipping plugin does, without ranks.
    by_mark: bool = False


#: A mode's own check of a distributed test (its item, spec, deadline), before its GPUs: the plan
#: that ends there, or None to go on; a MarkerError or ValueError it raises is the test's error.
ModeCheck = Callable[[pytest.Item, DistSpec, Value[float]], "ItemPlan | None"]


def check_mesh_shape(item: pytest.Item, used: list[str]) -> None:
    """The plugin's ``mesh`` fixture among ``used`` (not one of the test's own of that name)
    needs a shape from ``@pytest.mark.mesh``: an error before any rank starts, not in every
    rank."""
    if "mesh" not in used or "mesh" not in getattr(item, "fixturenames", ()):
        return
    if shape_of(item) is None and item.get_closest_marker("mesh") is None:
        raise MarkerError(missing_message(item.name))


def plan_item(
    item: pytest.Item,
    rules: Rules,
    used: list[str],
    mode: ModeCheck,
    gpu_world: int | None = None,
) -> ItemPlan:
    """The plan of one test; ``gpu_world``: the ranks that share one machine's GPUs, when not
    the whole world (a launched world on several nodes)."""
    try:
        check_mesh_shape(item, used)
        spec = spec_of(item, rules.world_size, rules.backend)
        if spec is None:
            return ItemPlan(None)
        timeout = item_timeout(item, rules.timeout)
        own = mode(item, spec, timeout)
    except (MarkerError, ValueError) as exc:
        return ItemPlan(None, error=f"{item.nodeid}: {exc}")
    if own is not None:
        return own
    local = dataclasses.replace(spec, world_size=gpu_world) if gpu_world else spec
    gpus = gpu_plan(local, rules.gpu_policy)
    if isinstance(gpus, str):
        return ItemPlan(spec, timeout, skip=gpus)
    return ItemPlan(spec, timeout, gpus=gpus)
