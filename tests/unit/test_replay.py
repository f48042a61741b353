"""Unit tests of the replays of order-dependent failures (pool/replay.py, pool/replaysearch.py):
the search on a fake runner (its verdicts and its bound of ``ceil(log2 N) + 5`` runs), the
wording, when a session replays nothing, the histories of pools, and the hand-over from
pytest-xdist's workers. The verdict's and the budget's rules as properties:
tests/unit/test_replay_properties.py. The end-to-end session is tests/e2e/test_replay.py."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pytest import TestReport

from pytest_distrank.pool.onetest.interrupts import signal_interrupt
from pytest_distrank.pool.pools.pool import Pool
from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.pool.replay import TITLE, WORKEROUTPUT_KEY, Replays, refusal
from pytest_distrank.pool.replaysearch import (
    Budget,
    BudgetSpent,
    Suspect,
    Unreachable,
    Verdict,
    max_runs,
    search,
    verdict_lines,
)
from pytest_distrank.settings import Value

KEY = PoolKey(2, "gloo", True)
FILE = "test_m.py"


def ids(*names: str) -> tuple[str, ...]:
    return tuple(f"{FILE}::{name}" for name in names)


def suspect(before: Sequence[str], test: str = "test_d") -> Suspect:
    return Suspect(f"{FILE}::{test}", KEY, ids(*before))


def budget(seconds: float = 300.0, source: str = "default", clock: Any = None) -> Budget:
    return Budget(Value(seconds, source), clock or (lambda: 0.0))


def runner(fails: Callable[[set[str]], bool], log: list[list[str]] | None = None) -> Any:
    """A fake runner: the last test fails when ``fails`` says so of the short names before it."""

    def run(nodeids: Sequence[str]) -> bool:
        if log is not None:
            log.append([n.split("::")[-1] for n in nodeids])
        return fails({n.split("::")[-1] for n in nodeids[:-1]})

    return run


def searched(before: Sequence[str], fails: Callable[[set[str]], bool], **kw: Any) -> Verdict:
    verdict = Verdict(suspect(before))
    search(verdict, runner(fails, kw.pop("log", None)), kw.pop("budget", budget()))
    return verdict


def test_a_failure_alone_after_the_session_is_not_called_the_tests_own() -> None:
    """hostile-4 D13: the replay alone runs after the session's tests, which may have left
    files: it shows the failure is not state in the ranks, never that it is the test's own."""
    verdict = searched(["test_a", "test_b"], lambda before: True)
    assert (verdict.kind, verdict.runs) == ("alone", 1)
    assert verdict_lines(verdict) == [
        f"{FILE}::test_d fails after 2 earlier tests of its pool; fails alone on fresh ranks "
        "after the session too: not state in the ranks; earlier tests may have left files or "
        "other state outside the processes",
        "1 replay, 0.0 s",
    ]


def test_a_failure_that_the_whole_prefix_does_not_bring_back_is_flaky() -> None:
    log: list[list[str]] = []
    verdict = searched(["test_a", "test_b"], lambda before: False, log=log)
    assert log == [["test_d"], ["test_a", "test_b", "test_d"]]
    assert verdict_lines(verdict)[0].endswith(
        "; passes alone on fresh ranks; passes after the 2 earlier tests too: did not "
        "reproduce (flaky?)"
    )
    assert verdict_lines(verdict)[1] == "2 replays, 0.0 s"


def test_bisection_keeps_the_half_that_fails_and_verifies_the_last_candidate() -> None:
    log: list[list[str]] = []
    names = ["test_a", "test_b", "test_c", "test_e"]
    verdict = searched(names, lambda before: "test_e" in before, log=log)
    # [a, b] passes: [c, e] unverified; [c] passes: [e] unverified; [e, d] verified; then the
    # blame's two runs once more: [d] alone, [e, d].
    assert log == [
        ["test_d"],
        [*names, "test_d"],
        ["test_a", "test_b", "test_d"],
        ["test_c", "test_d"],
        ["test_e", "test_d"],
        ["test_d"],
        ["test_e", "test_d"],
    ]
    assert verdict_lines(verdict) == [
        f"{FILE}::test_d fails after 4 earlier tests of its pool; passes alone on fresh ranks; "
        f"polluter: {FILE}::test_e (test_e then test_d fails; test_d alone passes)",
        "7 replays to find a polluter, 0.0 s",
    ]


def test_a_polluter_found_by_a_failing_half_needs_no_verification() -> None:
    log: list[list[str]] = []
    verdict = searched(["test_a", "test_c", "test_b"], lambda b: "test_c" in b, log=log)
    # [c, b], then [c]: found; then alone and [c] once more.
    assert log[2:] == [["test_a", "test_d"], ["test_c", "test_d"], ["test_d"], ["test_c", "test_d"]]
    assert (verdict.kind, verdict.polluter, verdict.runs) == ("polluter", f"{FILE}::test_c", 6)


def test_one_earlier_test_that_brings_the_failure_back_is_its_polluter_in_four_runs() -> None:
    """Alone, after it, and each once more (the blame's evidence must repeat)."""
    verdict = searched(["test_c"], lambda before: "test_c" in before)
    assert (verdict.kind, verdict.runs) == ("polluter", 4)


def test_a_flaky_test_is_not_blamed_on_an_earlier_one() -> None:
    """Its failures come and go: the repeated runs disagree, and no polluter is named."""
    answers = iter([False, True, True, True])  # alone passes, after fails; alone fails again
    verdict = searched(["test_c"], lambda before: next(answers))
    assert verdict.kind == "unstable"
    assert "no polluter is named" in verdict_lines(verdict)[0]
    assert "polluter:" not in verdict_lines(verdict)[0]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 37, 50])
def test_every_polluter_is_found_within_log2_n_plus_5_runs(count: int) -> None:
    names = [f"test_{i}" for i in range(count)]
    for polluter in names:
        verdict = searched(names, {polluter}.issubset)
        assert (verdict.kind, verdict.polluter) == ("polluter", f"{FILE}::{polluter}")
        assert verdict.runs <= max_runs(count) <= math.ceil(math.log2(count)) + 5


def test_a_failure_that_takes_two_earlier_tests_has_no_single_polluter() -> None:
    names = ["test_a", "test_x", "test_b", "test_y"]
    verdict = searched(names, lambda before: {"test_x", "test_y"} <= before)
    assert verdict.kind == "no single polluter"
    assert verdict.runs == max_runs(4) - 2  # no blame: nothing to run once more
    assert verdict_lines(verdict)[0].endswith(
        "; passes alone on fresh ranks; fails after the 4 earlier tests, but the bisection found "
        "no single polluter (test_y then test_d passes: it may take several earlier tests "
        "together)"
    )


def test_a_spent_budget_stops_the_search_and_names_the_option_and_what_is_left() -> None:
    now = [0.0]

    def fails(before: set[str]) -> bool:
        now[0] += 100.0  # every run takes 100 s
        return "test_e" in before

    names = ["test_a", "test_b", "test_c", "test_e"]
    spent = budget(250.0, clock=lambda: now[0])
    verdict = searched(names, fails, budget=spent)
    assert (verdict.kind, verdict.runs) == ("", 3)
    assert verdict_lines(verdict) == [
        f"{FILE}::test_d fails after 4 earlier tests of its pool; passes alone on fresh ranks; "
        "budget of 250 s (--distrank-replay-budget, default) spent after 3 replays; candidates "
        "left: test_c, test_e",
        "3 replays, 300.0 s",
    ]
    given = Budget(Value(5.0, "DISTRANK_REPLAY_BUDGET=5 (environment)"))
    assert given.describe() == "budget of 5 s (DISTRANK_REPLAY_BUDGET=5 (environment))"
    assert not budget(0.0, clock=lambda: 1e9).spent()  # 0: no limit


def test_the_budget_cuts_deadlines_and_a_cut_replay_has_no_outcome() -> None:
    """hostile-4 D16: each deadline of a replay is cut to the budget left (a test's source says
    so); a replay the budget cut short gives no outcome; without a limit nothing is cut."""
    now = [0.0]
    spent = budget(10.0, "--distrank-replay-budget=10 (command line)", lambda: now[0])
    own = Value(300.0, "default")
    assert spent.cut(Value(4.0, "marker")) == (Value(4.0, "marker"), False)
    now[0] = 7.5
    assert spent.cut(own) == (
        Value(2.5, "--distrank-replay-budget: 2.5 s of the budget left"),
        True,
    )
    assert spent.cap(0.0) == (2.5, True)  # no deadline of its own: the budget's
    assert spent.covers(2.5) and not spent.covers(2.6)
    assert budget(0.0, clock=lambda: 1e9).cut(own) == (own, False)

    def run(nodeids: Sequence[str]) -> bool:
        now[0] += 2.5  # the replay's test ran into its cut deadline
        raise BudgetSpent

    verdict = Verdict(suspect(["test_a"]))
    search(verdict, run, spent)
    assert (verdict.runs, verdict.history, verdict.kind) == (1, [], "")
    assert verdict_lines(verdict)[0] == (
        f"{FILE}::test_d fails after 1 earlier test of its pool; budget of 10 s "
        "(--distrank-replay-budget=10 (command line)) spent during replay 1: no outcome"
    )


def test_a_test_whose_session_run_took_more_than_the_budget_left_is_not_replayed() -> None:
    """hostile-4 D16: a test that failed at its deadline (its run in the session took 41.5 s)
    would take as long again alone: with 30 s of budget it is not replayed, and says why."""
    verdict = Verdict(Suspect(f"{FILE}::test_d", KEY, ids("test_a"), 41.5))
    search(verdict, runner(lambda before: True), budget(30.0))
    assert verdict.runs == 0
    assert verdict_lines(verdict) == [
        f"{FILE}::test_d fails after 1 earlier test of its pool; not replayed: its run in the "
        "session took 41.5 s, more than the 30.0 s left of the budget of 30 s "
        "(--distrank-replay-budget, default)",
        "0 replays, 0.0 s",
    ]
    covered = Verdict(Suspect(f"{FILE}::test_d", KEY, ids("test_a"), 29.0))
    search(covered, runner(lambda before: True), budget(30.0))
    assert covered.kind == "alone"


def test_a_replay_that_cannot_run_the_test_ends_the_search_with_why() -> None:
    def run(nodeids: Sequence[str]) -> bool:
        raise Unreachable("fresh ranks did not start: boom")

    verdict = Verdict(suspect(["test_a"]))
    search(verdict, run, budget())
    assert verdict_lines(verdict)[0] == (
        f"{FILE}::test_d fails after 1 earlier test of its pool; replay 1 could not run the "
        "test: fresh ranks did not start: boom"
    )


@pytest.mark.parametrize(
    ("interrupt", "name"),
    [(KeyboardInterrupt(), "SIGINT"), (signal_interrupt(15), "SIGTERM")],
)
def test_a_signal_ends_the_search_at_once_keeps_what_ran_and_blames_no_test(
    interrupt: KeyboardInterrupt, name: str
) -> None:
    """hostile-4 D18: the interrupt travels on (pytest's exit code 2) and the verdict says the
    replays were interrupted, by which signal, never that a test broke its pool."""
    calls: list[int] = []

    def run(nodeids: Sequence[str]) -> bool:
        calls.append(1)
        if len(calls) == 2:
            raise interrupt
        return False

    verdict = Verdict(suspect(["test_a", "test_b"]))
    with pytest.raises(KeyboardInterrupt):
        search(verdict, run, budget())
    assert verdict_lines(verdict)[0] == (
        f"{FILE}::test_d fails after 2 earlier tests of its pool; passes alone on fresh ranks; "
        f"replays interrupted by {name} during replay 2; candidates left: test_a, test_b"
    )


@pytest.mark.parametrize(
    ("replay", "option", "why"),
    [
        (True, {}, None),
        (False, {}, "--distrank-replay is off (--distrank-replay=off (command line))"),
        (True, {"maxfail": 1}, "the session stops at a failure (-x, --exitfirst or --maxfail)"),
        (True, {"maxfail": 3}, "the session stops at a failure (-x, --exitfirst or --maxfail)"),
        (True, {"usepdb": True}, "a debugger is on (--pdb or --trace)"),
        (True, {"trace": True}, "a debugger is on (--pdb or --trace)"),
    ],
)
def test_no_replay_under_x_maxfail_a_debugger_or_the_option_off(
    replay: bool, option: dict[str, Any], why: str | None
) -> None:
    source = "default" if replay else "--distrank-replay=off (command line)"
    values = {"maxfail": 0, "usepdb": False, "trace": False, **option}
    assert refusal(Value(replay, source), SimpleNamespace(**values)) == why


# -- the controller's bookkeeping: histories, suspects, pytest-xdist ------------------------


def replays(**option: Any) -> Replays:
    values = {"maxfail": 0, "usepdb": False, "trace": False, **option}
    config = SimpleNamespace(option=SimpleNamespace(**values))
    return Replays(cast(pytest.Config, config), Value(True, "default"), Value(300.0, "default"))


def item(name: str) -> pytest.Item:
    return cast(pytest.Item, SimpleNamespace(nodeid=f"{FILE}::{name}"))


def pool(pool_id: int) -> Pool:
    return cast(Pool, SimpleNamespace(id=pool_id))


def reports(outcome: str, when: str = "call") -> list[TestReport]:
    return [TestReport(f"{FILE}::t", (FILE, 0, "t"), {}, outcome, None, when)]  # type: ignore[arg-type]


def serve(r: Replays, pool_id: int, name: str, outcome: str, key: PoolKey = KEY) -> None:
    r.served(pool(pool_id), key, item(name))
    r.judge(item(name), reports(outcome), 0.5)


def test_a_failure_after_earlier_tests_of_its_pool_is_a_suspect() -> None:
    r = replays()
    serve(r, 1, "test_first", "failed")  # nothing before it: no suspect
    serve(r, 1, "test_a", "passed")
    serve(r, 1, "test_d", "failed")
    assert r.suspects == [Suspect(f"{FILE}::test_d", KEY, ids("test_first", "test_a"), 0.5)]


def test_a_replaced_pool_starts_a_new_history() -> None:
    r = replays()
    serve(r, 1, "test_a", "passed")
    serve(r, 1, "test_crash", "failed")
    serve(r, 2, "test_b", "passed")  # pool 1 was replaced after the crash
    serve(r, 2, "test_d", "failed")
    assert [s.before for s in r.suspects] == [ids("test_a"), ids("test_b")]


def test_an_error_at_teardown_is_a_failure_too() -> None:
    r = replays()
    serve(r, 1, "test_a", "passed")
    r.served(pool(1), KEY, item("test_d"))
    r.judge(item("test_d"), [*reports("passed"), *reports("failed", "teardown")], 0.5)
    assert [s.nodeid for s in r.suspects] == [f"{FILE}::test_d"]


def test_a_rerun_test_is_judged_by_its_last_attempt_and_is_not_its_own_polluter() -> None:
    r = replays()
    serve(r, 1, "test_a", "passed")
    r.served(pool(1), KEY, item("test_flaky"))  # attempt 1 failed, rerun (rerunfailures)
    serve(r, 1, "test_flaky", "passed")  # attempt 2 passed: flaky, no suspect
    r.served(pool(1), KEY, item("test_d"))
    serve(r, 1, "test_d", "failed")  # attempt 2 failed too
    assert r.suspects == [
        Suspect(f"{FILE}::test_d", KEY, ids("test_a", "test_flaky", "test_flaky"), 0.5)
    ]


@pytest.mark.parametrize("option", [{"maxfail": 1}, {"usepdb": True}])
def test_no_suspect_under_x_or_pdb_nor_in_a_pool_of_its_own(option: dict[str, Any]) -> None:
    r = replays(**option)
    serve(r, 1, "test_a", "passed")
    serve(r, 1, "test_d", "failed")
    assert r.suspects == []
    r = replays()
    isolated = PoolKey(2, "gloo", True, isolated=-3)
    serve(r, 1, "test_a", "passed", isolated)
    serve(r, 1, "test_d", "failed", isolated)
    assert r.suspects == []


def test_a_workers_lines_reach_the_xdist_controller_and_print_once_there() -> None:
    worker = replays()
    worker.lines = ["a fails after 1 earlier test of its pool; ...", "1 replay, 0.1 s"]
    output: dict[str, Any] = {}
    worker.config.workerinput = {}  # type: ignore[attr-defined]
    worker.config.workeroutput = output  # type: ignore[attr-defined]
    worker.pytest_sessionfinish(cast(pytest.Session, None))
    written: list[str] = []
    reporter = SimpleNamespace(
        write_sep=lambda sep, title: written.append(f"{sep} {title}"),
        write_line=written.append,
    )
    worker.pytest_terminal_summary(cast("pytest.TerminalReporter", reporter))
    assert written == []  # a worker prints nothing
    controller = replays()
    controller.pytest_testnodedown(SimpleNamespace(workeroutput=output), None)
    controller.pytest_testnodedown(SimpleNamespace(workeroutput={}), None)  # none there
    controller.pytest_terminal_summary(cast("pytest.TerminalReporter", reporter))
    assert written == [f"= {TITLE}", *worker.lines]
    assert output == {WORKEROUTPUT_KEY: worker.lines}
