"""Unit tests of launcher mode's gathering (launch/gather.py, early.py), with a fake control
channel.

Rank 0 gathers every rank's reports of a distributed test from the control store: the peers'
last reports, early failures (the grace starts then), payloads from a process the test forked,
a peer whose pytest session ended, and the ranks that never finish (asked for their stacks,
reported stuck or timed out). The launched worlds of ``tests/e2e/test_launch.py`` show these in
real runs; here each case runs in milliseconds, including the ones no world shows (a peer that
sends neither its reports nor its stack).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, TypeVar, cast

import pytest
from pytest import TestReport

from pytest_distrank.launch import gather as gather_module
from pytest_distrank.launch import keys
from pytest_distrank.launch.channel import Malformed
from pytest_distrank.launch.current import Current
from pytest_distrank.launch.early import foreign, poll_early, publish_early
from pytest_distrank.launch.gather import gather, left_stuck, stopped_serving, stuck_words
from pytest_distrank.launch.session import RankSession
from pytest_distrank.settings import Value

NODEID = "test_x.py::test_x"
LOCATION = ("test_x.py", 3, "test_x")
#: The ranks' pids: rank 1 is this process (which publishes as rank 1 in some tests).
PIDS = (1000, os.getpid())
T = TypeVar("T")


class FakeChannel:
    """The control store as a dict of JSON values; ``when_put`` adds keys when a key is put
    (a peer answering rank 0's request)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.counters: dict[str, int] = {}
        self.when_put: dict[str, Callable[[], None]] = {}

    def put(self, key: str, value: object) -> None:
        self.values[key] = json.loads(json.dumps(value))
        if key in self.when_put:
            self.when_put.pop(key)()

    def has(self, key: str) -> bool:
        return key in self.values

    def get(self, key: str, read: Callable[[object], T]) -> T:
        try:
            return read(self.values[key])
        except keys.MessageError as exc:  # as Channel.get says it
            raise Malformed(key, keys.subject(key)[1], f"does not read: {exc}") from None

    def take(self, key: str, read: Callable[[object], T]) -> T:
        try:
            return self.get(key, read)
        finally:
            self.values.pop(key)

    def add(self, key: str, amount: int) -> int:
        self.counters[key] = self.counters.get(key, 0) + amount
        return self.counters[key]


class Reports:
    """Serialization stand-in: a report travels as its index in this list."""

    def __init__(self) -> None:
        self.sent: list[TestReport] = []

    def serialize(self, report: TestReport) -> dict[str, Any]:
        self.sent.append(report)
        return {"ref": len(self.sent) - 1}

    def deserialize(self, data: dict[str, Any]) -> TestReport:
        return self.sent[int(data["ref"])]


Outcome = Literal["passed", "failed", "skipped"]
When = Literal["setup", "call", "teardown"]


def report(when: When, outcome: Outcome = "passed") -> TestReport:
    longrepr = "boom" if outcome == "failed" else None
    return TestReport(NODEID, LOCATION, {}, outcome, longrepr, when)


def passed() -> list[TestReport]:
    return [report("setup"), report("call"), report("teardown")]


@pytest.fixture(autouse=True)
def _short_dump_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks asked for their stacks get 0.1 s here (3 s in a run)."""
    monkeypatch.setattr(gather_module, "DUMP_WAIT", 0.1)


@pytest.fixture
def wire() -> Reports:
    return Reports()


def rank_session(channel: FakeChannel, wire: Reports, rank: int = 0, pid: int = 0) -> RankSession:
    rs = SimpleNamespace(
        rank=rank,
        world_size=2,
        channel=channel,
        pid=pid or os.getpid(),
        pids=PIDS,
        logs={0: "(rank 0 prints the report)", 1: "node1:/tmp/run/rank1.log"},
        serialize=wire.serialize,
        deserialize=wire.deserialize,
    )
    return cast(RankSession, rs)


def current(timeout: float = 60.0, grace: float = 0.2) -> Current:
    item = SimpleNamespace(nodeid=NODEID, location=LOCATION, path=Path.cwd() / "test_x.py")
    cur = Current.begin(0, cast(pytest.Item, item), 2, Value(timeout, "default"), grace)
    cur.reports = passed()
    cur.records = ""  # no flight recorder in this process
    return cur


def peer_report(wire: Reports, reports: list[TestReport], pid: int = PIDS[1]) -> dict[str, Any]:
    return {
        "reports": [wire.serialize(r) for r in reports],
        "healthy": True,
        "warnings": [["builtins", "UserWarning", "only on rank 1", "test_x.py", 5]],
        "sequence": {"default group": 3},
        "pid": pid,
        "index": 0,
        "nodeid": NODEID,
    }


def send_last_reports(channel: FakeChannel, payload: dict[str, Any]) -> None:
    channel.put(keys.report(0, 1), payload)
    channel.add(keys.done_count(0), 1)


def crash_line(rep: TestReport) -> str:
    return str(rep.longrepr.reprcrash.message)  # type: ignore[union-attr]


def test_every_peers_last_reports_are_gathered(wire: Reports) -> None:
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current()
    peer = passed()
    send_last_reports(channel, peer_report(wire, peer))
    per_rank, stuck, healthy = gather(rs, cur)
    assert per_rank == {0: cur.reports, 1: peer}
    assert (stuck, healthy) == ([], True)
    assert cur.game.finished == {0, 1}
    assert cur.peer_warnings == {1: [("builtins", "UserWarning", "only on rank 1", "test_x.py", 5)]}
    assert cur.sequences == {1: {"default group": 3}}
    assert not channel.has(keys.report(0, 1))  # read once: the store does not grow


def test_a_broken_process_group_of_a_peer_is_reported_as_unhealthy(wire: Reports) -> None:
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current()
    send_last_reports(channel, {**peer_report(wire, passed()), "healthy": False})
    assert gather(rs, cur)[2] is False


def test_an_early_failure_starts_the_grace_on_rank_0(wire: Reports) -> None:
    channel = FakeChannel()
    rank1, cur1 = rank_session(channel, wire, rank=1), current()
    publish_early(rank1, cur1, report("call", "failed"))
    publish_early(rank1, cur1, report("call", "failed"))  # said once
    assert channel.counters[keys.early_count(0)] == 1
    rank0, cur0 = rank_session(channel, wire), current()
    poll_early(rank0, cur0)
    assert (cur0.game.trigger, cur0.game.failed) == ("rank 1 failed", {1})
    # A pass, or a process the test forked, says nothing.
    quiet = current()
    publish_early(rank1, quiet, report("call"))
    publish_early(rank_session(channel, wire, rank=1, pid=4242), quiet, report("call", "failed"))
    assert channel.counters[keys.early_count(0)] == 1


def test_a_payload_from_another_process_fails_the_test() -> None:
    """What a child of os.fork() that returned into pytest sends (test_launch.py's
    child-finished-first world shows the row)."""
    rs, cur = rank_session(FakeChannel(), Reports()), current()
    mine = {"pid": PIDS[1], "index": 0, "nodeid": NODEID}
    assert foreign(rs, cur, 1, cast(keys.Identity, mine)) is None
    child = foreign(rs, cur, 1, cast(keys.Identity, {**mine, "pid": 4242}))
    assert child is not None and child.failed and child.when == "call"
    assert crash_line(child) == (
        f"sent reports from pid 4242, not its own ({PIDS[1]}): a process forked by the test?"
    )
    text = str(child.longrepr)
    assert "End such a child with os._exit()" in text
    assert "Every rank's process group was created anew before the next test" in text
    late = foreign(rs, cur, 1, cast(keys.Identity, {**mine, "index": 7, "nodeid": "t.py::old"}))
    assert late is not None
    assert crash_line(late) == "sent reports for test #7 (t.py::old) while test #0 was running"
    assert "The rank's control messages are out of step with rank 0." in str(late.longrepr)


def test_a_forked_payload_fails_the_test_and_the_ranks_own_reports_still_count(
    wire: Reports,
) -> None:
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current()
    peer = passed()
    send_last_reports(channel, peer_report(wire, passed(), pid=4242))
    # The rank's own reports follow once rank 0 has read the child's.
    original_take = channel.take

    def take(key: str, read: Callable[[object], T]) -> T:
        value = original_take(key, keys.read_peer_report)
        if key == keys.report(0, 1) and value["pid"] == 4242:
            send_last_reports(channel, peer_report(wire, peer))
        return read(value)

    channel.take = take  # type: ignore[method-assign]
    per_rank, stuck, healthy = gather(rs, cur)
    assert stuck == []
    assert crash_line(per_rank[1][0]).startswith(
        f"sent reports from pid 4242, not its own ({PIDS[1]})"
    )
    assert per_rank[1][1:] == peer
    assert healthy is False


def test_a_malformed_last_report_fails_the_test_naming_the_key(wire: Reports) -> None:
    """Rank 1's last reports came but do not read (its index as text: a protocol bug): it is not
    waited for as if silent; its row names the key and what was there, never a default."""
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current(timeout=5.0)
    send_last_reports(channel, {**peer_report(wire, passed()), "index": "0"})
    start = time.monotonic()
    per_rank, stuck, healthy = gather(rs, cur)
    assert (stuck, healthy) == ([], False)
    assert time.monotonic() - start < 2.0  # not the deadline, nor a wait for its stack
    assert [(r.when, r.outcome) for r in per_rank[1]] == [("setup", "passed"), ("call", "failed")]
    assert crash_line(per_rank[1][1]) == (
        "malformed control payload: 'report/0/1' does not read: the PeerReport payload's "
        "'index' is '0' (str), not int"
    )
    assert "report/0/1" not in channel.values  # taken: the store does not keep it


def test_a_peer_that_never_answers_times_out_without_stack_or_reports(wire: Reports) -> None:
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current(timeout=0.2)
    per_rank, stuck, _ = gather(rs, cur)
    assert stuck == [1]
    assert channel.get(keys.abort(0), keys.read_abort) == {"reason": "timeout after 0.2 s"}
    setup, last = per_rank[1]
    assert (setup.when, setup.outcome) == ("setup", "passed")
    assert (last.when, last.outcome) == ("call", "failed")
    assert crash_line(last) == "no report from rank 1/2 in call"
    assert "sent neither its reports nor its stack in time" in str(last.longrepr)
    assert "node1:/tmp/run/rank1.log" in str(last.longrepr)


def test_a_stuck_peer_is_reported_from_its_stack(wire: Reports) -> None:
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current(timeout=0.2)
    dump = (
        "Thread 0x00007f0000000001 [MainThread] (most recent call first):\n"
        f'  File "{Path.cwd() / "test_x.py"}", line 8 in test_x\n'
    )
    stack = {
        "dump": dump,
        "when": "call",
        "reports": [wire.serialize(report("setup"))],
        "warnings": [],
        "records": "",
        "since_ns": 0,
        "pid": PIDS[1],
        "index": 0,
        "nodeid": NODEID,
    }
    channel.when_put[keys.abort(0)] = lambda: channel.put(keys.stack(0, 1), stack)
    per_rank, stuck, _ = gather(rs, cur)
    assert stuck == [1]
    setup, last = per_rank[1]
    assert setup.outcome == "passed" and last.failed
    assert crash_line(last).startswith("Timeout: still in call after 0.2 s")
    assert "blocked in test_x at test_x.py:8" in str(last.longrepr)


def test_a_peer_whose_session_ended_is_not_waited_for(wire: Reports) -> None:
    """pytest.exit() or KeyboardInterrupt on rank 1 (test_launch.py's pytest-exit and
    keyboard-interrupt worlds show the rows): rank 0 stops waiting at once."""
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current(timeout=60.0, grace=60.0)
    message = "pytest.exit('database gone') was called in test_x.py::test_x (returncode=3)"
    fatal = {
        "message": message,
        "when": "call",
        "reports": [wire.serialize(report("setup"))],
        "warnings": [],
        "pid": PIDS[1],
        "index": 0,
        "nodeid": NODEID,
    }
    channel.put(keys.fatal(1), fatal)
    per_rank, stuck, healthy = gather(rs, cur)
    assert (stuck, healthy) == ([], False)
    assert cur.game.lost == {1} and cur.game.trigger == "rank 1 stopped serving"
    setup, last = per_rank[1]
    assert setup.outcome == "passed" and last.when == "call"
    assert crash_line(last) == f"stopped serving in call: {message}"
    assert stopped_serving(cur) == (
        f"rank 1 stopped serving: {message}; a rank whose pytest session ended cannot run the "
        "remaining tests, so the launched world stops here"
    )


def test_why_the_world_stops_after_stuck_ranks() -> None:
    cur = current()
    tail = (
        "a rank still inside its test cannot be taken out of it (a collective cannot be "
        "interrupted, and the plugin raises nothing into Python code), so the launched world "
        "stops here"
    )
    assert left_stuck(cur, [0, 1]) == f"test_x.py::test_x left rank(s) 0, 1 stuck (timeout); {tail}"
    # Brief A46 item 5: a rank asleep in Python was said to be stuck in a collective.
    dump = 'Thread 0x1 (most recent call first):\n  File "test_x.py", line 9 in test_x\n'
    cur.stuck_at[0] = stuck_words("", dump, True, "test_x.py")
    cur.stuck_at[1] = stuck_words("in barrier #1 on the default group", dump, True, "test_x.py")
    assert left_stuck(cur, [0, 1]) == (
        "test_x.py::test_x left rank(s) 0, 1 stuck (timeout): rank 0 in no collective (blocked "
        "in test_x at test_x.py:9); rank 1 in barrier #1 on the default group (blocked in test_x "
        f"at test_x.py:9); {tail}"
    )
    assert stuck_words("", "", False, "test_x.py") == (
        "sent no stack (it holds the GIL, or its process died)"
    )
    assert stuck_words("", dump, False, "test_x.py") == (
        "blocked in test_x at test_x.py:9; whether in a collective is not known (no flight records)"
    )
    cur.stuck_at.clear()
    cur.game.note_trigger(1, "failed", 0.0)
    assert left_stuck(cur, [0]).startswith("test_x.py::test_x left rank(s) 0 stuck (rank 1 failed)")


def test_a_rank_judged_gone_that_reports_after_all_is_no_tampering(wire: Reports) -> None:
    """Hostile report H2: rank 0's liveness judged rank 1 gone (it was only slow); rank 1 then
    sends its last reports and moves ``done/0``, which rank 0 no longer reads. That count is not
    read as a deleted report of rank 2 (whose own reports count), and rank 1's row says what it
    is."""
    channel = FakeChannel()
    rs = rank_session(channel, wire)
    rs.world_size, rs.pids = 3, (*PIDS, 2000)
    cur = current(timeout=60.0, grace=60.0)
    gone = "launched rank 1 (pid 1000 on node1) sent no sign of life for 5 s in call of x"
    fatal = {"message": gone, "when": "call", "reports": [], "warnings": [], "index": 0}
    channel.put(keys.fatal(1), {**fatal, "pid": PIDS[1], "nodeid": NODEID})
    send_last_reports(channel, peer_report(wire, passed()))  # rank 1, back
    channel.put(keys.report(0, 2), peer_report(wire, passed(), pid=2000))
    channel.add(keys.done_count(0), 1)
    per_rank, stuck, healthy = gather(rs, cur)
    assert cur.forged == {}
    assert [r.outcome for r in per_rank[2]] == ["passed"] * 3
    assert (stuck, healthy) == ([], False)
    assert (
        crash_line(per_rank[1][-1]) == f"stopped serving in call: {gone}; {gather_module.AFTER_ALL}"
    )


def test_a_rank_found_gone_while_its_stack_is_awaited_is_reported_by_that_verdict(
    wire: Reports,
) -> None:
    """Hostile report M2: rank 1 was killed in a collective; rank 0's own call failed first, and
    while it waits for rank 1's stack its liveness finds rank 1's process gone. Rank 1's row is
    that verdict, not "no report from rank 1/2 ... may have crashed or be stuck holding the
    GIL", and it is not left stuck."""
    channel = FakeChannel()
    rs, cur = rank_session(channel, wire), current(timeout=60.0, grace=0.0)
    cur.game.note_trigger(0, "failed", time.monotonic())
    gone = (
        "launched rank 1 (pid 1000 on node1) sent no sign of life for 5 s in call of "
        f"{NODEID}: its process is gone (its exit status went to the launcher)"
    )
    fatal = {"message": gone, "when": "call", "reports": [], "warnings": [], "index": 0}

    def liveness() -> None:  # what liveness.Liveness._judge writes
        channel.put(keys.fatal(1), {**fatal, "pid": PIDS[1], "nodeid": NODEID})
        channel.add(keys.early_count(0), 1)

    channel.when_put[keys.abort(0)] = liveness
    per_rank, stuck, healthy = gather(rs, cur)
    assert (stuck, healthy) == ([], False)
    assert [(r.when, r.outcome) for r in per_rank[1]] == [("setup", "passed"), ("call", "failed")]
    assert crash_line(per_rank[1][-1]) == f"stopped serving in call: {gone}"
    assert stopped_serving(cur).startswith(f"rank 1 stopped serving: {gone}")
