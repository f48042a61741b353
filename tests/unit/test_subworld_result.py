"""Unit tests of what the launched rank 0 makes of another sub-world's result (launch/subrun.py
``_result``), with the fake control channel of test_launch_gather.py: a result that came, one
that is forged or lacks a rank, and a sub-world's rank 0 whose session ended before it sent one.

Each decides whether a test passes, so each is a real case of the hostile pass on issue 42 (its
reproducers I2, S, T ran for real: the test vanished, the run passed); here they take
milliseconds.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from pytest import TestReport

from pytest_distrank.launch import keys, subrun
from pytest_distrank.launch.plan import Step
from pytest_distrank.launch.session import RankSession
from pytest_distrank.launch.subworld import World
from pytest_distrank.outcome.merge import merge_test
from pytest_distrank.settings import Value

from .test_launch_gather import LOCATION, NODEID, FakeChannel, Reports, passed, report

#: The pair on launched ranks 2 and 3 runs test 1 while rank 0's pair runs test 0.
PAIR = World((2, 3), 0, 1, 0)
PIDS = (100, 101, 102, 103)


class Channel(FakeChannel):
    def wait_any(self, wanted: list[str], until: float | None) -> str | None:
        return next((key for key in wanted if key in self.values), None)


def _plugin(channel: Channel, wire: Reports) -> subrun.LaunchPlugin:
    def view(members: tuple[int, ...]) -> RankSession:
        return cast(
            RankSession,
            SimpleNamespace(
                members=members,
                pids=tuple(PIDS[m] for m in members),
                world_size=len(members),
                deserialize=wire.deserialize,
                launched_rank=lambda rank: members[rank],
            ),
        )

    rs = SimpleNamespace(
        channel=channel,
        pids=PIDS,
        logs={2: "node0:/tmp/rank2.log"},
        deserialize=wire.deserialize,
        view=view,
    )
    plugin = SimpleNamespace(
        rs=rs,
        steps=(Step("sub", world=World((0, 1), 0, 0, 0)), Step("sub", world=PAIR)),
        settings=SimpleNamespace(timeout=Value(60.0, "default")),
    )
    return cast(subrun.LaunchPlugin, plugin)


def _item() -> pytest.Item:
    return cast(pytest.Item, SimpleNamespace(nodeid=NODEID, location=LOCATION))


def _shown(per_rank: dict[int, list[TestReport]]) -> list[tuple[str, str]]:
    return [(r.when, r.outcome) for r in merge_test(per_rank, 2)]


def _failure(per_rank: dict[int, list[TestReport]]) -> str:
    """The merged failure's text (the merge leaves the ranks' own reports as they came)."""
    return "".join(str(r.longrepr) for r in merge_test(per_rank, 2) if r.failed)


def _sent(wire: Reports, reports: dict[str, list[TestReport]]) -> dict[str, Any]:
    return {
        "reports": {rank: [wire.serialize(r) for r in got] for rank, got in reports.items()},
        "warnings": {},
        "ended": "",
        "healthy": True,
        "pid": PIDS[2],
        "index": 1,
        "nodeid": NODEID,
    }


def test_a_result_from_the_pairs_rank_0_is_taken() -> None:
    channel, wire = Channel(), Reports()
    channel.put(keys.world(1), _sent(wire, {"0": passed(), "1": passed()}))
    per_rank, _, ended, healthy = subrun._result(_plugin(channel, wire), _item(), 1, 1.0)
    assert _shown(per_rank) == [("setup", "passed"), ("call", "passed"), ("teardown", "passed")]
    assert (ended, healthy) == ("", True)


def test_a_result_that_lacks_a_rank_fails_the_test() -> None:
    """(T's class) a result that cannot be accounted for never passes."""
    channel, wire = Channel(), Reports()
    channel.put(keys.world(1), _sent(wire, {"0": passed()}))
    per_rank, _, _, healthy = subrun._result(_plugin(channel, wire), _item(), 1, 1.0)
    assert _shown(per_rank) == [("setup", "passed"), ("call", "failed")]
    assert "held no report of rank(s) [1] (of 2)" in _failure(per_rank)
    assert not healthy


def test_a_result_that_never_comes_fails_the_test_as_silent() -> None:
    """(S) the pair's rank 0 crashed: the test was left out of the report and of junit."""
    channel, wire = Channel(), Reports()
    per_rank, _, ended, _ = subrun._result(_plugin(channel, wire), _item(), 1, 0.0)
    assert _shown(per_rank) == [("setup", "passed"), ("call", "failed")]
    assert "node0:/tmp/rank2.log" in _failure(per_rank)
    assert ended.endswith("the rank 0 of its sub-world (launched rank 2) sent nothing")


def test_a_pair_rank_0_whose_session_ended_fails_the_test_at_once() -> None:
    """(I2) KeyboardInterrupt on the pair's rank 0: rank 0 waited for the deadline, failure
    grace and 30 s, then dropped the test; now it fails it as soon as the session ended."""
    channel, wire = Channel(), Reports()
    message = f"KeyboardInterrupt was raised in {NODEID}"
    own = [wire.serialize(report("setup"))]
    fatal = dict(message=message, when="call", reports=own, warnings=[], pid=PIDS[2], index=1)
    channel.put(keys.fatal(2), {**fatal, "nodeid": NODEID})
    per_rank, _, ended, healthy = subrun._result(_plugin(channel, wire), _item(), 1, 1e9)
    assert _shown(per_rank) == [("setup", "passed"), ("call", "failed")]
    assert f"stopped serving in call: {message}" in _failure(per_rank)
    assert ended.startswith(f"rank 2 stopped serving: {message}") and not healthy
