"""Launcher mode: running the tests of sub-worlds, several at once (see :mod:`subworld`).

Runs in every rank of a launched world, in the main thread of :class:`plugin.LaunchPlugin` (and
:func:`end_stuck` in the watchdog thread, when the rank 0 of a test, of the launched world or of
a sub-world, is stuck in it: it ends the run from there).

A batch of sub-world tests runs at once, one test per sub-world. Every member waits for rank
0's verdict on the test before the batch, then runs its test in its sub-world's process group
(:meth:`group.GroupKeeper.ensure`). The sub-world's rank 0 gathers its peers' reports exactly as
the launched rank 0 gathers a test of every rank (:func:`gather.gather` on the rank's
:meth:`session.RankSession.view`: failure grace, deadline, stacks, proven deadlocks), and sends
them to the launched rank 0 (``world/<test>``, sealed like every payload); the launched rank 0
runs the first sub-world of each batch itself (when it is in one), then merges and logs each
other test of the batch as its result comes (:func:`replay`), naming its ranks in both
numberings. A sub-world that fails ends only its own test; one that leaves a rank stuck ends the
run after its batch (a rank stuck in a collective cannot be interrupted).

Ranks in no sub-world of a batch wait for the verdict before their next test: running the next
batch's test early would need its sub-world's other members, which are still in this batch.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

import pytest
from pytest import TestReport

from .. import _compat
from ..outcome.checks import sequences_in_step
from ..outcome.endgame import DUMP_WAIT
from ..outcome.records import WarningRecord
from ..outcome.reports import fill_passed, silent_report
from ..rank.groupstate import sequence_numbers
from ..settings import Settings, item_timeout
from . import keys
from .channel import ChannelError, Forged
from .current import Current
from .deadwatch import Judge
from .gather import gather, left_stuck, stopped_reports, stopped_serving, warnings_of
from .group import GroupKeeper
from .liveness import LEAVING, beat
from .plan import Step
from .session import RankSession, park
from .subworld import lost_result, unaccounted


class LaunchPlugin(Protocol):
    """What this module uses of :class:`plugin.LaunchPlugin` (a protocol: no import cycle)."""

    rs: RankSession
    settings: Settings
    group: GroupKeeper
    steps: tuple[Step, ...]
    items: list[pytest.Item]
    current: Current | None
    ended: str | None
    ended_batch: int
    aborted: bool
    index: int
    distributed_tests: int
    config: pytest.Config
    session: pytest.Session | None

    def start_test(self, item: pytest.Item, index: int) -> Current: ...

    def run_here(self, cur: Current) -> bool: ...

    def finish(
        self,
        item: pytest.Item,
        per_rank: dict[int, list[TestReport]],
        warned: dict[int, list[WarningRecord]],
    ) -> list[TestReport]: ...

    def log_not_run_after(self, index: int, reason: str) -> None: ...


#: Rank 0 waits for a sub-world's result this long past the test's deadline and failure grace
#: (the sub-world's rank 0 asks for stacks and sends what it has within ``DUMP_WAIT``).
RESULT_SLACK = 30.0


def batch_start(steps: tuple[Step, ...], index: int) -> int:
    """The first test of the batch of test ``index`` (``index`` itself outside a batch)."""
    world = steps[index].world
    while world is not None and index > 0:
        before = steps[index - 1].world
        if before is None or before.batch != world.batch:
            break
        index -= 1
    return index


def latest_sub(steps: tuple[Step, ...], index: int) -> int | None:
    """The latest sub-world test before test ``index`` (None: none): the launched world's group
    is created anew after it on every rank (:meth:`group.GroupKeeper.ensure`)."""
    for before in range(index - 1, -1, -1):
        if steps[before].kind == "sub":
            return before
    return None


def same_batch(plugin: LaunchPlugin, index: int) -> bool:
    """Rank 0: is test ``index`` of the batch in which the run ended (it ran: report it)?"""
    world = plugin.steps[index].world
    return world is not None and world.batch == plugin.ended_batch


def in_step(plugin: LaunchPlugin, cur: Current) -> bool:
    """After a sub-world's test that every member finished with its group intact: did each
    group's sequence number grow alike on every member? (A sub-world's members run the same
    tests since its group was created, so their sequence numbers match.) When not, every group
    is created anew before the next test; unlike the launched world's tests, no rank is blamed."""
    if sequences_in_step(cur.sequences, {}):
        return True
    plugin.group.notes.append(
        f"process groups created anew after {cur.item.nodeid}: the sequence numbers of its "
        "sub-world's group differ between its ranks (point-to-point ops, or a collective only "
        "some ranks issued)"
    )
    return False


def why_ended(cur: Current, stuck: list[int]) -> str | None:
    """Why the launched world cannot go on after ``cur`` (None: it can), ranks named as the
    launched world numbers them."""
    if stuck or cur.stopped:
        if cur.stopped:
            return stopped_serving(cur)
        return left_stuck(cur, stuck)
    if cur.forged:
        return next(iter(cur.forged.values())).ends_run(cur.item.nodeid)
    return None


def end_run(plugin: LaunchPlugin, index: int, ended: str) -> None:
    """Rank 0: the run ends after test ``index`` (after its batch, for a sub-world's test)."""
    plugin.ended = plugin.ended or ended
    world = plugin.steps[index].world
    if world is not None:
        plugin.ended_batch = world.batch


def run_leader(plugin: LaunchPlugin, item: pytest.Item, index: int) -> None:
    """A sub-world's rank 0 (not the launched rank 0): run the test, gather its peers' reports
    and send them to the launched rank 0."""
    rs = plugin.rs
    cur = plugin.start_test(item, index)
    assert cur.view is not None
    fine = plugin.run_here(cur)
    with rs.lock:
        cur.done = True
        taken = cur.taken_over
    if taken:
        park()  # the watchdog sends the result and leaves with rank 0's exit code
    healthy = fine and plugin.group.healthy()
    sequence = sequence_numbers() if healthy else {}
    look = Judge(cur.view, cur).look if cur.end_deadlocks else None
    per_rank, stuck, peers_healthy = gather(cur.view, cur, look=look)
    if healthy and peers_healthy and not stuck:
        cur.sequences[0] = sequence
        healthy = sequences_in_step(cur.sequences, {})
    _send(plugin, cur, per_rank, why_ended(cur, stuck) or "", healthy and peers_healthy)
    plugin.group.last_index, plugin.group.last_rank = -1, 0
    plugin.current = None
    outcomes = ", ".join(f"{r.when} {r.outcome}" for r in cur.reports)
    rs.log(f"{item.nodeid}: {outcomes} (rank 0 of ranks {list(cur.view.members)})")


def leader_stuck(plugin: LaunchPlugin, cur: Current, own: list[TestReport]) -> int:
    """A sub-world's rank 0 (not the launched rank 0) is stuck in ``cur`` (its watchdog calls
    this): send the sub-world's result, then wait for rank 0's exit code and return it."""
    rs = plugin.rs
    per_rank, stuck, _ = gather(cur.view or rs, cur, own)
    ended = why_ended(cur, [0, *stuck]) or "a sub-world's rank 0 was left stuck"
    _send(plugin, cur, per_rank, ended, False)
    plugin.current = None
    with contextlib.suppress(ChannelError):
        beat(rs, cur, -1, LEAVING)  # no more signs of life from this watchdog (liveness.py)
    rs.log(f"distrank: {rs.launch.label()}: stuck in {cur.item.nodeid}; waiting for rank 0's end")
    try:
        found = rs.channel.wait_any([keys.EXIT], time.monotonic() + RESULT_SLACK * 4, True)
        return rs.channel.get(keys.EXIT, keys.read_exit) if found else 3
    except ChannelError:
        return 3


def _send(
    plugin: LaunchPlugin,
    cur: Current,
    per_rank: dict[int, list[TestReport]],
    ended: str,
    healthy: bool,
) -> None:
    rs = plugin.rs
    payload: keys.SubResult = {
        "reports": {str(r): [rs.serialize(x) for x in got] for r, got in per_rank.items()},
        "warnings": {str(r): got for r, got in warnings_of(cur).items()},
        "ended": ended,
        "healthy": healthy,
        **keys.identity(cur.index, cur.item.nodeid),
    }
    rs.channel.put(keys.world(cur.index), payload)


def replay(plugin: LaunchPlugin, item: pytest.Item, index: int) -> None:
    """Launched rank 0: log the test of another sub-world of the batch, from what its rank 0
    sent (a failure naming that rank when nothing came in time)."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    plugin.distributed_tests += 1
    try:
        timeout = item_timeout(item, plugin.settings.timeout).value
    except ValueError:
        timeout = plugin.settings.timeout.value
    wait = timeout + plugin.settings.failure_grace.value + DUMP_WAIT + RESULT_SLACK
    per_rank, warned, ended, healthy = _result(plugin, item, index, wait)
    for report in plugin.finish(item, per_rank, warned):
        ihook.pytest_runtest_logreport(report=report)
    if not healthy:
        plugin.group.gen += 1  # every rank creates its groups anew before the next test
    if ended:
        plugin.aborted = True
        end_run(plugin, index, ended)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _result(
    plugin: LaunchPlugin, item: pytest.Item, index: int, wait: float
) -> tuple[dict[int, list[TestReport]], dict[int, list[WarningRecord]], str, bool]:
    """What the sub-world's rank 0 sent for test ``index`` (per-rank reports, warnings, why the
    run ends, whether its groups are in step), or a failure saying why nothing usable came."""
    rs = plugin.rs
    world = plugin.steps[index].world
    assert world is not None
    leader = world.members[0]
    key = keys.world(index)
    now = time.time()
    try:
        found = rs.channel.wait_any([key, keys.fatal(leader)], time.monotonic() + wait)
        if found == keys.fatal(leader) and not rs.channel.has(key):
            return _leader_stopped(plugin, item, index)
        if found is None:
            log = rs.logs.get(leader, "?")
            reports = [silent_report(item.nodeid, item.location, 0, world.size, log, now)]
            fill_passed(reports, item.nodeid, item.location, "call")
            why = (
                f"{item.nodeid}: the rank 0 of its sub-world (launched rank {leader}) sent nothing"
            )
            return {0: reports}, {}, why, False
        data = rs.channel.take(key, keys.read_sub_result)
    except Forged as exc:
        crash = f"control store tampered with: {exc}"
        lost = lost_result(item.nodeid, item.location, world.size, crash, "", now)
        return lost, {}, exc.ends_run(item.nodeid), False
    pid = rs.pids[leader] if leader < len(rs.pids) else 0
    if (data["pid"], data["index"], data["nodeid"]) != (pid, index, item.nodeid):
        crash = (
            f"the result of its sub-world came from pid {data['pid']} for test {data['index']} "
            f"({data['nodeid']}), not from launched rank {leader} (pid {pid}) for this test"
        )
        return lost_result(item.nodeid, item.location, world.size, crash, "", now), {}, "", False
    per_rank = {int(r): [rs.deserialize(d) for d in got] for r, got in data["reports"].items()}
    missing = unaccounted(per_rank, world.size)
    if missing is not None:  # never a test that vanishes, nor one that passes on what is missing
        crash = f"the launched rank 0 cannot account for this test: {missing}"
        more = "Its sub-world's result was lost or forged on the way: the test fails."
        lost = lost_result(item.nodeid, item.location, world.size, crash, more, now)
        return lost, {}, data["ended"], False
    warned = {int(r): list(got) for r, got in data["warnings"].items()}
    return per_rank, warned, data["ended"], data["healthy"]


def _leader_stopped(
    plugin: LaunchPlugin, item: pytest.Item, index: int
) -> tuple[dict[int, list[TestReport]], dict[int, list[WarningRecord]], str, bool]:
    """What is known of test ``index`` when its sub-world's rank 0 stopped serving
    (``pytest.exit()``, ``KeyboardInterrupt``) before it sent the result: its own reports and
    how its session ended; the run ends (its peers' reports went with it)."""
    rs = plugin.rs
    world = plugin.steps[index].world
    assert world is not None
    cur = Current.begin(index, item, world.size, plugin.settings.timeout, 0.0)
    cur.view = rs.view(world.members)
    data = rs.channel.get(keys.fatal(world.members[0]), keys.read_fatal)
    cur.stopped[0] = data
    reports = stopped_reports(cur.view, cur, 0, data)
    return {0: reports}, {}, stopped_serving(cur), False


def replay_batch_rest(plugin: LaunchPlugin, index: int) -> int:
    """Launched rank 0, stuck in test ``index`` of a batch (its watchdog calls this): log the
    batch's other tests, which ran at once; return the index of the batch's last test."""
    steps, items = plugin.steps, plugin.items
    world = steps[index].world
    last = index
    while world is not None and last + 1 < len(steps):
        later = steps[last + 1].world
        if later is None or later.batch != world.batch:
            break
        last += 1
        plugin.index = last
        replay(plugin, items[last], last)
    return last


def stopping(plugin: LaunchPlugin, index: int) -> None:
    """Launched rank 0, after test ``index``: when ``-x``, ``--maxfail`` or a stop ends pytest's
    loop after it, report the other tests of its batch first: they ran at once."""
    session = plugin.session
    stop = session is not None and (session.shouldfail or session.shouldstop)
    if stop and plugin.steps[index].kind == "sub":
        replay_batch_rest(plugin, index)


def end_stuck(plugin: LaunchPlugin, cur: Current, own: list[TestReport]) -> int:
    """The main thread of the test's rank 0 is stuck in ``cur`` (the watchdog thread calls
    this). A sub-world's rank 0 that is not the launched rank 0 sends its sub-world's result
    (:func:`leader_stuck`). The launched rank 0 reports the test with its ``own`` reports, the
    other tests of its batch as their sub-worlds send them, the remaining tests as not run, and
    ends the session as pytest does after its test loop (summary, junitxml, unconfigure).
    Returns the exit code.

    Fixture teardown is skipped: fixtures set up for the stuck test may themselves wait on
    the stuck group, and the main thread is still inside the test.
    """
    if plugin.rs.rank != 0:
        return leader_stuck(plugin, cur, own)
    per_rank, stuck, _ = gather(cur.view or plugin.rs, cur, own)
    merged = plugin.finish(cur.item, per_rank, warnings_of(cur))
    plugin.aborted = True
    plugin.ended = why_ended(cur, [0, *stuck]) or "rank 0 was left stuck"
    plugin.current = None
    ihook = cur.item.ihook
    for report in merged:
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=cur.item.nodeid, location=cur.item.location)
    plugin.log_not_run_after(replay_batch_rest(plugin, cur.index), plugin.ended)
    session = plugin.session
    assert session is not None
    code = pytest.ExitCode.TESTS_FAILED if session.testsfailed else pytest.ExitCode.OK
    session.exitstatus = code
    _compat.forget_setup_stack(session)
    plugin.config.hook.pytest_sessionfinish(session=session, exitstatus=code)
    with contextlib.suppress(Exception):
        _compat.ensure_unconfigure(plugin.config)
    return int(session.exitstatus)
