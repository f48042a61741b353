"""Unit tests of which existing-suite classes pool mode takes over, and how (pool/suites.py):
``kind_of`` against a stand-in for PyTorch's harness module (the real one is slow to import and
cannot be imported twice in one process), ``take`` on items of a plain ``unittest.TestCase``
class (a ``spawn`` class's world size is its instance's ``world_size``). The end-to-end tests
of the same classes under the real harness are in tests/e2e/test_existing_suites.py."""

from __future__ import annotations

import types

import pytest

from pytest_distrank.planning.spec import SPEC_ERROR
from pytest_distrank.pool.suites import CASE, OPT_OUT, Case, kind_of, take


class MultiProcessTestCase:
    def join_or_run(self) -> None:
        pass


class MultiProcContinuousTest:
    @classmethod
    def _ensure_processes_spawned(cls) -> None:
        pass


#: The harness module's two classes, as ``kind_of`` reads them.
HARNESS = types.SimpleNamespace(
    MultiProcessTestCase=MultiProcessTestCase, MultiProcContinuousTest=MultiProcContinuousTest
)


class Spawning(MultiProcessTestCase):
    pass


class RunsInPlace(MultiProcessTestCase):  # as LocalDTensorTestBase: its own join_or_run
    def join_or_run(self) -> None:
        pass


class Continuous(MultiProcContinuousTest):
    pass


class FakesItsGroup(MultiProcContinuousTest):  # as LocalDTensorContinuousTestBase
    @classmethod
    def _ensure_processes_spawned(cls) -> None:
        pass


class OptedOut(Spawning):
    distrank_suites = "own"


@pytest.mark.parametrize(
    "cls, kind",
    [
        (Spawning, "spawn"),
        (RunsInPlace, None),
        (Continuous, "continuous"),
        (FakesItsGroup, None),
        (OptedOut, None),
        (type("Ordinary", (), {}), None),
        (None, None),  # a test function's item has no class
        (Spawning(), None),  # not a class
    ],
)
def test_kind_of_finds_the_harness_classes_that_spawn(cls: object, kind: str | None) -> None:
    assert kind_of(cls, HARNESS) == kind


def test_a_class_opts_out_with_own_only() -> None:
    assert OPT_OUT == "distrank_suites"
    assert kind_of(type("Warm", (Spawning,), {OPT_OUT: "warm"}), HARNESS) == "spawn"


CLASSES = """
    import unittest
    import pytest

    class TestTwo(unittest.TestCase):
        world_size = 2

        def test_x(self):
            pass

        @unittest.skip("not today")
        def test_skipped(self):
            pass

    class TestNoGpus(unittest.TestCase):
        world_size = 0

        def test_x(self):
            pass

    class TestBroken(unittest.TestCase):
        @property
        def world_size(self):
            raise RuntimeError("no such device")

        def test_x(self):
            pass

    @pytest.mark.world_size(2)
    class TestMarked(unittest.TestCase):
        world_size = 2

        def test_x(self):
            pass
"""


@pytest.fixture
def items(pytester: pytest.Pytester) -> dict[str, pytest.Item]:
    """The items of :data:`CLASSES` by ``Class.method``, each taken as a ``spawn`` class's."""
    found = {}
    for item in pytester.getitems(CLASSES):
        found[f"{getattr(item, 'cls').__name__}.{item.name}"] = item  # noqa: B009 (unittest item)
    for item in found.values():
        take(item, "spawn")
    return found


def _skip(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("skip")
    return None if mark is None else str(mark.kwargs["reason"])


def test_take_makes_a_distributed_test_of_the_class_world_size(
    items: dict[str, pytest.Item],
) -> None:
    item = items["TestTwo.test_x"]
    assert item.stash[CASE] == Case("spawn", 2)
    mark = item.get_closest_marker("world_size")
    assert mark is not None and mark.args == (2,)
    assert mark.kwargs == {"init_process_group": False}  # the class initialises its own
    assert _skip(item) is None and SPEC_ERROR not in item.stash


def test_a_unittest_skip_is_a_skip_before_any_process(items: dict[str, pytest.Item]) -> None:
    item = items["TestTwo.test_skipped"]
    assert _skip(item) == "not today"
    assert CASE not in item.stash and item.get_closest_marker("world_size") is None


def test_a_world_size_of_zero_is_a_skip_saying_why(items: dict[str, pytest.Item]) -> None:
    item = items["TestNoGpus.test_x"]
    assert _skip(item) == (
        "TestNoGpus.world_size is 0 on this machine (it often counts GPUs: "
        "torch.cuda.device_count())"
    )
    assert CASE not in item.stash


def test_a_world_size_that_cannot_be_read_errors_the_test(items: dict[str, pytest.Item]) -> None:
    item = items["TestBroken.test_x"]
    assert item.stash[SPEC_ERROR] == (
        "TestBroken: could not read the world size of test_x: RuntimeError: no such device"
    )
    assert CASE not in item.stash


def test_a_world_size_marker_on_the_class_is_an_error(items: dict[str, pytest.Item]) -> None:
    item = items["TestMarked.test_x"]
    assert item.stash[SPEC_ERROR] == (
        "@pytest.mark.world_size on TestMarked, a MultiProcessTestCase class: pytest-distrank "
        "runs its tests on warm pools of the class's own world size (its world_size "
        "attribute), so the marker would start a second world inside each rank. Remove the "
        "marker; set the class's world_size to choose the size."
    )
    assert CASE not in item.stash
