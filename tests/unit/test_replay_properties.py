"""Properties of the replays' judgement (pool/replaysearch.py), over generated histories.

Pure: a fake runner answers each replay (arbitrary, even inconsistent, outcomes: a flaky test, a
test that depends on files), a fake clock stands for time. Hundreds of cases in well under a
second. The examples: tests/unit/test_replay.py; the real sessions: tests/e2e/test_replay.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.outcome.endgame import effective_timeout
from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.pool.replaysearch import (
    ALONE,
    Budget,
    BudgetSpent,
    Run,
    Suspect,
    Unreachable,
    Verdict,
    max_runs,
    search,
    verdict_lines,
)
from pytest_distrank.settings import Value

KEY = PoolKey(2, "gloo", True)
TEST = "test_m.py::test_t"

earlier = st.lists(
    st.sampled_from([f"test_m.py::test_{i}" for i in range(40)]),
    min_size=1,
    max_size=12,
    unique=True,
)


def replay(before: Sequence[str], answers: Sequence[bool]) -> tuple[Verdict, list[Run]]:
    """Search with a runner that gives ``answers`` in turn (False once they run out); the runs
    it was asked for and what it answered."""
    asked: list[Run] = []

    def run(nodeids: Sequence[str]) -> bool:
        assert nodeids[-1] == TEST
        failed = answers[len(asked)] if len(asked) < len(answers) else False
        asked.append(Run(tuple(nodeids[:-1]), failed))
        return failed

    verdict = Verdict(Suspect(TEST, KEY, tuple(before)))
    search(verdict, run, Budget(Value(0.0, "default"), lambda: 0.0))
    return verdict, asked


@given(earlier, st.lists(st.booleans(), max_size=12))
def test_a_verdict_says_only_what_its_replays_showed(
    before: list[str], answers: list[bool]
) -> None:
    """The verdict is a function of the replays' outcomes, and claims only what they show:

    - its evidence is exactly the runs made and their outcomes, and the same outcomes give the
      same verdict, word for word;
    - it never says "the test's own": that needs a run alone on fresh ranks before any other
      test of the session (nothing a test left outside the processes, a file, could exist), and
      every replay runs after the session; a failure alone says "not state in the ranks" and
      that earlier tests may have left files;
    - it names a polluter P only when P then the test failed and the test alone passed, each
      twice and never otherwise: taking P away changed the outcome, and did again;
    - "did not reproduce" only when the test passed alone and after all its earlier tests;
    - at most ``ceil(log2 N) + 5`` runs.
    """
    verdict, asked = replay(before, answers)
    assert verdict.history == asked
    assert verdict_lines(replay(before, [r.failed for r in asked])[0]) == verdict_lines(verdict)
    text = verdict_lines(verdict)[0]
    assert "the test's own" not in text
    first_alone_failed = bool(asked) and asked[0] == Run((), True)
    assert (ALONE in text) == first_alone_failed == (verdict.kind == "alone")
    if "polluter:" in text:
        assert verdict.kind == "polluter"
        after = [r.failed for r in asked if r.before == (verdict.polluter,)]
        alone = [r.failed for r in asked if r.before == ()]
        assert len(after) >= 2 and all(after) and len(alone) >= 2 and not any(alone)
    if "did not reproduce" in text:
        assert Run((), False) in asked and Run(tuple(before), False) in asked
    assert verdict.runs == len(asked) <= max_runs(len(before))


@given(earlier, st.data())
def test_a_single_polluter_is_found_wherever_it_ran(before: list[str], data: st.DataObject) -> None:
    """When the test fails exactly when one earlier test P ran before it in its ranks, the
    search names P, whichever of the N earlier tests it is, within ``ceil(log2 N) + 5`` runs."""
    polluter = data.draw(st.sampled_from(before))
    verdict = Verdict(Suspect(TEST, KEY, tuple(before)))
    search(verdict, lambda ids: polluter in ids[:-1], Budget(Value(0.0, "default"), lambda: 0.0))
    assert (verdict.kind, verdict.polluter) == ("polluter", polluter)
    assert verdict.runs <= max_runs(len(before))


seconds = st.floats(0.0, 100.0, allow_nan=False)
deadlines = st.one_of(st.just(0.0), st.floats(0.1, 100.0))  # 0: no deadline


@given(
    suspects=st.lists(st.tuples(earlier, st.floats(0.0, 120.0)), min_size=1, max_size=3),
    budget_seconds=st.floats(0.1, 300.0),
    start_cost=seconds,
    durations=st.dictionaries(
        st.sampled_from([TEST, *[f"test_m.py::test_{i}" for i in range(40)]]), seconds
    ),
    own_deadlines=st.dictionaries(
        st.sampled_from([TEST, *[f"test_m.py::test_{i}" for i in range(40)]]), deadlines
    ),
    answers=st.lists(st.booleans(), max_size=40),
)
def test_the_budget_is_a_bound(
    suspects: list[tuple[list[str], float]],
    budget_seconds: float,
    start_cost: float,
    durations: dict[str, float],
    own_deadlines: dict[str, float],
    answers: list[bool],
) -> None:
    """``--distrank-replay-budget`` bounds the replays of all suspects together: each pool
    start's and each test's deadline is cut to the budget left, so no replay runs past it,
    whatever the tests' durations and deadlines (0: none); a run the budget cut short has no
    outcome (it is not in any history); a suspect whose run in the session took longer than the
    budget left is not replayed at all. (The ranks here stop exactly at a deadline; the real
    ones take a few seconds more to be stopped, which the docs say.)"""
    now = [0.0]
    budget = Budget(
        Value(budget_seconds, "--distrank-replay-budget=x (command line)"), lambda: now[0]
    )
    clean: list[Run] = []

    def run(nodeids: Sequence[str]) -> bool:
        limit, _ = budget.cap(120.0)
        now[0] += min(start_cost, limit)
        if start_cost > limit:
            raise BudgetSpent if budget.spent() else Unreachable("start timed out")
        for nodeid in nodeids:
            deadline, cut = budget.cut(Value(own_deadlines.get(nodeid, 0.0), "marker"))
            wanted = durations.get(nodeid, 1.0)
            given_ = effective_timeout(deadline.value)
            now[0] += wanted if given_ is None else min(wanted, given_)
            if cut and budget.spent():
                raise BudgetSpent
        failed = answers[len(clean) % len(answers)] if answers else True
        clean.append(Run(tuple(nodeids[:-1]), failed))
        return failed

    histories: list[Run] = []
    for before, took in suspects:
        verdict = Verdict(Suspect(TEST, KEY, tuple(before), took))
        covered = budget.covers(took)
        search(verdict, run, budget)
        histories.extend(verdict.history)
        if not covered:
            assert verdict.runs == 0 and verdict.stopped.startswith("not replayed: ")
    assert now[0] <= budget_seconds + 1e-9
    assert histories == clean
