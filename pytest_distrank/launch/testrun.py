"""Launcher mode: one rank's part of a test it runs with its peers, and what it does after.

Runs in every rank of a launched world, in the main thread of :class:`plugin.LaunchPlugin`
(:meth:`~plugin.LaunchPlugin.pytest_runtest_protocol` calls it). The launched rank 0 runs its part
of a test (of the launched world, or of the first sub-world of a batch), then gathers its peers'
reports (:func:`gather.gather`), checks that their groups are in step and logs one report per
phase (:func:`run_rank0`); any other rank runs its part and sends its reports to its world's
rank 0 (:func:`run_peer`). A sub-world's rank 0 that is not the launched rank 0 runs
:func:`subrun.run_leader` instead. When the watchdog took the test over (its main thread was
stuck), the main thread parks here: the watchdog ends the process.
"""

from __future__ import annotations

from typing import TextIO, cast

import pytest

from .. import _compat
from ..rank.groupstate import sequence_numbers
from . import keys, subrun
from .deadwatch import Judge
from .early import warning_records
from .gather import gather, warnings_of
from .session import park
from .subrun import LaunchPlugin


def run_rank0(plugin: LaunchPlugin, item: pytest.Item, index: int) -> None:
    """The launched rank 0: run the test, gather its peers' reports (its sub-world's, when the
    test is a sub-world's), check that the group is in step, and log one report per phase."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    cur = plugin.start_test(item, index)
    group = plugin.group
    inits = group.inits
    fine = plugin.run_here(cur)
    with plugin.rs.lock:
        cur.done = True
        taken = cur.taken_over
    if taken:
        park()  # the watchdog reports this test and ends the run; it exits the process
    healthy = fine and group.healthy()
    sequence = sequence_numbers() if healthy else {}
    view = cur.view or plugin.rs
    look = Judge(view, cur).look if cur.end_deadlocks else None
    per_rank, stuck, peers_healthy = gather(view, cur, look=look)
    if group.inits != inits:
        group.sequence_base = {}  # a new group: its sequence numbers start from 0
    if healthy and peers_healthy and not stuck:
        cur.sequences[0] = sequence
        if cur.view is None:
            healthy = group.check_collectives(cur, per_rank)
        else:
            healthy = subrun.in_step(plugin, cur)
    if not (healthy and peers_healthy):
        group.gen += 1  # every rank re-initialises its group before the next test
    merged = plugin.finish(item, per_rank, warnings_of(cur))
    plugin.current = None
    for report in merged:
        ihook.pytest_runtest_logreport(report=report)
    ended = subrun.why_ended(cur, stuck)
    if ended is not None:
        plugin.aborted = plugin.aborted or bool(stuck or cur.stopped)
        subrun.end_run(plugin, index, ended)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def run_peer(plugin: LaunchPlugin, item: pytest.Item, index: int) -> None:
    """A rank that is not its world's rank 0: run the test, send its reports to that rank 0."""
    rs = plugin.rs
    cur = plugin.start_test(item, index)
    fine = plugin.run_here(cur)
    with rs.lock:
        cur.done = True
        taken = cur.taken_over
    if taken:
        park()  # the watchdog is leaving with rank 0's exit code
    healthy = fine and plugin.group.healthy()
    rank = cur.view.rank if cur.view is not None else plugin.rs.rank
    payload: keys.PeerReport = {
        "reports": [rs.serialize(r) for r in cur.reports],
        "healthy": healthy,
        "warnings": warning_records(cur.caught),
        "sequence": sequence_numbers() if healthy else {},
        **keys.identity(index, item.nodeid),
    }
    rs.channel.put(keys.report(index, rank), payload)
    rs.channel.add(keys.done_count(index), 1)
    plugin.group.last_index, plugin.group.last_rank = index, rank
    plugin.group.last_started_ns = cur.started_ns
    plugin.current = None
    rs.log(f"{item.nodeid}: " + ", ".join(f"{r.when} {r.outcome}" for r in cur.reports))
    for report in cur.reports:
        if report.failed and rs.log_stream is not None:
            report.toterminal(_compat.terminal_writer(cast(TextIO, rs.log_stream)))
