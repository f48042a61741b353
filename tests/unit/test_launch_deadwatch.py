"""Unit tests of launcher mode's early end of a proven deadlock (launch/deadwatch.py).

Rank 0's :class:`Judge` reads what the ranks said while they stood still (``still/<test>/<rank>``,
from a fake control channel here) and the records of the ranks that finished; it ends the test
only when every pending rank stands still, the records prove it, and the ranks said to wait are
inside a collective. The launched worlds of ``tests/e2e/test_launch.py`` show it in real runs
(a rank that leaves, an op mismatch; the legal-but-slow cases pass); the judgement itself is
``collectives.explain``'s, unit-tested in ``test_collectives.py``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from pytest_distrank.launch import keys
from pytest_distrank.launch.current import Current
from pytest_distrank.launch.deadwatch import Beacon, Judge, SelfWatch
from pytest_distrank.launch.session import RankSession
from pytest_distrank.outcome import progress
from pytest_distrank.settings import Value

from .test_collectives import dump, entry
from .test_launch_gather import NODEID, FakeChannel, T

#: The ranks' pids: rank 1 is 1001, rank 2 is 1002.
PIDS = (os.getpid(), 1001, 1002)
#: The ranks' clocks at the test's start (test_collectives' records come after it).
START = 1_000
INSIDE = "all_reduce, called from test_x at test_x.py:5"


class Channel(FakeChannel):
    gets = 0

    def get(self, key: str, read: Callable[[object], T]) -> T:
        self.gets += 1
        return super().get(key, read)

    def wait_any(self, wanted: list[str], until: float | None, **_: Any) -> str | None:
        return next((key for key in wanted if key in self.values), None)


def world(channel: Channel, size: int = 3) -> tuple[RankSession, Current]:
    rs = SimpleNamespace(
        rank=0, world_size=size, channel=channel, pid=os.getpid(), pids=PIDS[:size]
    )
    item = SimpleNamespace(nodeid=NODEID, location=("test_x.py", 3, "test_x"), path=Path("x.py"))
    cur = Current.begin(0, cast(pytest.Item, item), size, Value(60.0, "default"), 1.0, True)
    cur.started_ns = START
    return cast(RankSession, rs), cur


def at(seconds: int) -> float:
    """A moment past the judge's first look (half a second after it was made)."""
    return time.monotonic() + 1.0 + seconds


def records(*entries: dict[str, Any]) -> str:
    return json.dumps(dump(*entries))


def say(channel: Channel, rank: int, text: str, inside: str = INSIDE, still: bool = True) -> None:
    """Rank ``rank`` says it stands still (or moved), as its SelfWatch publishes it."""
    payload = {
        "still": still,
        "records": text,
        "since_ns": START,
        "inside": inside,
        "where": "blocked in all_reduce",
        "pid": PIDS[rank],
        "index": 0,
        "nodeid": NODEID,
    }
    channel.put(keys.still(0, rank), payload)
    channel.add(keys.still_count(0), 1)


WAITING = records(entry("all_reduce", True), entry("all_reduce", False))
LEFT = records(entry("all_reduce", True))


def test_ranks_waiting_for_a_rank_that_finished_without_entering_end_the_test() -> None:
    """Rank 0 left after all_reduce #1 (its main thread is in gather: finished); ranks 1 and 2
    stand still inside all_reduce #2."""
    channel = Channel()
    rs, cur = world(channel)
    cur.game.note_finished(0)
    cur.records = LEFT
    say(channel, 1, WAITING)
    say(channel, 2, WAITING)
    assert Judge(rs, cur).look(at(0))
    assert cur.game.deadlock_at is not None


def test_a_mismatch_ends_the_test_with_rank_0_pending() -> None:
    """Rank 0's own beacon (its watchdog, its main thread in the test) is judged with the
    peers'."""
    channel = Channel()
    rs, cur = world(channel, size=2)
    say(channel, 1, records(entry("broadcast", False)), inside="broadcast")
    own = Beacon(records(entry("all_reduce", False)), START, INSIDE, "")
    assert Judge(rs, cur).look(at(0), own)


def test_a_rank_that_finished_is_asked_for_its_records_once() -> None:
    channel = Channel()
    rs, cur = world(channel)
    cur.game.note_finished(0)
    cur.records = WAITING  # rank 0 itself completed both
    cur.game.note_finished(1)
    channel.put(keys.report(0, 1), {})  # its last reports wait for gather
    channel.add(keys.done_count(0), 1)
    channel.when_put[keys.records_request(0)] = lambda: channel.put(
        keys.records(0, 1), {"records": LEFT, "since_ns": START}
    )
    say(channel, 2, WAITING)
    judge = Judge(rs, cur)
    assert judge.look(at(0))
    assert list(cur.peer_records) == [1]  # kept: rank 1 answers once per test


@pytest.mark.parametrize(
    "case",
    ["one rank never said", "one rank moved", "not inside a collective", "another process"],
)
def test_nothing_is_proven_without_every_pending_rank_standing_still_inside(case: str) -> None:
    channel = Channel()
    rs, cur = world(channel)
    cur.game.note_finished(0)
    cur.records = LEFT
    say(channel, 1, WAITING)
    if case == "one rank moved":
        say(channel, 2, WAITING, still=False)
    elif case == "not inside a collective":
        say(channel, 2, WAITING, inside="")
    elif case == "another process":
        say(channel, 2, WAITING)
        channel.values[keys.still(0, 2)]["pid"] = 4242  # a process the test forked
    assert not Judge(rs, cur).look(at(0))
    assert cur.game.deadlock_at is None


def test_a_rank_that_is_only_late_proves_nothing() -> None:
    """Rank 2 sleeps before all_reduce #2 (pending, standing still, in no collective): ranks 0
    and 1 wait for it, which is legal."""
    channel = Channel()
    rs, cur = world(channel)
    say(channel, 1, WAITING)
    say(channel, 2, LEFT, inside="")
    own = Beacon(WAITING, START, INSIDE, "")
    assert not Judge(rs, cur).look(at(0), own)


def test_rank_0_moving_or_nothing_new_means_no_judgement() -> None:
    channel = Channel()
    rs, cur = world(channel, size=2)
    say(channel, 1, records(entry("broadcast", False)), inside="broadcast")
    judge = Judge(rs, cur)
    assert not judge.look(at(0), None)  # rank 0 pending and moving: unknown
    own = Beacon(records(entry("broadcast", False)), START, INSIDE, "")
    assert not judge.look(at(1), own)  # both in broadcast #1: legal, rank 0 is late
    reads = channel.gets
    assert not judge.look(at(2), own)  # nothing changed: not judged again
    assert channel.gets == reads
    say(channel, 1, records(entry("broadcast", False)), inside="broadcast")
    assert not judge.look(at(3), own)  # rank 1 said it again: judged again
    assert channel.gets == reads + 1


def test_the_judge_first_looks_half_a_second_into_a_test() -> None:
    """A test of milliseconds never meets the watch: no store read at all."""
    channel = Channel()
    rs, cur = world(channel, size=2)
    say(channel, 1, records(entry("broadcast", False)), inside="broadcast")
    own = Beacon(records(entry("all_reduce", False)), START, INSIDE, "")
    reads = channel.gets
    assert not Judge(rs, cur).look(time.monotonic(), own)
    assert (channel.gets, channel.counters.get(keys.still_count(0))) == (reads, 1)


def test_a_rank_says_once_that_it_stands_still_and_again_when_it_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = {"now": 100}
    monkeypatch.setattr(progress, "cpu_ticks", lambda pid: ticks["now"])
    channel = Channel()
    rs, cur = world(channel, size=2)
    rank1 = cast(RankSession, SimpleNamespace(**{**vars(rs), "rank": 1, "pid": PIDS[1]}))
    rank1.main_ident = threading.get_ident()
    watch = SelfWatch(rank1, cur)
    for second in range(4):  # standing still: said once, after the quiet time
        watch.tick(at(second))
    assert channel.counters[keys.still_count(0)] == 1
    said = channel.values[keys.still(0, 1)]
    assert (said["still"], said["pid"], said["where"] != "") == (True, os.getpid(), True)
    ticks["now"] += 50  # it spent half a second of CPU time: it moves
    watch.tick(at(5))
    assert channel.counters[keys.still_count(0)] == 2
    assert channel.values[keys.still(0, 1)]["still"] is False
    assert watch.beacon is None


def _timed(op: str, done: bool, timeout_ms: int) -> dict[str, Any]:
    return {**entry(op, done), "timeout_ms": timeout_ms}


def test_a_collective_whose_group_timeout_comes_first_does_not_end_the_test() -> None:
    """Hostile review 4, D7, under a launcher: rank 1 waits in a barrier on a group with a 6 s
    timeout, which the test expects; rank 0 finished without it. Its beacon, taken 2 s in,
    proves nothing before that timeout (the test's deadline is 60 s); one taken 10 s in does."""
    for dumped, proven in ((2, False), (10, True)):
        channel = Channel()
        rs, cur = world(channel, size=2)
        cur.game.note_finished(0)
        cur.records = records()
        waiting = {
            "entries": [_timed("barrier", False, 6_000)],
            "pg_config": {},
            "dumped_ns": START + dumped * 1_000_000_000,
        }
        say(channel, 1, json.dumps(waiting), inside="barrier")
        assert Judge(rs, cur).look(at(0)) is proven, dumped


def test_a_rank_in_work_wait_is_waiting_only_when_all_it_left_pending_is_hopeless() -> None:
    """Hostile review 4, D15: rank 1 stands in ``Work.wait()`` (its beacon says so) on an
    all_reduce rank 0 finished without; with another pending collective that may complete
    (on a group rank 0 is not in), it is not."""
    channel = Channel()
    rs, cur = world(channel, size=2)
    cur.game.note_finished(0)
    cur.records = records()
    wait = "waits in Work.wait() in test_x at test_x.py:5"
    say(channel, 1, records(entry("all_reduce", False)), inside=wait)
    assert Judge(rs, cur).look(at(0))
    channel = Channel()
    rs, cur = world(channel, size=2)
    cur.game.note_finished(0)
    cur.records = records()
    alone = {"1": {"ranks": "[1]"}}
    hopeful = dump(
        entry("barrier", False, group=("1", "")), entry("all_reduce", False), groups=alone
    )
    say(channel, 1, json.dumps(hopeful), inside=wait)
    assert not Judge(rs, cur).look(at(0))
