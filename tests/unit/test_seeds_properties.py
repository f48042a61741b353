"""Properties of each rank's seeds (rank/seeding.py), over generated sessions: modules, classes,
tests, fixtures of every scope that draw from torch's generator, and a selection of the tests
(the "rerun just this test" command, ``-k``, a failed-first rerun). The plugin's hooks are driven
as pytest drives them (setup, each fixture's setup through ``pytest_fixture_setup``, a wider
fixture set up once and cached for its scope, call), in this process: no ranks.

The rules:

- **A seed is a function of its inputs only**: ``seed_of(session seed, node id, rank, phase)``
  gives the same 64-bit number every time, and distinct numbers for distinct inputs (node ids
  hold no NUL: pytest's never do).
- **A test draws the same whichever tests run with it**: its wider fixtures' values, its own
  fixtures' and its call's draws are the same in the whole session as in any selection that
  holds it (hostile-4 D12: a module fixture was seeded by the first test that needed it).
- **A wider fixture's seed depends on its scope only**: its value is what a generator seeded
  with ``seed_of(session seed, scope node id, rank, fixture_phase(name))`` draws, whichever
  test set it up.
- **The call starts from its own seed**: the call's draws are those of ``seed_of(..., "call")``,
  however much the setup drew.
- **Distinct ranks draw differently**.

Some generated tests are not distributed (launcher mode runs them on rank 0 alone, unseeded):
the rules hold for the distributed ones, whichever test set up a wider fixture they share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_distrank.rank.seeding import SeedPlugin, fixture_phase, seed_of

SCOPES = ("function", "class", "module", "session")


@dataclasses.dataclass(frozen=True)
class Node:
    nodeid: str


@dataclasses.dataclass(frozen=True)
class Fixture:
    argname: str
    scope: str
    draws: int


@dataclasses.dataclass(frozen=True)
class Request:
    node: Node
    param_index: int = 0


@dataclasses.dataclass(frozen=True)
class Case:
    nodeid: str
    module: str
    cls: str | None
    fixtures: tuple[Fixture, ...]
    draws: int
    #: False: a test launcher mode runs on rank 0 alone, not seeded.
    distributed: bool = True

    def scope_node(self, scope: str) -> str:
        """The node id pytest's SubRequest.node has for ``scope``."""
        if scope == "session":
            return ""
        if scope == "module":
            return self.module
        if scope == "class" and self.cls is not None:
            return self.cls
        return self.nodeid  # function scope; class scope outside a class: the test itself


def draw(n: int) -> list[float]:
    return [float(x) for x in torch.rand(n)] if n else []


def run(tests: list[Case], session_seed: int, rank: int) -> dict[str, list[float]]:
    """Each test's draws: its fixtures' values, in order, then its call's."""
    plugin = SeedPlugin(session_seed, rank, lambda item: item.nodeid in distributed)
    distributed = {t.nodeid for t in tests if t.distributed}
    cache: dict[tuple[str, str], list[float]] = {}
    out: dict[str, list[float]] = {}
    for test in tests:
        item: Any = Node(test.nodeid)
        plugin.pytest_runtest_setup(item)
        values: list[float] = []
        for fixture in test.fixtures:
            key = (test.scope_node(fixture.scope), fixture.argname)
            if key in cache:
                values += cache[key]
                continue
            request: Any = Request(Node(key[0]))
            hook: Generator[None, object, object] = plugin.pytest_fixture_setup(
                fixture,  # type: ignore[arg-type]
                request,
            )
            next(hook)
            value = draw(fixture.draws)
            with pytest.raises(StopIteration):
                hook.send(value)
            if fixture.scope != "function":
                cache[key] = value
            values += value
        plugin.pytest_runtest_call(item)
        out[test.nodeid] = values + draw(test.draws)
        plugin.pytest_runtest_teardown(item)
    return out


fixtures = st.lists(
    st.builds(
        Fixture,
        st.sampled_from(["model", "data", "weights", "table"]),
        st.sampled_from(SCOPES),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda f: f.argname,
)


@st.composite
def sessions(draw_: st.DrawFn) -> list[Case]:
    """Tests in modules and classes, each using some of the session's fixtures."""
    available = draw_(fixtures)
    tests: list[Case] = []
    for m in range(draw_(st.integers(1, 2))):
        module = f"m{m}.py"
        for t in range(draw_(st.integers(1, 5))):
            cls = f"{module}::C" if draw_(st.booleans()) else None
            nodeid = f"{cls or module}::t{t}"
            used = tuple(f for f in available if draw_(st.booleans()))
            drawn, distributed = draw_(st.integers(0, 2)), draw_(st.booleans())
            tests.append(Case(nodeid, module, cls, used, drawn, distributed))
    # one class's tests stay together, as pytest collects them
    return sorted(tests, key=lambda t: (t.module, t.cls is None, t.cls or ""))


seeds = st.integers(0, 2**32 - 1)


@given(
    st.tuples(seeds, st.text().filter(lambda s: "\0" not in s), st.integers(0, 64)),
    st.tuples(seeds, st.text().filter(lambda s: "\0" not in s), st.integers(0, 64)),
    st.sampled_from(["setup", "call", "teardown", fixture_phase("model"), fixture_phase("x", 1)]),
    st.sampled_from(["setup", "call", "teardown", fixture_phase("model"), fixture_phase("x", 1)]),
)
def test_a_seed_is_a_function_of_its_inputs_and_distinct_inputs_differ(
    a: tuple[int, str, int], b: tuple[int, str, int], phase_a: str, phase_b: str
) -> None:
    assert seed_of(*a, phase_a) == seed_of(*a, phase_a)
    assert 0 <= seed_of(*a, phase_a) < 2**64
    assume((*a, phase_a) != (*b, phase_b))
    assert seed_of(*a, phase_a) != seed_of(*b, phase_b)


@given(sessions(), st.data(), seeds, st.integers(0, 3))
def test_a_test_draws_the_same_whichever_tests_run_with_it(
    tests: list[Case], data: st.DataObject, session_seed: int, rank: int
) -> None:
    whole = run(tests, session_seed, rank)
    seeded = [t for t in tests if t.distributed]
    for test in seeded:  # each alone: the "rerun just this test" command
        assert run([test], session_seed, rank)[test.nodeid] == whole[test.nodeid], test.nodeid
    chosen = data.draw(st.lists(st.sampled_from(tests), min_size=1, unique=True))
    selection = [t for t in tests if t in chosen]  # in the session's order
    some = run(selection, session_seed, rank)
    for test in selection:
        if test.distributed:
            assert some[test.nodeid] == whole[test.nodeid], test.nodeid


@given(sessions(), seeds, st.integers(0, 3))
def test_a_wider_fixtures_value_and_the_calls_draws_come_from_their_own_seeds(
    tests: list[Case], session_seed: int, rank: int
) -> None:
    drawn = run(tests, session_seed, rank)
    for test in tests:
        if not test.distributed:
            continue
        values, start = drawn[test.nodeid], 0
        for fixture in test.fixtures:
            if fixture.scope != "function":
                node = test.scope_node(fixture.scope)
                phase = fixture_phase(fixture.argname)
                torch.default_generator.manual_seed(seed_of(session_seed, node, rank, phase))
                assert values[start : start + fixture.draws] == draw(fixture.draws), fixture
            start += fixture.draws
        torch.default_generator.manual_seed(seed_of(session_seed, test.nodeid, rank, "call"))
        assert values[start:] == draw(test.draws), test.nodeid


@given(sessions(), seeds)
def test_distinct_ranks_draw_differently(tests: list[Case], session_seed: int) -> None:
    assume(any(t.draws for t in tests if t.distributed))
    assert run(tests, session_seed, 0) != run(tests, session_seed, 1)
