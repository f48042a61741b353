"""Launcher mode, while one distributed test runs: what a rank tells rank 0 before its last
reports, and rank 0's looks for it.

:func:`publish_early` runs in every rank, in the main thread, as soon as the rank fails or skips
(rank 0's failure grace starts then); :func:`publish_stopped` when ``pytest.exit()`` or
``KeyboardInterrupt`` ends its session. :func:`poll_early` and :func:`poll_finished` run in rank 0
of a launched world, in its watchdog thread while the main thread is in the test; :func:`gather.
gather` polls early too, while it waits for its peers. :func:`warning_records`: the test's
warnings as they travel to rank 0.

Rank 0 credits a payload only to the rank process that sent it, for the test it names (pid at
send time, test index, node id: :func:`keys.identity`); anything else fails the test as pool
mode's does (:func:`foreign`, :func:`reports.check_failure`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable

from pytest import TestReport

from ..outcome.checks import foreign_crash
from ..outcome.endgame import grace_trigger
from ..outcome.records import WarningRecord
from ..outcome.reports import check_failure
from ..outcome.warnings import warning_record
from . import keys
from .current import Current
from .report import FRESH_GROUP
from .session import RankSession
from .tamper import noted


def publish_early(rs: RankSession, cur: Current, report: TestReport) -> None:
    """This rank failed or skipped: tell rank 0 now, so that its grace period starts now.

    A subtest, an xfail or a pass starts no grace (:func:`endgame.grace_trigger`): nothing to say.
    A process the test forked says nothing here: the control connection is the rank's.
    """
    kind = grace_trigger(report)
    if kind is None or os.getpid() != rs.pid:
        return
    first = rs.rank not in cur.early_ranks
    cur.early_ranks.add(rs.rank)
    cur.game.note_trigger(rs.rank, kind, time.monotonic())
    if rs.rank != 0 and first:
        key = keys.early(cur.index, rs.rank)
        payload: keys.Early = {
            "kind": kind,
            "when": report.when,
            **keys.identity(cur.index, cur.item.nodeid),
        }
        rs.channel.put(key, payload)
        rs.channel.add(keys.early_count(cur.index), 1)


def publish_stopped(rs: RankSession, cur: Current | None, message: str) -> None:
    """A rank other than 0: ``pytest.exit()`` or ``KeyboardInterrupt`` ended its session (in
    ``cur``, or between tests): tell rank 0, which stops waiting for it and ends the run."""
    index, nodeid = (cur.index, cur.item.nodeid) if cur is not None else (-1, "")
    payload: keys.Fatal = {
        "message": message,
        "when": cur.when if cur is not None else "",
        "reports": [rs.serialize(r) for r in list(cur.reports)] if cur is not None else [],
        "warnings": warning_records(cur.caught) if cur is not None else [],
        **keys.identity(index, nodeid),
    }
    rs.channel.put(keys.fatal(rs.rank), payload)
    if cur is not None:
        rs.channel.add(keys.early_count(cur.index), 1)  # rank 0 looks at once, not within a second


#: Rank 0 looks for ended sessions this often without a sign (a rank interrupted between tests).
FATAL_EVERY = 1.0


def poll_early(rs: RankSession, cur: Current) -> None:
    """Rank 0: note the other ranks' early failures and skips, and ranks whose session ended
    (one counter read when none, and a look for ended sessions every ``FATAL_EVERY``)."""
    channel = rs.channel
    count = channel.add(keys.early_count(cur.index), 0)
    now = time.monotonic()
    if count == cur.early_seen and now < cur.fatal_at:
        return
    cur.early_seen, cur.fatal_at = count, now + FATAL_EVERY
    for rank in range(1, rs.world_size):
        # A session ends for the launched rank: a sub-world's view (RankSession.view) maps it.
        members: tuple[int, ...] = getattr(rs, "members", ())
        fatal = keys.fatal(members[rank] if members else rank)
        if rank not in cur.stopped and channel.has(fatal):
            with noted(cur):
                cur.stopped[rank] = channel.get(fatal, keys.read_fatal)
                cur.game.note_lost(rank, "stopped serving", now)
        key = keys.early(cur.index, rank)
        if rank not in cur.early_ranks and channel.has(key):
            cur.early_ranks.add(rank)
            with noted(cur):
                data = channel.get(key, keys.read_early)
                if foreign(rs, cur, rank, data) is None:
                    cur.game.note_trigger(rank, data["kind"], now)


def foreign(rs: RankSession, cur: Current, rank: int, data: keys.Identity) -> TestReport | None:
    """A failure when ``data`` was not sent by ``rank``'s own process for this very test."""
    pid = rs.pids[rank] if rank < len(rs.pids) else 0
    sender, index, nodeid = data["pid"], data["index"], data["nodeid"]
    item = cur.item
    if sender == pid and index == cur.index and nodeid == item.nodeid:
        return None
    crash = foreign_crash(pid, sender, index, nodeid, cur.index)
    if sender != pid:
        more = (
            "A process forked by the test (os.fork(), multiprocessing's fork) that returns into "
            "pytest runs the rest of the test again; it left as soon as it reached the rank's "
            "own code. End such a child with os._exit() (or use subprocess or the 'spawn' start "
            f"method). {FRESH_GROUP}"
        )
    else:
        more = f"The rank's control messages are out of step with rank 0. {FRESH_GROUP}"
    return check_failure(item.nodeid, item.location, rank, rs.world_size, crash, more, time.time())


def take_foreign(
    rs: RankSession,
    cur: Current,
    per_rank: dict[int, list[TestReport]],
    rank: int,
    data: keys.Identity,
) -> bool:
    """Fail the test for a foreign payload of ``rank``; return whether it was foreign."""
    report = foreign(rs, cur, rank, data)
    if report is None:
        return False
    per_rank.setdefault(rank, []).append(report)
    cur.game.note_reports(rank, [report], time.monotonic())
    return True


def poll_finished(rs: RankSession, cur: Current) -> None:
    """Rank 0's watchdog: note the peers whose last reports are waiting in the store (one
    counter read when none is new). They stay there for :func:`gather` to take, and verify then:
    a forged one noted here as finished fails the test when taken (reading it here too could
    block on a key the main thread takes meanwhile)."""
    count = rs.channel.add(keys.done_count(cur.index), 0)
    if count == cur.done_seen:
        return
    cur.done_seen = count
    for rank in sorted(cur.game.pending - {0}):
        if rs.channel.has(keys.report(cur.index, rank)):
            cur.game.note_finished(rank)


def warning_records(caught: Iterable[warnings.WarningMessage]) -> list[WarningRecord]:
    """The test's warnings, as they travel to rank 0 (``warnings.merge_warnings``' records)."""
    return [warning_record(w) for w in list(caught)]
