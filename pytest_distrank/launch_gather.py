"""Launcher mode, the end of one distributed test: rank 0 gathers every rank's reports.

:func:`gather`, :func:`poll_early` and :func:`poll_finished` run in rank 0 of a launched world:
in its main thread once its own part of the test is over, or in its watchdog thread (which also
polls while the main thread is in the test, and gathers when the main thread is stuck).
:func:`publish_early` runs in every rank, in the main thread, as soon as the rank fails or skips.

When to stop waiting is :class:`endgame.Endgame`'s rule, the same as pool mode's: a rank finished
only when its last reports arrived; waiting ends at the deadline or when the failure grace is
over (plus ``FINISH_WAIT`` when only ranks that failed themselves are left). Ranks still running
then are asked for their stacks (the ``abort/<test>`` key, which their watchdogs watch) and
reported by :func:`endgame.unfinished_report` as stuck (they are left running) or timed out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.reports import TestReport

from .endgame import (
    DUMP_WAIT,
    LATE,
    LATE_REASON,
    Endgame,
    Position,
    Unfinished,
    failed_itself,
    fill_passed,
    grace_trigger,
    unfinished_report,
)
from .launch_channel import POLL_MAX
from .launch_report import silent_report
from .settings import Value

if TYPE_CHECKING:
    from .launch import LaunchPlugin


@dataclasses.dataclass
class Current:
    """The distributed test a rank is running, as its main thread and watchdog see it."""

    index: int
    item: pytest.Item
    #: The end of the test: its deadline (every rank) and, on rank 0, who failed or finished.
    game: Endgame
    #: The phase the main thread is in: setup, call or teardown.
    when: str = "setup"
    #: This rank's phase reports so far.
    reports: list[TestReport] = dataclasses.field(default_factory=list)
    early_ranks: set[int] = dataclasses.field(default_factory=set)
    early_seen: int = 0
    #: Rank 0's watchdog: the ``done/<test>`` count it last looked at.
    done_seen: int = 0
    #: The main thread finished its part of the test.
    done: bool = False
    #: The watchdog reports this test instead of the main thread (which is stuck).
    taken_over: bool = False
    stack_sent: bool = False

    @classmethod
    def begin(
        cls, index: int, item: pytest.Item, world_size: int, timeout: Value[float], grace: float
    ) -> Current:
        """The test starts now, with its timeout (and where it came from) and the failure grace."""
        game = Endgame(
            frozenset(range(world_size)),
            time.monotonic(),
            timeout.value,
            grace,
            timeout_source=timeout.source,
        )
        return cls(index, item, game)


def publish_early(plugin: LaunchPlugin, cur: Current, report: TestReport) -> None:
    """This rank failed or skipped: tell rank 0 now, so that its grace period starts now.

    A subtest, an xfail or a pass starts no grace (:func:`endgame.grace_trigger`): nothing to say.
    """
    kind = grace_trigger(report)
    if kind is None:
        return
    first = plugin.rank not in cur.early_ranks
    cur.early_ranks.add(plugin.rank)
    cur.game.note_trigger(plugin.rank, kind, time.monotonic())
    if plugin.rank != 0 and first and plugin.channel is not None:
        key = f"early/{cur.index}/{plugin.rank}"
        plugin.channel.put(key, {"kind": kind, "when": report.when})
        plugin.channel.add(f"early/{cur.index}", 1)


def poll_early(plugin: LaunchPlugin, cur: Current) -> None:
    """Rank 0: note the other ranks' early failures and skips (one counter read when none)."""
    assert plugin.channel is not None
    count = plugin.channel.add(f"early/{cur.index}", 0)
    if count == cur.early_seen:
        return
    cur.early_seen = count
    now = time.monotonic()
    for rank in range(1, plugin.world_size):
        key = f"early/{cur.index}/{rank}"
        if rank not in cur.early_ranks and plugin.channel.has(key):
            data = plugin.channel.get(key)
            cur.early_ranks.add(rank)
            cur.game.note_trigger(rank, str(data["kind"]), now)


def poll_finished(plugin: LaunchPlugin, cur: Current) -> None:
    """Rank 0's watchdog: note the peers whose last reports are waiting in the store (one
    counter read when none is new). They stay there for :func:`gather` to take."""
    assert plugin.channel is not None
    count = plugin.channel.add(f"done/{cur.index}", 0)
    if count == cur.done_seen:
        return
    cur.done_seen = count
    for rank in sorted(cur.game.pending - {0}):
        if plugin.channel.has(f"report/{cur.index}/{rank}"):
            cur.game.note_finished(rank)


def _take_report(
    plugin: LaunchPlugin, cur: Current, per_rank: dict[int, list[TestReport]], rank: int
) -> bool:
    """Read one rank's last reports; return whether its process group survived the test."""
    assert plugin.channel is not None
    data = plugin.channel.take(f"report/{cur.index}/{rank}")
    reports = [plugin.deserialize(d) for d in data["reports"]]
    per_rank[rank] = reports
    cur.game.note_reports(rank, reports, time.monotonic())
    cur.game.note_finished(rank)
    return bool(data["healthy"])


def gather(
    plugin: LaunchPlugin, cur: Current, own: list[TestReport] | None = None
) -> tuple[dict[int, list[TestReport]], list[int], bool]:
    """Every rank's reports of the test (rank 0's: ``own``, else what it made).

    Without ``own`` the main thread calls it, its part of the test over: rank 0 has finished on
    evidence (its reports are in hand). With ``own`` (the watchdog's, synthesized while the main
    thread is stuck) rank 0 stays pending. Returns the reports per rank, the ranks that did not
    finish (reported from their stacks: the run cannot go on with them), and whether every
    peer's process group survived.
    """
    channel = plugin.channel
    assert channel is not None
    game = cur.game
    if own is None:
        game.note_finished(0)
    per_rank: dict[int, list[TestReport]] = {0: list(cur.reports if own is None else own)}
    missing = set(range(1, plugin.world_size))
    healthy = True
    done_seen = 0
    delay = 0.0005
    while missing:
        done = channel.add(f"done/{cur.index}", 0)
        if done != done_seen:
            done_seen = done
            for rank in sorted(missing):
                if channel.has(f"report/{cur.index}/{rank}"):
                    healthy = _take_report(plugin, cur, per_rank, rank) and healthy
            missing -= per_rank.keys()
            delay = 0.0005
            if not missing:
                break
        poll_early(plugin, cur)
        if game.expired(time.monotonic()):
            break
        time.sleep(delay)
        delay = min(delay * 2, POLL_MAX)
    stuck: list[int] = []
    if missing:
        stuck, late_healthy = _conclude(plugin, cur, per_rank, sorted(missing))
        healthy = healthy and late_healthy
    return per_rank, stuck, healthy


def left_stuck(cur: Current, ranks: list[int]) -> str:
    """Why the run ends after ``cur`` left ``ranks`` stuck (the remaining tests' skip reason)."""
    names = ", ".join(str(r) for r in ranks)
    return (
        f"{cur.item.nodeid} left rank(s) {names} stuck ({cur.game.trigger or 'timeout'}); a rank "
        "stuck in a collective cannot be interrupted, so the launched world stops here"
    )


def _conclude(
    plugin: LaunchPlugin, cur: Current, per_rank: dict[int, list[TestReport]], missing: list[int]
) -> tuple[list[int], bool]:
    """Ask the ranks that did not finish for their stacks; report them as stuck or timed out.

    Last reports that arrive meanwhile still count, as in pool mode: within the grace period the
    rank finished on evidence; after the deadline it finished too late (a timeout). Returns the
    ranks still stuck and whether the late ranks' process groups survived.
    """
    channel = plugin.channel
    assert channel is not None
    game = cur.game
    why = game.trigger or f"timeout after {game.timeout:g} s"
    channel.put(f"abort/{cur.index}", {"reason": why})
    answers: dict[int, dict[str, Any]] = {}
    end = time.monotonic() + DUMP_WAIT
    while True:
        for rank in missing:
            if rank in answers:
                continue
            if channel.has(f"report/{cur.index}/{rank}"):
                answers[rank] = {"report": channel.take(f"report/{cur.index}/{rank}")}
            elif channel.has(f"stack/{cur.index}/{rank}"):
                answers[rank] = {"stack": channel.get(f"stack/{cur.index}/{rank}")}
        if len(answers) == len(missing) or time.monotonic() >= end:
            break
        time.sleep(POLL_MAX)
    item = cur.item
    nodeid, location, test_file = item.nodeid, item.location, str(item.path)
    now, wall = time.monotonic(), time.time()
    timed_out = game.failed_at is None
    stuck: list[int] = []
    healthy = True
    for rank in missing:
        answer = answers.get(rank, {})
        log = plugin.logs.get(rank, "?")
        if "report" in answer:
            game.note_finished(rank)
            reports = [plugin.deserialize(d) for d in answer["report"]["reports"]]
            healthy = healthy and bool(answer["report"]["healthy"])
            per_rank[rank] = reports
            if timed_out:
                info = Unfinished(LATE, "", log, "stuck", game, now, LATE_REASON)
                rep = unfinished_report(
                    nodeid, location, test_file, rank, plugin.world_size, info, wall
                )
                reports.append(rep)
            continue
        stuck.append(rank)
        if "stack" not in answer:
            reports = []
            fill_passed(reports, nodeid, location, "call")
            reports.append(silent_report(nodeid, location, rank, plugin.world_size, log, wall))
            per_rank[rank] = reports
            continue
        stack = answer["stack"]
        reports = [plugin.deserialize(d) for d in stack.get("reports", [])]
        pos = Position.in_phase(str(stack.get("when", "call")))
        fill_passed(reports, nodeid, location, pos.when)
        per_rank[rank] = reports
        if failed_itself(reports):
            continue  # its own failure is the story; it was stuck cleaning up after it
        info = Unfinished(pos, str(stack.get("dump", "")), log, "stuck", game, now)
        reports.append(
            unfinished_report(nodeid, location, test_file, rank, plugin.world_size, info, wall)
        )
    return stuck, healthy
