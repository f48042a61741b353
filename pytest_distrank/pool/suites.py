"""Existing distributed suites, unmodified: PyTorch's ``MultiProcessTestCase`` family on warm pools.

Runs in pool mode's controller and in every pool rank: both collect the same tests, and this
module must decide the same for each. A test method of a class that spawns its own ranks (a
subclass of ``MultiProcessTestCase`` or ``MultiProcContinuousTest`` from
``torch.testing._internal.common_distributed``, found by class, not by name, whose dispatching
methods are the harness's own) becomes a distributed test of the class's world size with
``init_process_group=False``: the class initialises its own process group, in each rank.
:mod:`pool.worker.suiterank` runs it inside a warm rank the way the class's own harness runs it in a
freshly spawned process. Classes that look alike but do not spawn (``LocalDTensorTestBase``,
``MultiThreadedTestCase``) stay ordinary tests.

Classes whose tests keep state that a warm rank cannot give back (RPC's test fixture) run each
test on fresh ranks (:data:`FRESH_BASES`), said once per class in the summary; users name their
own with the ini key ``distrank_isolate_tests``.

Not registered in launcher mode (there each process already is a rank of a launched world, and
the classes' own harness runs as it always does), nor with ``--distrank-suites=own``; a class
opts out with ``distrank_suites = "own"``.

Collection stays cheap: the world size comes from an instance of the class (its ``world_size``,
a property that may read ``torch.cuda.device_count()``, which asks NVML and initialises no CUDA)
or, for a continuous class, from its own ``_get_world_size``. A world size that cannot run here
(0 GPUs, a backend that is not built in, a unittest skip decorator) becomes a skip before any
process starts.
"""

from __future__ import annotations

import dataclasses
import unittest
from typing import Any, Literal

import pytest

from .. import _compat
from ..planning.spec import SPEC_ERROR

#: The class attribute by which a class opts out (``"own"``: its harness runs it).
OPT_OUT = "distrank_suites"

Kind = Literal["spawn", "continuous"]


@dataclasses.dataclass(frozen=True)
class Case:
    """How pool mode runs one test method of an existing suite."""

    kind: Kind
    world_size: int


#: Set on every item this module takes over, in the controller and in the ranks.
CASE = pytest.StashKey[Case]()


def harness() -> Any | None:
    """PyTorch's harness module, when the test files imported it (never imported here)."""
    return _compat.harness_module()


def kind_of(cls: object, module: Any) -> Kind | None:
    """Which harness a test class uses, or None when it does not spawn ranks of its own."""
    if not isinstance(cls, type) or getattr(cls, OPT_OUT, "warm") == "own":
        return None
    return _compat.harness_kind(cls, module)


class SuitesPlugin:
    """Marks the test methods of spawning classes as distributed tests (see the module)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:  # DeepSpeed's DistributedTest classes (docs/deepspeed.md)
            if _compat.ds_harness_base(getattr(item, "cls", None)) is not None:
                take_deepspeed(item)
        module = harness()
        if module is None:
            return
        for item in items:
            kind = kind_of(getattr(item, "cls", None), module)
            if kind is not None:
                take(item, kind)


def take(item: pytest.Item, kind: Kind) -> None:
    """Make ``item`` a distributed test of its class's world size (or a skip, or an error)."""
    cls = getattr(item, "cls")  # noqa: B009 (a unittest item has one; mypy does not know it)
    name = item.name
    user = item.get_closest_marker("world_size")
    if user is not None:
        item.stash[SPEC_ERROR] = (
            f"@pytest.mark.world_size on {cls.__name__}, a {_base_name(kind)} class: pytest-"
            "distrank runs its tests on warm pools of the class's own world size (its "
            "world_size attribute), so the marker would start a second world inside each rank. "
            "Remove the marker; set the class's world_size to choose the size."
        )
        return
    skip = _unittest_skip(cls, name)
    if skip is None:
        try:
            size = _world_size(cls, name, kind, harness())
        except unittest.SkipTest as exc:
            skip = str(exc)
        except Exception as exc:
            item.stash[SPEC_ERROR] = (
                f"{cls.__name__}: could not read the world size of {name}: "
                f"{type(exc).__name__}: {exc}"
            )
            return
        else:
            if size < 1:
                skip = (
                    f"{cls.__name__}.world_size is {size} on this machine (it often counts "
                    "GPUs: torch.cuda.device_count())"
                )
    if skip is not None:
        item.add_marker(pytest.mark.skip(reason=skip))
        return
    item.stash[CASE] = Case(kind, size)
    item.add_marker(pytest.mark.world_size(size, init_process_group=False))
    why = fresh_reason(cls)
    if why:
        item.stash[FRESH] = why
        item.add_marker(pytest.mark.distrank_isolate)


#: The world size of a test of DeepSpeed's ``DistributedTest`` taken over (in the controller and
#: the ranks; :mod:`pool.worker.dsrank` runs it as the harness's child would).
DS_CASE = pytest.StashKey[int]()


def take_deepspeed(item: pytest.Item) -> None:
    """A test of DeepSpeed's ``DistributedTest``: its ``world_size`` marks are the harness's own
    (dropped from the item); one world size makes it a distributed test of that size; several
    (``world_size = [1, 2, 4]``, run one after another) or a ``world_size`` fixture keep its
    harness, which then runs it in the pytest process."""
    cls = getattr(item, "cls")  # noqa: B009
    for mark in [m for m in item.own_markers if m.name == "world_size"]:
        item.own_markers.remove(mark)
    if getattr(cls, OPT_OUT, "warm") == "own":
        return
    callspec = getattr(item, "callspec", None)
    function = getattr(item, "function")  # noqa: B009 (a pytest Function has one)
    try:
        size = _compat.ds_requested_size(cls, function, callspec.params if callspec else {})
    except Exception:
        return  # its own harness reports it
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        item.stash[DS_CASE] = size
        item.add_marker(pytest.mark.world_size(size, init_process_group=False))


#: Base classes whose tests keep process-wide state a warm rank cannot give back, by name (in
#: any module): RPC's test fixture initialises an RPC agent per test (``rpc.init_rpc``), whose
#: RRefs, agent threads and shutdown survive in a warm rank and break its next test.
FRESH_BASES = {"RpcAgentTestFixture": "RPC state does not survive between tests"}
#: Set on the items of such classes: why each runs on fresh ranks (said once per class).
FRESH = pytest.StashKey[str]()


def fresh_reason(cls: type) -> str:
    """Why the tests of ``cls`` need fresh ranks each ("": a warm pool is as good)."""
    for base in cls.__mro__:
        why = FRESH_BASES.get(base.__name__)
        if why:
            return why
    return ""


def fresh_notes(items: list[pytest.Item]) -> list[str]:
    """One summary line per class whose tests ran on fresh ranks for what they are."""
    counts: dict[tuple[str, str], int] = {}
    for item in items:
        why = item.stash.get(FRESH, "")
        if why:
            key = (getattr(item, "cls").__name__, why)  # noqa: B009
            counts[key] = counts.get(key, 0) + 1
    return [
        f"{n} test{'s' if n > 1 else ''} of {cls} ran on fresh ranks: {why} (a pool each)"
        for (cls, why), n in counts.items()
    ]


def _base_name(kind: Kind) -> str:
    return "MultiProcessTestCase" if kind == "spawn" else "MultiProcContinuousTest"


def _unittest_skip(cls: type, name: str) -> str | None:
    """The reason of a unittest skip decorator on the class or the method (``requires_gloo``,
    ``skipIf...``): such a test never reaches its harness's processes."""
    for target in (cls, getattr(cls, name, None)):
        if getattr(target, "__unittest_skip__", False):
            return str(getattr(target, "__unittest_skip_why__", "") or "skipped")
    return None


def _world_size(cls: Any, name: str, kind: Kind, module: Any) -> int:
    """What the class's own harness would spawn for this test (raises ``unittest.SkipTest``
    where that harness would skip before spawning)."""
    if kind == "spawn":
        return int(cls(name).world_size)
    return _compat.harness_world_size(cls, module)
