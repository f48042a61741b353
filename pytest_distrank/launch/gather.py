"""Launcher mode, the end of one distributed test: rank 0 gathers every rank's reports.

:func:`gather` runs in rank 0 of a launched world: in its main thread once its own part of the
test is over, or in its watchdog thread when the main thread is stuck. What the ranks say before
their last reports (failed, skipped, session ended), and rank 0's polls for it, are
:mod:`early`'s.

Rank 0 credits a payload only to the rank process that sent it, for the test it names
(:func:`early.foreign`): anything else fails the test as pool mode's does. A payload whose MAC
does not verify (:class:`channel.Forged`: someone else wrote the store) fails the test naming
its key and rank (:func:`reports.forged_report`), and so does a ``done/<test>`` counter that
counts more last reports than were ever in the store (one was deleted, or the counter moved
alone): a counter only says "go read". A rank whose session ended (``fatal/<rank>``) is lost, as
a crashed rank is in pool mode: its peers get the failure grace, and the run ends.

When to stop waiting is :class:`endgame.Endgame`'s rule, the same as pool mode's: a rank finished
only when its last reports arrived; waiting ends at the deadline or when the failure grace is
over (plus ``FINISH_WAIT`` when only ranks that failed themselves are left). Ranks still running
then are asked for their stacks (the ``abort/<test>`` key, which their watchdogs watch) and
reported by :func:`reports.unfinished_report` as stuck (they are left running) or timed out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest import TestReport

from ..outcome.collectives import Verdict
from ..outcome.endgame import (
    BEFORE_SETUP,
    DUMP_WAIT,
    LATE,
    LATE_REASON,
    Position,
    Unfinished,
    failed_itself,
    note_verdict,
)
from ..outcome.records import WarningRecord
from ..outcome.reports import (
    fill_passed,
    silent_report,
    stopped_report,
    unfinished_report,
)
from ..outcome.stacks import where_blocked
from . import keys
from .channel import POLL_MAX, Malformed
from .current import Current
from .early import foreign, poll_early, take_foreign, warning_records
from .frrecords import peer_records, rank0_left_waiting, verdict_story
from .report import SESSION_ENDED
from .session import RankSession
from .tamper import check_done, forged_reports, noted


def _take_report(
    rs: RankSession, cur: Current, per_rank: dict[int, list[TestReport]], rank: int
) -> bool:
    """Read one rank's last reports; return whether its process group survived the test.

    A payload from another process (or for another test) fails the test; the rank's own
    reports may still come, as in pool mode.
    """
    cur.reports_read += 1
    key = keys.report(cur.index, rank)
    data: keys.PeerReport | None = None
    with noted(cur):
        data = rs.channel.take(key, keys.read_peer_report)
    if data is None:
        if isinstance(cur.forged.get(key), Malformed):  # its last reports came, unreadable
            cur.game.note_finished(rank)
        return False
    if take_foreign(rs, cur, per_rank, rank, data):
        return False
    reports = [rs.deserialize(d) for d in data["reports"]]
    per_rank.setdefault(rank, []).extend(reports)
    cur.game.note_reports(rank, reports, time.monotonic())
    cur.game.note_finished(rank)
    cur.peer_warnings[rank] = data["warnings"]
    cur.sequences[rank] = data["sequence"]
    return data["healthy"]


def warnings_of(cur: Current) -> dict[int, list[WarningRecord]]:
    """Rank 0: every rank's warnings in the test (its own from its live log)."""
    return {0: warning_records(cur.caught), **cur.peer_warnings}


def gather(
    rs: RankSession,
    cur: Current,
    own: list[TestReport] | None = None,
    look: Callable[[float], bool] | None = None,
) -> tuple[dict[int, list[TestReport]], list[int], bool]:
    """Every rank's reports of the test (rank 0's: ``own``, else what it made).

    Without ``own`` the main thread calls it, its part of the test over: rank 0 has finished on
    evidence (its reports are in hand). With ``own`` (the watchdog's, synthesized while the main
    thread is stuck) rank 0 stays pending. ``look``: called while peers are waited for, it ends
    the wait early when the ranks' records prove a deadlock (:meth:`deadwatch.Judge.look`).
    Returns the reports per rank, the ranks that did not finish (reported from their stacks: the
    run cannot go on with them), and whether every peer's process group survived.
    """
    channel = rs.channel
    game = cur.game
    if own is None:
        game.note_finished(0)
    per_rank: dict[int, list[TestReport]] = {0: list(cur.reports if own is None else own)}
    missing = set(range(1, rs.world_size))
    healthy = True
    done_seen = 0
    delay = 0.0005
    while True:
        poll_early(rs, cur)
        missing -= cur.stopped.keys()
        if not missing:
            break
        done = channel.add(keys.done_count(cur.index), 0)
        if done != done_seen:
            done_seen = done
            for rank in sorted(missing):
                if channel.has(keys.report(cur.index, rank)):
                    healthy = _take_report(rs, cur, per_rank, rank) and healthy
            late = [r for r in cur.stopped if channel.has(keys.report(cur.index, r))]
            check_done(cur, done - len(late), missing)
            missing -= game.finished
            delay = 0.0005
            if not missing:
                break
        if look is not None:
            look(time.monotonic())
        if game.expired(time.monotonic()):
            break
        time.sleep(delay)
        delay = min(delay * 2, POLL_MAX)
    stuck: list[int] = []
    if missing:
        stuck, late_healthy = _conclude(rs, cur, per_rank, sorted(missing))
        healthy = healthy and late_healthy
    elif own is not None:  # rank 0 is the one stuck: who left it waiting?
        rank0_left_waiting(rs, cur, per_rank[0])
    for rank, data in sorted(cur.stopped.items()):
        if channel.has(keys.report(cur.index, rank)):  # judged gone, it reported after all
            data = data.copy()
            data["message"] += f"; {AFTER_ALL}"
        per_rank.setdefault(rank, []).extend(stopped_reports(rs, cur, rank, data))
    fine = _strays(rs, cur, per_rank) and healthy and not cur.stopped
    forged_reports(rs, cur, per_rank)
    return per_rank, stuck, fine and not cur.forged


#: A rank reported gone (:mod:`liveness`) whose last reports came after all: ``done/<test>``
#: counts them, rank 0 does not read them (no tampering: a wrong verdict of liveness).
AFTER_ALL = (
    "yet its last reports of this test reached the store after that (it was only slow): "
    "they are not read, and the run stops after this batch all the same"
)


def stopped_reports(rs: RankSession, cur: Current, rank: int, data: keys.Fatal) -> list[TestReport]:
    """The reports of a rank whose pytest session ended: what it sent, and how it ended."""
    item = cur.item
    if data["index"] != cur.index:  # it ended between tests: this one never began
        pos, reports = BEFORE_SETUP, []
    else:
        report = foreign(rs, cur, rank, data)
        if report is not None:
            return [report]
        pos = Position.in_phase(data["when"] or "call")
        reports = [rs.deserialize(d) for d in data["reports"]]
        cur.peer_warnings[rank] = data["warnings"]
    fill_passed(reports, item.nodeid, item.location, pos.when)
    wall, message = time.time(), data["message"]
    reports.append(
        stopped_report(item.nodeid, item.location, pos.when, pos.at, message, wall, SESSION_ENDED)
    )
    return reports


def _strays(rs: RankSession, cur: Current, per_rank: dict[int, list[TestReport]]) -> bool:
    """What processes the test forked sent (``stray/<test>/<rank>``, :meth:`session.RankSession.
    leave_if_fork`): it fails the test. One counter read when none; returns False when any."""
    channel = rs.channel
    if not channel.add(keys.stray_count(cur.index), 0):
        return True
    for rank in range(rs.world_size):
        key = keys.stray(cur.index, rank)
        if channel.has(key):
            with noted(cur):
                take_foreign(rs, cur, per_rank, rank, channel.take(key, keys.read_identity))
    return False


def stopped_serving(cur: Current) -> str:
    """Why the run ends after ranks' sessions ended in ``cur`` (the remaining tests' reason),
    the ranks named as the launched world numbers them (a sub-world's test: its view's)."""
    ranks = sorted(cur.stopped)
    message = cur.stopped[ranks[0]]["message"]
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    view = cur.view
    names = ", ".join(str(view.launched_rank(r) if view is not None else r) for r in ranks)
    return (
        f"rank {names} stopped serving: {first or 'its pytest session ended'}; a rank whose "
        "pytest session ended cannot run the remaining tests, so the launched world stops here"
    )


def left_stuck(cur: Current, stuck: list[int]) -> str:
    """Why the run ends after ``cur`` left ``stuck`` (its world's ranks) stuck (the remaining
    tests' skip reason), each named as the launched world numbers it, with what is known of
    where it is (:func:`stuck_words`): in a collective, or in Python code with no collective in
    flight (its stack is in the test's report)."""
    view = cur.view
    names = [str(view.launched_rank(r) if view is not None else r) for r in stuck]
    game = cur.game
    why = game.trigger or ("a proven deadlock" if game.deadlock_at is not None else "timeout")
    known = "; ".join(
        f"rank {name} {cur.stuck_at[rank]}"
        for rank, name in zip(stuck, names, strict=True)
        if rank in cur.stuck_at
    )
    return (
        f"{cur.item.nodeid} left rank(s) {', '.join(names)} stuck ({why})"
        + (f": {known}" if known else "")
        + "; a rank still inside its test cannot be taken out of it (a collective cannot be "
        "interrupted, and the plugin raises nothing into Python code), so the launched world "
        "stops here"
    )


def stuck_words(collective: str, dump: str, records: bool, test_file: str) -> str:
    """Where a stuck rank is, as far as it is known: ``collective`` (the flight recorder's
    pending collective, "" for none), its stack ``dump`` ("" when it sent none) and whether its
    flight ``records`` were on."""
    if not dump:
        return "sent no stack (it holds the GIL, or its process died)"
    where = where_blocked(dump, test_file)
    if collective:
        return f"{collective} ({where})"
    if records:
        return f"in no collective ({where})"
    return f"{where}; whether in a collective is not known (no flight records)"


def _conclude(
    rs: RankSession, cur: Current, per_rank: dict[int, list[TestReport]], missing: list[int]
) -> tuple[list[int], bool]:
    """Ask the ranks that did not finish for their stacks; report them as stuck or timed out.

    Last reports that arrive meanwhile still count, as in pool mode: within the grace period the
    rank finished on evidence; after the deadline it finished too late (a timeout). Returns the
    ranks still stuck and whether the late ranks' process groups survived.
    """
    game = cur.game
    abort: keys.Abort = {"reason": game.trigger or f"timeout after {game.timeout:g} s"}
    rs.channel.put(keys.abort(cur.index), abort)
    reported, stacks = _collect(rs, cur, per_rank, missing)
    return _judge(rs, cur, per_rank, missing, reported, stacks)


def _collect(
    rs: RankSession, cur: Current, per_rank: dict[int, list[TestReport]], missing: list[int]
) -> tuple[dict[int, keys.PeerReport], dict[int, keys.Stack]]:
    """What the asked ranks sent within ``DUMP_WAIT``: late last reports, or stacks (a payload
    from another process fails the test instead); a rank whose session ended, or that rank 0's
    :mod:`liveness` found gone, meanwhile is in :attr:`current.Current.stopped`."""
    channel = rs.channel
    reported: dict[int, keys.PeerReport] = {}
    stacks: dict[int, keys.Stack] = {}
    end = time.monotonic() + DUMP_WAIT
    while True:
        poll_early(rs, cur)
        for rank in missing:
            if rank in reported or rank in stacks or rank in cur.stopped:
                continue
            if channel.has(keys.report(cur.index, rank)):
                cur.reports_read += 1
                with noted(cur):
                    data = channel.take(keys.report(cur.index, rank), keys.read_peer_report)
                    if not take_foreign(rs, cur, per_rank, rank, data):
                        reported[rank] = data
            elif channel.has(keys.stack(cur.index, rank)):
                with noted(cur):
                    stack = channel.get(keys.stack(cur.index, rank), keys.read_stack)
                    if not take_foreign(rs, cur, per_rank, rank, stack):
                        stacks[rank] = stack
        told = set(reported) | set(stacks) | cur.stopped.keys()
        if told >= set(missing) or time.monotonic() >= end:
            return reported, stacks
        time.sleep(POLL_MAX)


def _judge(
    rs: RankSession,
    cur: Current,
    per_rank: dict[int, list[TestReport]],
    missing: list[int],
    reported: dict[int, keys.PeerReport],
    stacks: dict[int, keys.Stack],
) -> tuple[list[int], bool]:
    """Each asked rank's reports: late (a timeout), silent, or stuck where its stack says, with
    the collective verdict of every rank's flight records."""
    item, game = cur.item, cur.game
    nodeid, location, test_file = item.nodeid, item.location, str(item.path)
    now, wall = time.monotonic(), time.time()
    timed_out = game.failed_at is None
    # Rank 0 finished the test unless its watchdog took over from its stuck main thread.
    finished = set(range(rs.world_size)) - set(stacks) - {r for r in missing if r not in reported}
    if cur.taken_over:
        finished.discard(0)
    peers = peer_records(rs, cur, sorted(finished - {0})) if stacks else {}
    story = verdict_story(cur, stacks, test_file, finished, rs.world_size, peers)
    if story is not None:  # rank 0's own report was written before its peers' records came
        for own in per_rank.get(0, []):
            note_verdict(own, 0, story.verdict)
    gone = {r for r in missing if r in cur.stopped and r not in reported and r not in stacks}
    stuck = [rank for rank in missing if rank not in reported and rank not in gone]
    for rank in stuck:
        got = stacks.get(rank)
        line = story.lines.get(rank, "") if story else ""
        dump, records = (got["dump"], bool(got["records"])) if got else ("", False)
        cur.stuck_at[rank] = stuck_words(line, dump, records, test_file)
    healthy = all(reported[rank]["healthy"] for rank in reported)
    for rank in sorted(set(missing) - gone):  # the gone: their verdict (stopped_reports)
        log = rs.logs.get(rank, "?")
        reports = per_rank.setdefault(rank, [])
        sent = reported.get(rank) or stacks.get(rank)
        if sent is not None:
            reports.extend(rs.deserialize(d) for d in sent["reports"])
            cur.peer_warnings[rank] = sent["warnings"]
        if rank in reported:
            game.note_finished(rank)
            if timed_out:
                info = Unfinished(LATE, "", log, "stuck", game, now, LATE_REASON)
                reports.append(
                    unfinished_report(nodeid, location, test_file, rank, rs.world_size, info, wall)
                )
            continue
        if rank not in stacks:
            fill_passed(reports, nodeid, location, "call")
            reports.append(silent_report(nodeid, location, rank, rs.world_size, log, wall))
            continue
        stack = stacks[rank]
        pos = Position.in_phase(stack["when"])
        fill_passed(reports, nodeid, location, pos.when)
        if failed_itself(reports):
            continue  # its own failure is the story; it was stuck cleaning up after it
        info = Unfinished(
            pos,
            stack["dump"],
            log,
            "stuck",
            game,
            now,
            collective=story.lines.get(rank, "") if story else "",
            verdict=story.verdict if story else Verdict(),
        )
        reports.append(
            unfinished_report(nodeid, location, test_file, rank, rs.world_size, info, wall)
        )
    return stuck, healthy
