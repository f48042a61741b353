"""Launcher mode, rank 0: payloads of a test that did not verify, and counters no payload backs.

Runs in rank 0 of a launched world, in :mod:`gather`'s reads (main thread, or the watchdog
thread). :class:`channel.Channel` raises :class:`channel.Forged` for a payload whose MAC does not
verify (:mod:`auth`), or that does not read as its kind (:class:`channel.Malformed`, the key
named by :mod:`keys`' reader); here it becomes a note on the running test
(:attr:`current.Current.forged`), which starts the failure grace like a rank's failure and ends
as a failed report under the rank the key speaks for (:func:`reports.forged_report`). What it
cannot see: a genuine payload that someone deleted before rank 0 read it is only noticed through
its counter (:func:`check_done`); for other keys (an early failure, a stack) its absence reads as
the rank's silence.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from pytest import TestReport

from ..outcome.reports import fill_passed, forged_report
from . import keys
from .channel import Forged

if TYPE_CHECKING:
    from .current import Current
    from .session import RankSession


@contextlib.contextmanager
def noted(cur: Current) -> Iterator[None]:
    """Reads of the test's payloads: one that does not verify is noted (the test fails with it,
    :func:`forged_reports`) and starts the failure grace, as a rank's failure does."""
    try:
        yield
    except Forged as exc:
        if exc.key not in cur.forged:
            cur.forged[exc.key] = exc
            cur.game.note_trigger(exc.rank, "failed", time.monotonic())


def check_done(cur: Current, done: int, unread: Iterable[int]) -> None:
    """``done/<test>`` counts the last reports written; each was in the store before the count
    moved (a rank sets it, then adds), and rank 0 reads each one: more counted than read means a
    report was deleted or the counter moved alone. Named under the first rank of ``unread``
    (those whose report rank 0 had not read when the count moved). ``done`` leaves out the
    reports of ranks rank 0 took for stopped (:attr:`current.Current.stopped`) that came after
    all: rank 0 does not read them, and they are no tampering (:data:`gather.AFTER_ALL`)."""
    if done <= cur.reports_read:
        return
    why = (
        f"counts {done} last reports of this test but only {cur.reports_read} were in the store: "
        "a report was deleted, or the counter was moved without one"
    )
    with noted(cur):
        raise Forged(keys.done_count(cur.index), min(unread, default=1), why)


def forged_reports(rs: RankSession, cur: Current, per_rank: dict[int, list[TestReport]]) -> None:
    """A failed report for each payload of the test that did not verify, under its rank."""
    item = cur.item
    for forged in cur.forged.values():
        report = forged_report(item.nodeid, item.location, rs.world_size, forged, time.time())
        reports = per_rank.setdefault(forged.rank, [])
        fill_passed(reports, item.nodeid, item.location, "call")
        reports.append(report)
