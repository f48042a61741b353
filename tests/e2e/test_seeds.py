"""End-to-end: every rank draws its own random numbers, repeatably, whatever ran before
(``--distrank-seed``), and ``--distrank-order`` reorders tests without starting more pools.

Two inner sessions over one file. ``SEEDS`` runs every test with ``--distrank-seed=76
--distrank-order=random``: ``test_draw`` runs after ``test_consume`` took draws in the same pool,
``test_draw_weights`` after ``test_sets_up`` set up the module's ``weights`` fixture (which
draws), world sizes 2 and 3 interleave. ``ALONE`` (tiny: two distributed tests and two ordinary
ones, ``--distrank-order=reverse``) runs ``test_draw`` and ``test_draw_weights`` without the
others, with the same seed: they must draw what they drew in ``SEEDS``. The order itself and the
seeds' rules are checked by tests/unit/test_seeds.py and test_seeds_properties.py.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from pytest_distrank.planning.order import reorder

from ..helpers import SharedSession
from .test_faults import Session, Shared

DRAWS = """
import json, os, pathlib, random
import numpy as np
import pytest, torch


def draw(name, rank, *more):
    out = pathlib.Path(os.environ["SEEDS_OUT"])
    out.mkdir(exist_ok=True)
    drawn = [torch.rand(1).item(), random.random(), float(np.random.rand()), *more]
    (out / f"{name}-{rank}.json").write_text(json.dumps(drawn))


@pytest.mark.world_size(2)
def test_consume(rank):
    torch.rand(100), random.random(), np.random.rand(100)


@pytest.mark.world_size(3)
def test_three_a(rank):
    pass


@pytest.mark.world_size(2)
def test_draw(rank):
    draw("draw", rank)


@pytest.mark.world_size(3)
def test_three_b(rank):
    pass


@pytest.mark.world_size(2)
def test_fails(rank):
    assert rank < 0


@pytest.fixture(scope="module")
def weights(rank):
    return torch.rand(4)  # set up by the first test of the module that needs it


@pytest.mark.world_size(2)
def test_sets_up(rank, weights):
    pass


@pytest.mark.world_size(2)
def test_draw_weights(rank, weights):
    draw("wide", rank, weights.sum().item())


def test_plain_1():
    pass


def test_plain_2():
    pass
"""

COLLECTED = [
    "test_consume",
    "test_three_a",
    "test_draw",
    "test_three_b",
    "test_fails",
    "test_sets_up",
    "test_draw_weights",
    "test_plain_1",
    "test_plain_2",
]

SEEDS = Session(
    "seeds",
    {"test_rng.py": DRAWS},
    ("-v", "--distrank-seed=76", "--distrank-order=random"),
    env={"SEEDS_OUT": "{folder}/draws-seeds"},
)
ALONE = Session(
    "seeds-alone",
    {"test_rng.py": DRAWS},
    ("-v", "--distrank-seed=76", "--distrank-order=reverse", "-k", "draw or plain"),
    env={"SEEDS_OUT": "{folder}/draws-alone"},
)


@pytest.fixture
def seeds(shared_session: SharedSession) -> Shared:
    return SEEDS.run(shared_session)


@pytest.fixture
def alone(shared_session: SharedSession) -> Shared:
    return ALONE.run(shared_session)


def draws(session: Shared, rank: int, name: str = "draw") -> list[float]:
    out = session.folder / f"draws-{session.name.removeprefix('seeds-') or 'seeds'}"
    values: list[float] = json.loads((out / f"{name}-{rank}.json").read_text())
    return values


def ran(session: Shared) -> list[str]:
    """The tests in the order ``-v`` reported them."""
    found = (
        re.match(r"test_rng\.py::(\w+) (PASSED|FAILED)", line) for line in session.result.outlines
    )
    return [m.group(1) for m in found if m]


def test_ranks_draw_different_numbers_from_torch_random_and_numpy(seeds: Shared) -> None:
    assert seeds.outcome("test_draw") == "passed"
    rank0, rank1 = draws(seeds, 0), draws(seeds, 1)
    assert len(rank0) == 3
    assert all(a != b for a, b in zip(rank0, rank1, strict=True)), (rank0, rank1)


def test_the_header_says_the_seed_and_order(seeds: Shared) -> None:
    seeds.result.stdout.fnmatch_lines(
        ["distrank: *, seed 76 (--distrank-seed to repeat), order random:76, timeout *"]
    )


def test_a_failures_rerun_line_carries_the_seed(seeds: Shared) -> None:
    assert seeds.outcome("test_fails") == "failed"
    seeds.section("test_fails").fnmatch_lines(
        # and the variable the file reads (pool/repro.py), so that it runs as shown
        [
            "cd * && SEEDS_OUT=*/draws-seeds pytest -p distrank --distrank-seed=76 "
            "test_rng.py::test_fails"
        ]
    )


def test_random_order_repeats_from_the_seed_and_keeps_one_pool_per_world_size(
    seeds: Shared,
) -> None:
    expected = reorder(COLLECTED, lambda name: f"test_rng.py::{name}", "random", 76)
    assert ran(seeds) == expected != COLLECTED
    sizes = [3 if "three" in name else 2 for name in expected if "plain" not in name]
    assert sum(a != b for a, b in itertools.pairwise(sizes)) >= 2  # world sizes interleave
    seeds.result.stdout.fnmatch_lines(
        ["7 distributed tests; pools started: 1 at world size 2, 1 at world size 3"]
    )


def test_a_test_draws_the_same_alone_as_after_other_tests(seeds: Shared, alone: Shared) -> None:
    after = draws(seeds, 0), draws(seeds, 1)
    assert ran(seeds).index("test_consume") < ran(seeds).index("test_draw")
    assert alone.outcome("test_draw") == "passed"
    assert (draws(alone, 0), draws(alone, 1)) == after


def test_a_wider_fixture_draws_the_same_whichever_test_sets_it_up(
    seeds: Shared, alone: Shared
) -> None:
    """``weights`` (module scope) is set up by ``test_sets_up`` in ``SEEDS`` and by
    ``test_draw_weights`` itself in ``ALONE`` (the "rerun just this test" case): its values and
    the test's own draws are the same in both (hostile-4 D12)."""
    assert ran(seeds).index("test_sets_up") < ran(seeds).index("test_draw_weights")
    assert "test_sets_up" not in ran(alone)
    assert seeds.outcome("test_draw_weights") == alone.outcome("test_draw_weights") == "passed"
    for rank in (0, 1):
        assert draws(alone, rank, "wide") == draws(seeds, rank, "wide")
    assert draws(seeds, 0, "wide")[3] != draws(seeds, 1, "wide")[3]  # each rank its own


def test_reverse_order(alone: Shared) -> None:
    assert ran(alone) == ["test_plain_2", "test_plain_1", "test_draw_weights", "test_draw"]
    alone.result.stdout.fnmatch_lines(["distrank: *, seed 76 (*), order reverse, timeout *"])
