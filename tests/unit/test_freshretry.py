"""Unit: a harness test that failed in a warm pool, again on fresh ranks (pool/freshretry.py).

Properties over generated plans: moving a class to fresh ranks gives each of its remaining tests
a pool of its own and never leaves a warm test waiting for a test that left its pool; and when a
test runs again at all.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.pool.freshretry import FreshRetry
from pytest_distrank.pool.plan import Planned
from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.pool.suites import CASE, Case
from pytest_distrank.settings import Value

CLASSES = [type(f"Test{c}", (), {}) for c in "ABC"]
KEYS = [PoolKey(2, "gloo", False), PoolKey(4, "gloo", False)]


def _plan(layout: list[tuple[int, int]]) -> tuple[list[Any], dict[str, Planned]]:
    """Items (class, key) in order, and the plan's entries chained per key as make_plan does."""
    items: list[Any] = []
    plan: dict[str, Planned] = {}
    last: dict[PoolKey, Planned] = {}
    for n, (cls, key) in enumerate(layout):
        item = types.SimpleNamespace(
            nodeid=f"t.py::{CLASSES[cls].__name__}::test_{n}", cls=CLASSES[cls]
        )
        entry = Planned(spec=None, key=KEYS[key], timeout=Value(300.0, "default"))
        if KEYS[key] in last:
            last[KEYS[key]].next_nodeid = item.nodeid
        last[KEYS[key]] = plan[item.nodeid] = entry
        items.append(item)
    return items, plan


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1, max_size=12),
    st.sets(st.integers(0, 2), max_size=2),
    st.integers(0, 12),
)
def test_moving_classes_isolates_their_remaining_tests_and_mends_the_chains(
    layout: list[tuple[int, int]], moved: set[int], first: int
) -> None:
    """Every test from ``first`` on of a moved class gets a key of its own (no other test has
    it) and no next test; every other entry's next test is the next one of its key's pool that
    did not move, in order; tests before ``first`` keep their keys."""
    items, plan = _plan(layout)
    before = {nodeid: entry.key for nodeid, entry in plan.items()}
    fresh = FreshRetry(Value(300.0, "default"))
    fresh.moved = {CLASSES[c]: "why" for c in moved}
    fresh.move(items, plan, first)
    gone = {i.nodeid for i in items[first:] if i.cls in fresh.moved}
    keys = [plan[i.nodeid].key for i in items]
    for n, item in enumerate(items):
        entry = plan[item.nodeid]
        assert entry.key is not None
        if item.nodeid in gone:
            assert entry.key.isolated and keys.count(entry.key) == 1
            assert entry.next_nodeid is None
            continue
        assert entry.key == before[item.nodeid]
        later = [
            i.nodeid
            for i in items[n + 1 :]
            if before[i.nodeid] == entry.key and i.nodeid not in gone
        ]
        assert entry.next_nodeid == (later[0] if later else None)


def _item(kind: Any) -> Any:
    return types.SimpleNamespace(stash={CASE: Case(kind, 2)}, name="test_x", cls=CLASSES[0])


def _report(outcome: Any) -> pytest.TestReport:
    return pytest.TestReport("t.py::x", ("t.py", 0, "x"), {}, outcome, None, "call")


@given(
    st.sampled_from(["spawn", "continuous"]),
    st.lists(st.sampled_from(["passed", "failed", "skipped"]), min_size=1, max_size=3),
    st.integers(0, 3),
    st.floats(0, 1000),
    st.floats(0, 1000),
)
def test_only_a_fresh_process_harness_test_that_failed_after_others_runs_again(
    kind: str, outcomes: list[str], before: int, seconds: float, budget: float
) -> None:
    """Run again exactly when: a MultiProcessTestCase test (not a continuous one), a failed
    report, at least one earlier test in its pool, and the budget left covers its run; a
    failure it does not cover says so; nothing else is said."""
    fresh = FreshRetry(Value(budget, "--distrank-replay-budget"))
    why = fresh.wanted(_item(kind), [_report(o) for o in outcomes], before, seconds)
    eligible = kind == "spawn" and "failed" in outcomes and before >= 1
    if not eligible:
        assert why is None
    elif budget and seconds > budget:
        assert why is not None and "not run again on fresh ranks" in why
        reports = fresh.refused([_report(o) for o in outcomes], why)  # said on failed reports
        assert [bool(r.sections) for r in reports] == [o == "failed" for o in outcomes]
    else:
        assert why == ""


def _failed(when: Any = "call") -> pytest.TestReport:
    return pytest.TestReport("t.py::x", ("t.py", 0, "x"), {}, "failed", "boom", when)


@pytest.mark.parametrize("fresh_outcome", ["passed", "failed"])
def test_a_fresh_run_cut_by_a_signal_concludes_nothing(fresh_outcome: str) -> None:
    """SIGTERM during the fresh run: the section says so; no 'test's own', no class moved."""
    retry = FreshRetry(Value(300.0, "default"))
    fresh = [_report(fresh_outcome)]
    interrupt = KeyboardInterrupt("pytest-distrank: got SIGTERM")
    out, moved = retry.settle(_item("spawn"), [_failed()], fresh, "1 earlier test", 1.0, interrupt)
    text = "\n".join(content for _, content in out[0].sections)
    assert "interrupted by SIGTERM: no verdict" in text
    assert "the test's own" not in text and "passed on fresh ranks" not in text
    assert moved == "" and not retry.moved
