"""Unit tests of pytest-rerunfailures' rule as the controller applies it (pool/reruns.py).

The end-to-end runs, with the verdicts made in the ranks, are in ``tests/e2e/test_ecosystem.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest import TestReport

from pytest_distrank.outcome.merge import COLLATERAL_ATTR
from pytest_distrank.pool.pools.cmdline import rank_command_line
from pytest_distrank.pool.reruns import (
    ROOT_CAUSES,
    Judged,
    backoff_delay,
    decide,
    keep_root_causes,
)

PASSED = Judged("setup", failed=False), Judged("teardown", failed=False)


def _attempt(call: Judged, execution_count: int = 1, reruns: int = 2, slots: int = 9) -> list[str]:
    left = [slots]

    def take() -> bool:
        left[0] -= 1
        return left[0] >= 0

    return list(decide([PASSED[0], call, PASSED[1]], execution_count, reruns, take))


def test_a_failure_is_rerun_until_the_attempts_are_used_up() -> None:
    failed = Judged("call", failed=True)
    assert _attempt(failed, execution_count=2) == ["log", "rerun", "log"]
    assert _attempt(failed, execution_count=3) == ["log", "log", "log"]
    assert _attempt(Judged("call", failed=False)) == ["log", "log", "log"]


def test_filters_condition_and_xfail_rule_a_rerun_out() -> None:
    assert _attempt(Judged("call", failed=True, hard_fail=True)) == ["log"] * 3
    assert _attempt(Judged("call", failed=True, condition=False)) == ["log"] * 3
    assert _attempt(Judged("call", failed=True, condition=True))[1] == "rerun"
    assert _attempt(Judged("call", failed=True, xfail=True)) == ["log"] * 3


def test_the_suite_cap_is_asked_only_for_a_rerun_and_may_refuse() -> None:
    assert _attempt(Judged("call", failed=True), slots=0) == ["log"] * 3
    asked: list[int] = []

    def take() -> bool:
        asked.append(1)
        return True

    decide([Judged("call", failed=True, hard_fail=True)], 1, 2, take)
    assert asked == []


def test_a_failure_after_the_rerun_is_a_rerun_and_any_hard_failure_rules_out() -> None:
    call, teardown = Judged("call", failed=True), Judged("teardown", failed=True)
    assert decide([call, teardown], 1, 2, lambda: True) == ["rerun", "rerun"]
    hard_teardown = Judged("teardown", failed=True, hard_fail=True)
    assert decide([call, hard_teardown], 1, 2, lambda: True) == ["log", "log"]


def test_a_failure_the_condition_did_not_match_is_not_shown_beside_one_it_did() -> None:
    call = Judged("call", failed=True, condition=False)
    teardown = Judged("teardown", failed=True, condition=True)
    assert decide([call, teardown], 1, 2, lambda: True) == ["drop", "rerun"]
    assert decide([call, teardown], 3, 2, lambda: True) == ["drop", "log"]


def test_the_delay_grows_by_the_backoff_factor() -> None:
    assert [backoff_delay(0.5, 2.0, n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff_delay(0.5, 1.0, 3) == 0.5


def _report(when: str, outcome: str, stop: float, **extra: object) -> TestReport:
    report = TestReport("t.py::t", ("t.py", 0, "t"), {}, outcome, None, when, stop=stop)  # type: ignore[arg-type]
    report.__dict__.update(extra)
    return report


def test_the_root_cause_rank_of_each_failed_phase_is_kept(pytester: pytest.Pytester) -> None:
    item = pytester.getitem("def test_func(): pass")
    first = _report("call", "failed", stop=1.0)
    keep_root_causes(
        item,
        {
            0: [_report("setup", "passed", 0.1), _report("call", "failed", 2.0)],
            1: [_report("setup", "passed", 0.1), first],
            2: [_report("call", "failed", 0.5, **{COLLATERAL_ATTR: True})],
        },
    )
    assert item.stash[ROOT_CAUSES] == {"call": first}


def test_the_filters_reach_the_ranks_among_the_options_they_own(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    config = pytester.parseconfig("-p", "rerunfailures", "--only-rerun=Boom")
    options = rank_command_line(config, tmp_path).options
    assert options["only_rerun"] == ["Boom"] and "rerun_except" not in options
    assert "only_rerun" not in rank_command_line(pytester.parseconfig(), tmp_path).options
