"""Unit tests of one test's plan, the same in both modes (planning/plan.py: plan_item)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from pytest_distrank.envvars import FAKE_GPU_COUNT_ENV, FAKE_NCCL_VERSION_ENV
from pytest_distrank.planning.gpuplan import STRICT, GpuPlan
from pytest_distrank.planning.meshes import WS_PARAM, Mesh, Variant
from pytest_distrank.planning.plan import ItemPlan, Rules, plan_item
from pytest_distrank.planning.spec import DistSpec, MarkerError
from pytest_distrank.settings import Value

RULES = Rules(2, "gloo", Value(300.0, "default"), STRICT)
m = pytest.mark


class _Item:
    """What planning reads of an item: its markers, stash, node id, fixtures and callspec."""

    def __init__(
        self,
        *marks: pytest.MarkDecorator,
        fixtures: tuple[str, ...] = (),
        shape: Mesh | None = None,
    ) -> None:
        self.own_markers = [mark.mark for mark in marks]
        self.stash = pytest.Stash()
        self.name = "test_x"
        self.nodeid = "test_x.py::test_x"
        self.fixturenames = list(fixtures)
        if shape is not None:
            self.callspec = SimpleNamespace(marks=[], params={WS_PARAM: Variant(4, shape)})

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [mark for mark in self.own_markers if mark.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def _none(item: pytest.Item, spec: DistSpec, timeout: Value[float]) -> ItemPlan | None:
    return None


def _plan(item: _Item, used: tuple[str, ...] = (), gpu_world: int | None = None) -> ItemPlan:
    return plan_item(cast(pytest.Item, item), RULES, list(used), _none, gpu_world)


@pytest.fixture(autouse=True)
def _no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAKE_GPU_COUNT_ENV, "0")
    monkeypatch.delenv(FAKE_NCCL_VERSION_ENV, raising=False)


def test_an_ordinary_test_has_no_spec_and_nothing_to_decide() -> None:
    assert _plan(_Item()) == ItemPlan(None)


def test_a_distributed_test_gets_its_spec_deadline_and_gpus() -> None:
    got = _plan(_Item(m.world_size(2), m.timeout(7)))
    assert got.spec == DistSpec(2, "gloo", True, False, 0)
    assert got.timeout == Value(7.0, "@pytest.mark.timeout(7)")
    assert (got.error, got.skip, got.gpus) == (None, None, GpuPlan(0, "gloo"))


def test_a_bad_marker_or_deadline_is_the_tests_error_naming_it() -> None:
    assert _plan(_Item(m.world_size(0))).error == (
        "test_x.py::test_x: @pytest.mark.world_size(0): world size 0 is not a positive integer; "
        "write e.g. @pytest.mark.world_size(2) or world_size(2, 4)."
    )
    bad = _plan(_Item(m.world_size(2), m.timeout("soon")))
    assert bad.spec is None and bad.error is not None and "timeout('soon')" in bad.error


def test_the_plugins_mesh_fixture_needs_a_shape() -> None:
    """Only when the plugin's ``mesh`` is among the fixtures the caller says the test uses."""
    item = _Item(m.world_size(4), fixtures=("mesh",))
    assert _plan(item, used=("mesh",)).error == (
        "test_x.py::test_x: test_x uses the fixture 'mesh', which needs a shape: add "
        "@pytest.mark.mesh(dp=2, tp=2) (or mesh({'dp': 2, 'tp': 2}, {'dp': 4}) for several) "
        "to the test."
    )
    assert _plan(item, used=()).error is None  # a fixture of its own called mesh
    shaped = _Item(m.world_size(4), fixtures=("mesh",), shape=Mesh((("dp", 2), ("tp", 2))))
    assert _plan(shaped, used=("mesh",)).error is None


def test_the_modes_own_check_comes_before_the_gpus() -> None:
    item = cast(pytest.Item, _Item(m.world_size(2), m.requires_nccl))

    def refuse(item: pytest.Item, spec: DistSpec, timeout: Value[float]) -> ItemPlan | None:
        return ItemPlan(spec, timeout, skip="not in this mode")

    def fail(item: pytest.Item, spec: DistSpec, timeout: Value[float]) -> ItemPlan | None:
        raise MarkerError("a marker this mode cannot honour")

    assert plan_item(item, RULES, [], refuse).skip == "not in this mode"
    assert plan_item(item, RULES, [], fail).error == (
        "test_x.py::test_x: a marker this mode cannot honour"
    )
    assert plan_item(item, RULES, [], _none).skip == (
        "requires_nccl: needs NCCL and 2 GPUs, but this torch build "
        f"(torch {__import__('torch').__version__}) has no NCCL"
    )


def test_gpus_are_counted_for_the_ranks_of_one_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAKE_GPU_COUNT_ENV, "2")
    monkeypatch.setenv(FAKE_NCCL_VERSION_ENV, "2.21.5")
    item = _Item(m.world_size(4, backend="nccl"))
    assert _plan(item).skip == (
        "backend 'nccl' needs 4 GPUs (one per rank), 2 visible; --distrank-gpu-oversubscribe "
        "lets 4 ranks share 2 GPUs"
    )
    local = _plan(item, gpu_world=2)
    assert local.skip is None and local.gpus == GpuPlan(2, "nccl")
    assert local.spec is not None and local.spec.world_size == 4
