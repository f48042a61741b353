"""Unit: the deadlock proof on hostile review 4's cases (D6, D7, D15, D19), as flight records.

Each case is the records the ranks of the review's reproducer hold when the watch looks; the
rules behind them are the properties of ``test_deadlock_properties.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_distrank.outcome.collectives import explain

START = 1_000
SECOND = 1_000_000_000
WORLD3 = {"0": {"ranks": "[0, 1, 2]"}}


def call(
    op: str,
    done: bool,
    group: str = "0",
    at: int = START + 1,
    timeout_ms: int = 1_800_000,
) -> dict[str, Any]:
    return {
        "profiling_name": f"gloo:{op}",
        "retired": done,
        "time_created_ns": at,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "process_group": [group, "default_pg" if group == "0" else "undefined"],
        "timeout_ms": timeout_ms,
    }


def records(*entries: dict[str, Any], groups: dict[str, Any], now: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": list(entries), "pg_config": groups}
    if now:
        out["dumped_ns"] = now
    return out


def test_two_groups_with_the_same_members_are_numbered_apart() -> None:
    """D6: ``grads`` and ``ckpt`` both hold ranks 0, 1; rank 0 is in grads' all_reduce, rank 1
    in the world's all_reduce with ckpt's broadcast pending, rank 2 sleeps. Numbered by members,
    grads' #1 and ckpt's #1 were one slot: "a mismatch", the test ended early."""
    groups = {**WORLD3, "1": {"ranks": "[0, 1]"}, "2": {"ranks": "[0, 1]"}}
    rank0 = records(call("all_reduce", False), call("all_reduce", False, "1"), groups=groups)
    rank1 = records(call("broadcast", False, "2"), call("all_reduce", False), groups=groups)
    story = explain({0: rank0, 1: rank1, 2: records(groups=groups)}, START, world_size=3)
    assert story is not None
    assert not story.verdict.proven
    assert "broadcast #1" not in story.verdict.text  # no slot of grads holds ckpt's broadcast
    assert story.lines[0] == "in all_reduce #1 on the group of ranks 0, 1 (float32[4])"


def test_a_member_that_finished_proves_the_hang_whatever_the_others_did() -> None:
    """D15: gloo's broadcast lets ranks 0 and 2 complete their part and finish; rank 1 waits;
    rank 3 left before the broadcast. Rank 3's absence alone proves it."""
    world = {"0": {"ranks": "[0, 1, 2, 3]"}}
    finished = records(call("all_reduce", True), call("broadcast", True), groups=world)
    waiting = records(call("all_reduce", True), call("broadcast", False), groups=world)
    left = records(call("all_reduce", True), groups=world)
    dumps = {0: finished, 1: waiting, 2: finished, 3: left}
    story = explain(dumps, START, finished={0, 2, 3}, world_size=4, timeout_s=60.0)
    assert story is not None and story.verdict.proven
    assert story.verdict.root == (3,)
    assert story.verdict.blocked == (1,)
    assert story.verdict.cause == (
        "rank 3/4 never entered broadcast #2 on the default group (rank 1 waits in it)"
    )


def test_a_collective_whose_timeout_comes_first_is_not_proven_before_it() -> None:
    """D7: rank 0's barrier on a group with a 6 s timeout, ranks 1, 2 finished without it (the
    test expects the timeout). Before 6 s and a margin it is no proof; long after, it is; with
    a timeout after the test's deadline (30 min against 60 s), it is at once."""
    groups = {**WORLD3, "1": {"ranks": "[0, 1, 2]"}}
    barrier = call("barrier", False, "1", timeout_ms=6_000)
    done = records(groups=groups)

    def judged(now: int, entry: dict[str, Any] = barrier) -> bool:
        dumps = {0: records(entry, groups=groups, now=now), 1: done, 2: done}
        story = explain(dumps, START, finished={1, 2}, world_size=3, timeout_s=60.0)
        assert story is not None and story.verdict.root == (1, 2)
        return story.verdict.proven

    assert not judged(START + 2 * SECOND)
    assert not judged(START + 6 * SECOND)
    assert judged(START + 12 * SECOND)  # still inside long after it should have raised
    assert judged(START + 2 * SECOND, {**barrier, "timeout_ms": 1_800_000})
    # Without a deadline (``--timeout 0``) a timeout always comes first.
    dumps = {0: records(barrier, groups=groups, now=START + 2 * SECOND), 1: done, 2: done}
    story = explain(dumps, START, finished={1, 2}, world_size=3)
    assert story is not None and not story.verdict.proven


def test_a_skipped_check_across_ranks_is_named_as_the_check() -> None:
    """D19: rank 2 skips ``assert_equal_across_ranks``; ranks 0, 1 wait in its all_gather on
    the plugin's twin group, which is not a collective of the test's."""
    groups = {**WORLD3, "9f2c": {"ranks": "[0, 1, 2]", "owner": "check"}}
    waiting = records(call("all_gather", False, "9f2c"), groups=groups)
    story = explain(
        {0: waiting, 1: waiting, 2: records(groups=groups)},
        START,
        finished={2},
        world_size=3,
        timeout_s=60.0,
    )
    assert story is not None and story.verdict.proven
    assert "never entered all_gather" not in story.verdict.cause
    assert story.verdict.cause == (
        "rank 2/3 never entered a check across ranks (assert_*_across_ranks; its all_gather #1 "
        "on the group of ranks 0, 1, 2) (ranks 0, 1 wait in it)"
    )


def test_an_unmatched_collective_over_on_its_rank_says_what_ended_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D7: rank 0's barrier on a group with a short timeout, which the test caught, is one
    collective ahead of its peers after the test: the count says it ended on this rank without
    a peer (a timeout the test caught?) and where to read how to write such a test; a pending
    one is named as before."""
    from pytest_distrank.rank import groupstate

    group = SimpleNamespace(group_name="1")
    monkeypatch.setattr(groupstate, "live_groups", lambda: [group])
    monkeypatch.setattr(groupstate, "group_words", lambda pg: "group '1' (ranks 0, 1, 2)")
    over = {**call("barrier", True, "1"), "collective_seq_id": 1}
    monkeypatch.setattr(groupstate, "flight_entries", lambda: [over])
    counts = groupstate.collective_counts()
    assert counts is not None
    ((count, op),) = counts.values()
    assert count == 1
    assert op == f"gloo:barrier, over on this rank ({groupstate.OVER_ALONE})"
    assert "docs/failure-reports.md" in op
    monkeypatch.setattr(groupstate, "flight_entries", lambda: [{**over, "retired": False}])
    assert groupstate.collective_counts() == {"group '1' (ranks 0, 1, 2)": (1, "gloo:barrier")}


def numbered(entry: dict[str, Any], record_id: int, seq: int) -> dict[str, Any]:
    return {**entry, "record_id": record_id, "collective_seq_id": seq}


def test_overwritten_records_are_matched_by_sequence_id() -> None:
    """Attack n2: ranks 0, 2 issued 250 all_reduces on their group with a 200-record ring;
    their world broadcast #1 was overwritten, so counting made their all_reduce #2 a "#1" facing
    rank 1's broadcast #1: a mismatch, a correct test ended. By sequence id it is #2, which rank
    1 (sleeping) has not entered yet: nothing proven."""
    groups = {**WORLD3, "1": {"ranks": "[0, 2]"}}
    busy = [numbered(call("all_reduce", True, "1"), 51 + n, 51 + n) for n in range(199)]
    ahead = numbered(call("all_reduce", False), 250, 8)
    rank1 = records(numbered(call("broadcast", True), 0, 7), groups=groups)
    dumps = {
        0: records(*busy, ahead, groups=groups),
        1: rank1,
        2: records(*busy, ahead, groups=groups),
    }
    story = explain(dumps, START, world_size=3)
    assert story is not None and not story.verdict.proven
    assert story.lines[0] == "in all_reduce #2 on the default group (float32[4])"


def test_a_group_whose_records_were_overwritten_proves_nothing() -> None:
    """Rank 0 finished, its ring holding only its subgroup's records: whether it entered the
    world's all_reduce #1 rank 1 waits in, its records no longer say (before: "rank 0 never
    entered it", the test ended)."""
    groups = {**WORLD3, "1": {"ranks": "[0, 2]"}}
    rank0 = records(
        *[numbered(call("barrier", True, "1"), 9 + n, 4 + n) for n in range(3)], groups=groups
    )
    rank1 = records(numbered(call("all_reduce", False), 0, 1), groups=groups)
    story = explain({0: rank0, 1: rank1}, START, finished={0}, world_size=3)
    assert story is not None and not story.verdict.proven
    assert "rank 0" not in story.verdict.text
