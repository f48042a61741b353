"""Launcher mode, the end of one distributed test: rank 0 gathers every rank's reports.

:func:`gather` and :func:`poll_early` run in rank 0 of a launched world: in its main thread once
its own part of the test is over, or in its watchdog thread when the main thread is stuck.
:func:`publish_early` runs in every rank, in the main thread, as soon as the rank fails or skips.

The waits mirror a spawn-mode pool's: until the deadline; or, once any rank failed or skipped,
until the failure grace is over (plus ``FINISH_WAIT`` when only ranks that failed themselves are
left, finishing their teardown). Ranks still running then are asked for their stacks (the
``abort/<test>`` key, which their watchdogs watch) and reported as stuck or timed out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.reports import TestReport

from .launch_report import Stuck, fill_passed, stuck_report
from .settings import Value

if TYPE_CHECKING:
    from .launch import LaunchPlugin

#: When only ranks that failed themselves are left, they get this long for their teardown.
FINISH_WAIT = 5.0
#: How long rank 0 waits for the stacks of ranks it declared stuck.
DUMP_WAIT = 3.0
POLL_MAX = 0.02


@dataclasses.dataclass
class Current:
    """The distributed test a rank is running, as its main thread and watchdog see it."""

    index: int
    item: pytest.Item
    started: float
    #: ``time.monotonic()`` at which the test's deadline passes; None: no deadline.
    deadline: float | None
    timeout: Value[float]
    #: The phase the main thread is in: setup, call or teardown.
    when: str = "setup"
    #: This rank's phase reports so far.
    reports: list[TestReport] = dataclasses.field(default_factory=list)
    #: When rank 0 first saw a rank fail or skip, and what it was ("rank 1 failed").
    failed_at: float | None = None
    trigger: str = ""
    failed_ranks: set[int] = dataclasses.field(default_factory=set)
    early_ranks: set[int] = dataclasses.field(default_factory=set)
    early_seen: int = 0
    #: The main thread finished its part of the test.
    done: bool = False
    #: The watchdog reports this test instead of the main thread (which is stuck).
    taken_over: bool = False
    stack_sent: bool = False


def _note_failure(cur: Current, rank: int, failed: bool) -> None:
    if failed:
        cur.failed_ranks.add(rank)
    if cur.failed_at is None:
        cur.failed_at = time.monotonic()
        cur.trigger = f"rank {rank} {'failed' if failed else 'skipped'}"


def publish_early(plugin: LaunchPlugin, cur: Current, report: TestReport) -> None:
    """This rank failed or skipped: tell rank 0 now, so that its grace period starts now."""
    first = plugin.rank not in cur.early_ranks
    cur.early_ranks.add(plugin.rank)
    _note_failure(cur, plugin.rank, report.failed)
    if plugin.rank != 0 and first and plugin.channel is not None:
        key = f"early/{cur.index}/{plugin.rank}"
        plugin.channel.put(key, {"failed": report.failed, "when": report.when})
        plugin.channel.add(f"early/{cur.index}", 1)


def poll_early(plugin: LaunchPlugin, cur: Current) -> None:
    """Rank 0: note the other ranks' early failures and skips (one counter read when none)."""
    assert plugin.channel is not None
    count = plugin.channel.add(f"early/{cur.index}", 0)
    if count == cur.early_seen:
        return
    cur.early_seen = count
    for rank in range(1, plugin.world_size):
        key = f"early/{cur.index}/{rank}"
        if rank not in cur.early_ranks and plugin.channel.has(key):
            data = plugin.channel.get(key)
            cur.early_ranks.add(rank)
            _note_failure(cur, rank, bool(data["failed"]))


def _take_report(
    plugin: LaunchPlugin, cur: Current, per_rank: dict[int, list[TestReport]], rank: int
) -> bool:
    """Read one rank's reports; return whether its process group survived the test."""
    assert plugin.channel is not None
    data = plugin.channel.take(f"report/{cur.index}/{rank}")
    reports = [plugin.deserialize(d) for d in data["reports"]]
    per_rank[rank] = reports
    for report in reports:
        if report.failed or (report.skipped and not hasattr(report, "wasxfail")):
            _note_failure(cur, rank, report.failed)
            break
    return bool(data["healthy"])


def gather(
    plugin: LaunchPlugin, cur: Current, own: list[TestReport] | None = None
) -> tuple[dict[int, list[TestReport]], list[int], bool]:
    """Every rank's reports of the test (rank 0's: ``own``, else what it made).

    Returns the reports per rank, the ranks that did not finish (reported from their stacks:
    the run cannot go on with them), and whether every peer's process group survived.
    """
    channel = plugin.channel
    assert channel is not None
    per_rank: dict[int, list[TestReport]] = {0: list(cur.reports if own is None else own)}
    pending = set(range(1, plugin.world_size))
    healthy = True
    grace = plugin.settings.failure_grace.value
    finishing = 0.0
    done_seen = 0
    delay = 0.0005
    while pending:
        done = channel.add(f"done/{cur.index}", 0)
        if done != done_seen:
            done_seen = done
            for rank in sorted(pending):
                if channel.has(f"report/{cur.index}/{rank}"):
                    healthy = _take_report(plugin, cur, per_rank, rank) and healthy
            pending -= per_rank.keys()
            delay = 0.0005
            if not pending:
                break
        poll_early(plugin, cur)
        now = time.monotonic()
        limit = cur.deadline
        if cur.failed_at is not None:
            end = cur.failed_at + grace + finishing
            limit = end if limit is None else min(limit, end)
        if limit is not None and now >= limit:
            if cur.failed_at is not None and not finishing and pending <= cur.failed_ranks:
                finishing = FINISH_WAIT  # only ranks that failed themselves are left
                continue
            break
        time.sleep(delay)
        delay = min(delay * 2, POLL_MAX)
    stuck = sorted(pending)
    if stuck:
        _conclude(plugin, cur, per_rank, stuck)
    return per_rank, stuck, healthy


def _conclude(
    plugin: LaunchPlugin, cur: Current, per_rank: dict[int, list[TestReport]], stuck: list[int]
) -> None:
    """Ask the ranks that did not finish for their stacks; report them as stuck or timed out."""
    channel = plugin.channel
    assert channel is not None
    why = cur.trigger or f"timeout after {cur.timeout.value:g} s"
    channel.put(f"abort/{cur.index}", {"reason": why})
    answers: dict[int, dict[str, Any]] = {}
    end = time.monotonic() + DUMP_WAIT
    while True:
        for rank in stuck:
            if rank in answers:
                continue
            if channel.has(f"report/{cur.index}/{rank}"):
                answers[rank] = {"report": channel.take(f"report/{cur.index}/{rank}")}
            elif channel.has(f"stack/{cur.index}/{rank}"):
                answers[rank] = {"stack": channel.get(f"stack/{cur.index}/{rank}")}
        if len(answers) == len(stuck) or time.monotonic() >= end:
            break
        time.sleep(POLL_MAX)
    item = cur.item
    now, wall = time.monotonic(), time.time()
    for rank in stuck:
        answer = answers.get(rank, {})
        if "report" in answer:
            per_rank[rank] = [plugin.deserialize(d) for d in answer["report"]["reports"]]
            continue
        stack = answer.get("stack") or {}
        reports = [plugin.deserialize(d) for d in stack.get("reports", [])]
        if any(r.failed for r in reports):
            per_rank[rank] = reports  # its own failure is the story; it was stuck cleaning up
            continue
        when = str(stack.get("when", "call"))
        fill_passed(reports, item.nodeid, item.location, when)
        info = Stuck(
            when=when,
            dump=str(stack.get("dump", "")),
            log=plugin.logs.get(rank, "?"),
            after_failure=None if cur.failed_at is None else now - cur.failed_at,
            trigger=cur.trigger,
            timeout=cur.timeout.value,
            timeout_source=cur.timeout.source,
        )
        reports.append(
            stuck_report(
                item.nodeid, item.location, str(item.path), rank, plugin.world_size, info, wall
            )
        )
        per_rank[rank] = reports
