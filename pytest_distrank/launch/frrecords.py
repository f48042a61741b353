"""Rank 0's reading of every rank's flight records when a launched test left ranks stuck.

Runs in rank 0 of a launched world (launcher mode): in its main thread (:mod:`gather`, when peers
are stuck) and in its watchdog (:mod:`watchdog`, when rank 0 itself is). The records of rank 0
itself are dumped here; the stuck ranks' travel with their stacks (``keys.Stack``); the ranks that
finished the test answer :func:`peer_records` while they wait for rank 0's verdict
(``Group.wait``). All of it is JSON read off the control store (:func:`collectives.load` checks
every field; nothing is unpickled), judged by :func:`collectives.explain` as in pool mode.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from ..outcome.collectives import Story, explain, load
from ..outcome.endgame import note_verdict
from ..outcome.stacks import where_blocked
from ..rank.groupstate import flight_records
from . import keys
from .channel import ChannelError
from .tamper import noted

if TYPE_CHECKING:
    from pytest import TestReport

    from .current import Current
    from .session import RankSession

#: Bound on the answers of the ranks that finished a hung test to :func:`peer_records` (each
#: dumps its flight records: tens of ms, and a store round trip).
RECORDS_WAIT = 1.0


def own_records(cur: Current) -> str:
    """This rank's flight records for ``cur``, JSON text (:func:`collectives.dump`; "" when the
    recorder is off); dumped once per test (rank 0's watchdog and gather both ask for it)."""
    if cur.records is None:
        raw = flight_records()
        cur.records = raw.decode("utf-8") if raw else ""
    return cur.records


def peer_records(rs: RankSession, cur: Current, ranks: list[int]) -> dict[int, keys.Records]:
    """Rank 0: the flight records of ``ranks``, which finished test ``cur`` while others are
    still in it (each answers once, while it waits for rank 0's verdict: ``Group.wait``; kept in
    ``cur.peer_records``); a rank that does not answer within :data:`RECORDS_WAIT` is left out
    (unknown), and so is one whose answer does not verify or read (the test fails with it:
    :func:`tamper.noted`)."""
    wanted = [rank for rank in ranks if rank not in cur.peer_records]
    if wanted:
        with contextlib.suppress(ChannelError):
            rs.channel.put(keys.records_request(cur.index), 1)
            end = time.monotonic() + RECORDS_WAIT
            for rank in wanted:
                key = keys.records(cur.index, rank)
                if rs.channel.wait_any([key], end) is None:
                    continue
                with noted(cur):
                    cur.peer_records[rank] = rs.channel.take(key, keys.read_records)
    return {rank: cur.peer_records[rank] for rank in ranks if rank in cur.peer_records}


def verdict_story(
    cur: Current,
    stacks: dict[int, keys.Stack],
    test_file: str,
    finished: set[int],
    world_size: int,
    peers: dict[int, keys.Records],
) -> Story | None:
    """Which collective each rank is in, and who is out of step: rank 0's records, the stuck
    ranks' (with their stacks) and those of the ranks that finished (:func:`peer_records`)."""
    dumps = {0: load(own_records(cur))}
    since = {0: cur.started_ns}
    # JSON read off the network (collectives.load checks every field; nothing unpickled).
    for rank, data in [*peers.items(), *stacks.items()]:
        dumps[rank], since[rank] = load(data["records"]), data["since_ns"]
    where = {r: where_blocked(s["dump"], test_file) for r, s in stacks.items() if s["dump"]}
    return explain(dumps, since, where, finished=finished, world_size=world_size)


def rank0_left_waiting(rs: RankSession, cur: Current, reports: list[TestReport]) -> None:
    """Rank 0 is the one stuck and every peer finished: their records say who left it waiting
    (a peer that never entered the collective is the root cause, as in pool mode)."""
    finished = set(range(1, rs.world_size))
    peers = peer_records(rs, cur, sorted(finished))
    story = verdict_story(cur, {}, str(cur.item.path), finished, rs.world_size, peers)
    if story is None:
        return
    for report in reports:
        note_verdict(report, 0, story.verdict)
