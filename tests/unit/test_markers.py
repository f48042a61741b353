"""Unit tests of marker reading (planning/spec.py)."""

from __future__ import annotations

import re

import pytest

from pytest_distrank.planning.spec import (
    MarkerError,
    gpu_memory,
    simulations,
    spec_of,
    world_size_marker,
    world_sizes,
)


def mark(*args: object, **kwargs: object) -> pytest.Mark:
    return pytest.mark.world_size(*args, **kwargs).mark


def test_sizes_and_default() -> None:
    assert world_sizes(mark(4), default=2) == (4,)
    assert world_sizes(mark(2, 4), default=2) == (2, 4)
    assert world_sizes(mark(), default=3) == (3,)


@pytest.mark.parametrize("bad", [0, -1, "four", True, 2.0, None])
def test_bad_sizes_name_the_marker_and_value(bad: object) -> None:
    with pytest.raises(MarkerError, match=r"@pytest\.mark\.world_size\(.*\): world size .* is not"):
        world_sizes(mark(bad), default=2)


def test_unknown_keyword() -> None:
    with pytest.raises(MarkerError, match="unknown keyword 'size'"):
        world_sizes(mark(2, size=3), default=2)


class _Item:
    """What simulations() and spec_of() read of an item: its markers (all its own here), its
    stash, and the marks of its ``pytest.param`` (``param_marks``)."""

    def __init__(
        self, *marks: pytest.MarkDecorator, param_marks: tuple[pytest.MarkDecorator, ...] = ()
    ) -> None:
        self.marks = [m.mark for m in (*marks, *param_marks)]
        self.own_markers = self.marks
        self.stash = pytest.Stash()
        self.name = "test_x"
        if param_marks:
            params = [m.mark for m in param_marks]
            self.callspec = type("CallSpec", (), {"marks": params, "params": {}})()

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [m for m in self.marks if m.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def test_simulated_worlds_one_per_size_and_rank() -> None:
    item = _Item(pytest.mark.simulate("fake", 64, 1024, ranks=(0, 63)))
    worlds = simulations(item)  # type: ignore[arg-type]
    assert [(w.size, w.rank) for w in worlds] == [(64, 0), (64, 63), (1024, 0), (1024, 63)]
    assert [w.id for w in worlds][:2] == ["ws64-fake-r0", "ws64-fake-r63"]
    assert simulations(_Item(pytest.mark.simulate("fake", 8)))[0].id == "ws8-fake"  # type: ignore[arg-type]
    assert simulations(_Item(pytest.mark.simulate("fake", 8, ranks=7)))[0].rank == 7  # type: ignore[arg-type]


def test_local_and_meta_worlds() -> None:
    local = simulations(_Item(pytest.mark.simulate("local", 4, 64)))  # type: ignore[arg-type]
    assert [s.id for s in local] == ["ws4-local", "ws64-local"]
    assert local[1].describe() == "world size 64 simulated (local: every rank at once)"
    meta = simulations(_Item(pytest.mark.simulate("fake", 8, device="meta")))[0]  # type: ignore[arg-type]
    assert (meta.id, meta.device) == ("ws8-fake", "meta")
    assert meta.describe() == "world size 8 simulated (fake, as rank 0, device meta)"


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (pytest.mark.simulate("threads", 8), "mode 'threads' is not one of 'fake', 'local'"),
        (pytest.mark.simulate(), "mode none is not one of 'fake', 'local'"),
        (pytest.mark.simulate("local", 8, ranks=(1,)), "local mode plays every rank at once"),
        (pytest.mark.simulate("fake", 8, device="cuda"), "device 'cuda' is not one of"),
        (pytest.mark.simulate("local", 8, device="meta"), "device='meta' is for 'fake' worlds"),
        (pytest.mark.simulate("fake"), "give the simulated world size"),
        (pytest.mark.simulate("fake", 0), "world size 0 is not a positive integer"),
        (pytest.mark.simulate("fake", 8, ranks=(8,)), "rank 8 is not a rank of a world of size 8"),
        (pytest.mark.simulate("fake", 8, ranks=(True,)), "rank True is not a rank"),
        (pytest.mark.simulate("fake", 8, mode="x"), "unknown keyword 'mode'"),
        # D3: an empty ranks= made no simulated world, and the test an ordinary one.
        (pytest.mark.simulate("fake", 1024, ranks=()), "ranks=() names no rank"),
        (pytest.mark.simulate("fake", 1024, ranks=[]), "ranks=[] names no rank"),
        (pytest.mark.simulate("fake", 8, ranks=1.5), "ranks=1.5 is not a rank or a tuple"),
        # D17: a size the fake process group cannot take failed the pool's start, unexplained.
        (
            pytest.mark.simulate("fake", 2**40),
            f"world size {2**40} is more than PyTorch's fake process group takes: its size is "
            f"a C int, at most {2**31 - 1}.",
        ),
    ],
)
def test_bad_simulate_markers_say_what_is_wrong(marker: pytest.MarkDecorator, message: str) -> None:
    with pytest.raises(MarkerError, match=re.escape(message)):
        simulations(_Item(marker))  # type: ignore[arg-type]


def test_the_same_simulated_world_twice_is_an_error() -> None:
    twice = _Item(pytest.mark.simulate("fake", 8), pytest.mark.simulate("fake", 8))
    with pytest.raises(MarkerError, match="asked for twice"):
        simulations(twice)  # type: ignore[arg-type]


def test_the_largest_simulated_world_a_fake_group_takes_is_accepted() -> None:
    (world,) = simulations(_Item(pytest.mark.simulate("fake", 2**31 - 1)))  # type: ignore[arg-type]
    assert world.id == f"ws{2**31 - 1}-fake"


def test_simulate_beside_init_process_group_false_names_both_markers() -> None:
    """D13: the fake world's default group met the test's own init_process_group."""
    item = _Item(
        pytest.mark.world_size(2, init_process_group=False), pytest.mark.simulate("fake", 8)
    )
    with pytest.raises(MarkerError) as raised:
        spec_of(item, 2, "gloo")  # type: ignore[arg-type]
    assert str(raised.value).startswith(
        "@pytest.mark.simulate beside @pytest.mark.world_size(2, init_process_group=False): a "
        "simulated world runs on PyTorch's fake process group"
    )


@pytest.mark.parametrize(
    ("item", "named"),
    [
        (
            _Item(pytest.mark.world_size(2), pytest.mark.world_size(4)),
            "@pytest.mark.world_size(2) and @pytest.mark.world_size(4);",
        ),
        (
            _Item(pytest.mark.world_size(2), param_marks=(pytest.mark.world_size(4),)),
            "@pytest.mark.world_size(2) and @pytest.mark.world_size(4) (from its pytest.param);",
        ),
    ],
    ids=["stacked", "param-under-function"],
)
def test_two_world_size_markers_on_one_test_are_an_error(item: _Item, named: str) -> None:
    """D17: pytest's closest-marker rule took one of them without a word."""
    with pytest.raises(MarkerError) as raised:
        spec_of(item, 2, "gloo")  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"2 world_size markers on the test itself: {named} pytest would run it at the size of "
        "one and ignore the rest without a word. Keep one marker (world_size(2, 4) runs the "
        "test at both sizes)."
    )


def test_a_closer_world_size_marker_still_overrides_a_class_or_module_one() -> None:
    item = _Item(pytest.mark.world_size(4))
    item.marks.append(pytest.mark.world_size(2).mark)  # the class's: not one of its own
    item.own_markers = item.marks[:1]
    assert world_size_marker(item) == pytest.mark.world_size(4).mark  # type: ignore[arg-type]


def test_gpu_memory_declarations() -> None:
    assert gpu_memory(_Item(pytest.mark.requires_gpus(1))) == 0  # type: ignore[arg-type]
    declared = _Item(pytest.mark.requires_gpus(1, memory="8GiB"))
    assert gpu_memory(declared) == 8 << 30  # type: ignore[arg-type]
    for bad, message in (("lots", "expected a size such as 512MiB"), ("0", "more than 0")):
        with pytest.raises(MarkerError, match=message):
            gpu_memory(_Item(pytest.mark.requires_gpus(1, memory=bad)))  # type: ignore[arg-type]
