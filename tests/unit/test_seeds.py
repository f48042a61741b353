"""Unit tests of the session seed and the test order (planning/order.py) and of each test's seed
on each rank (rank/seeding.py); tests/e2e/test_seeds.py checks them in a real session."""

from __future__ import annotations

import random

import pytest

from pytest_distrank.parsing import MAX_SEED, parse_order, parse_seed, pick_seed
from pytest_distrank.planning.order import (
    describe_order,
    describe_seed,
    order_seed,
    reorder,
    session_seed,
)
from pytest_distrank.rank.seeding import seed_of, seed_random_state
from pytest_distrank.settings import Value


def test_a_tests_seed_differs_per_rank_and_test_and_repeats_with_the_session_seed() -> None:
    seeds = {seed_of(7, nodeid, rank) for nodeid in ("t.py::a", "t.py::b") for rank in range(4)}
    assert len(seeds) == 8
    assert all(0 <= s < 2**64 for s in seeds)
    assert seed_of(7, "t.py::a", 1) == seed_of(7, "t.py::a", 1)
    assert seed_of(7, "t.py::a", 1) != seed_of(8, "t.py::a", 1)
    # No field runs into the next: "1" + "23" is not "12" + "3".
    assert seed_of(1, "23", 0) != seed_of(12, "3", 0)


def test_seeding_sets_torch_random_and_numpy_and_randomly_keeps_random_and_numpy() -> None:
    import numpy as np
    import torch

    seed_random_state(seed_of(1, "t.py::a", 0), torch_only=False)
    first = (torch.rand(1).item(), random.random(), np.random.rand())
    seed_random_state(seed_of(1, "t.py::a", 0), torch_only=False)
    assert (torch.rand(1).item(), random.random(), np.random.rand()) == first
    random.seed(5)
    np.random.seed(5)
    drawn = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    seed_random_state(seed_of(1, "t.py::a", 0), torch_only=True)
    assert torch.rand(1).item() == first[0]
    assert (random.random(), np.random.rand()) == drawn  # pytest-randomly's, left alone


def test_the_session_seed_is_picked_given_sent_or_off() -> None:
    picked = session_seed(Value(parse_seed("random"), "default"), pick=lambda: 42)
    assert picked == Value(42, "picked at random")
    flag = Value(parse_seed("random"), "--distrank-seed=random (command line)")
    assert session_seed(flag, pick=lambda: 3).source == (
        "picked at random, --distrank-seed=random (command line)"
    )
    given = Value(parse_seed("1234"), "--distrank-seed=1234 (command line)")
    assert session_seed(given) == given
    assert session_seed(Value(parse_seed("off"), "DISTRANK_SEED=off (environment)")).value is None
    # An xdist worker takes its controller's, whatever its own option says.
    sent = session_seed(Value("random", "default"), {"distrank_seed": 99}, pick=lambda: 1)
    assert sent == Value(99, "default, from xdist's controller")
    assert session_seed(Value("random", "default"), {"distrank_seed": None}).value is None
    picks = {pick_seed() for _ in range(20)}
    assert len(picks) > 1 and all(0 <= s <= MAX_SEED for s in picks)


def test_a_random_order_takes_its_own_seed_or_the_sessions() -> None:
    seed: Value[int | None] = Value(5, "picked at random")
    assert order_seed(Value(parse_order("reverse"), "default"), seed) is None
    assert order_seed(Value(parse_order("random"), "default"), seed) == 5
    assert order_seed(Value(parse_order("random:8"), "default"), seed) == 8
    with pytest.raises(ValueError, match="--distrank-seed=off, from DISTRANK_SEED=off"):
        order_seed(Value(parse_order("random"), "x"), Value(None, "DISTRANK_SEED=off"))
    assert order_seed(Value(parse_order("random:8"), "x"), Value(None, "off")) == 8


def test_header_words() -> None:
    assert describe_seed(1234) == "seed 1234 (--distrank-seed to repeat)"
    assert describe_seed(None) == "seed off"
    assert describe_order(Value(("collected", None), "default"), None) == ""
    assert describe_order(Value(("reverse", None), "default"), None) == "order reverse"
    assert describe_order(Value(("random", None), "default"), 7) == "order random:7"


IDS = [
    "a.py::t1",
    "a.py::C::x",
    "a.py::C::y[p::q]",
    "a.py::C::y[r]",
    "a.py::t2",
    "a.py::D::E::z",
    "a.py::D::w",
    "b.py::u1",
    "b.py::u2",
]


def reordered(order: str, seed: int | None = None, ids: list[str] = IDS) -> list[str]:
    return reorder(ids, lambda nodeid: nodeid, order, seed)


def test_collected_order_is_kept() -> None:
    assert reordered("collected") == IDS


def test_reverse_reverses_within_modules_and_classes_keeping_classes_together() -> None:
    assert reordered("reverse") == [
        "a.py::D::w",
        "a.py::D::E::z",
        "a.py::t2",
        "a.py::C::y[r]",
        "a.py::C::y[p::q]",
        "a.py::C::x",
        "a.py::t1",
        "b.py::u2",
        "b.py::u1",
    ]


def together(order: list[str], prefix: str) -> bool:
    places = [i for i, nodeid in enumerate(order) if nodeid.startswith(prefix)]
    return places == list(range(places[0], places[-1] + 1))


def test_random_shuffles_within_modules_repeatably_keeping_classes_together() -> None:
    many = [f"a.py::t{i}" for i in range(20)] + ["a.py::C::x", "a.py::C::y", "b.py::u"]
    first = reordered("random", 1, many)
    assert first == reordered("random", 1, many)
    assert first != reordered("random", 2, many) and first != many
    assert sorted(first) == sorted(many)
    assert first[-1] == "b.py::u"  # modules keep their order
    assert together(first, "a.py::C::")
    for seed in range(30):
        order = reordered("random", seed)
        assert together(order, "a.py::C::") and together(order, "a.py::D::")
        assert order[-2:] in (["b.py::u1", "b.py::u2"], ["b.py::u2", "b.py::u1"])
    # One more test does not reshuffle the others.
    grown = reordered("random", 1, [*many[:5], "a.py::new", *many[5:]])
    assert [n for n in grown if n != "a.py::new"] == first


def test_a_module_seen_twice_keeps_both_places() -> None:
    ids = ["a.py::x", "a.py::y", "b.py::z", "a.py::w"]
    assert reordered("reverse", ids=ids) == ["a.py::y", "a.py::x", "b.py::z", "a.py::w"]
