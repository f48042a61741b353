"""Launcher mode, the rank's own side: its process group, and its reports on the wire.

Runs in every rank of a launched world, in the main thread (serialization also in the watchdog).
The default process group is initialised over the control store's ``data`` connection, in a key
space of its own per initialisation: once before the first distributed test, again when a test
asks for another backend, and again on every rank when a test left any rank's group destroyed or
replaced, or out of step (rank 0's verdict carries a generation number that says so). The
fixtures read ``config.stash[RANK_CONTEXT]``, exactly as in spawn-mode ranks.

Also what a rank says about itself after a test, as pool mode's ranks do (:mod:`worker`): who
sent a payload (pid at send time, test index and node id: :func:`identity`), the processes the
test forked that still run the rank's code (:func:`end_forks`; such a process that comes back
into the rank's code leaves at once, :func:`leave_if_fork`), the test's warnings, why its pytest
session ended (:func:`interruption`), and its groups' sequence numbers and, when rank 0 asks
because they disagree, its collective counts (:func:`answer_count`). :func:`leave_if_fork` runs in
the process a test forked; :func:`check_collectives` and :func:`count_collectives` in rank 0's
main thread, once its test is gathered.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
import traceback
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest
from pytest import TestReport

from .. import _compat
from .. import fixtures as fixtures_module
from ..context import RANK_CONTEXT, RankContext
from ..fitness import sequences_in_step, unmatched_collectives
from ..rankside import cap_section, group_words, live_groups, stray_forks
from ..records import RunTest, WarningRecord
from ..warnings_relay import warning_record
from .channel import ChannelError
from .report import FRESH_GROUP, relabel

if TYPE_CHECKING:
    from .gather import Current
    from .plugin import LaunchPlugin

#: Captured sections longer than this are cut before they travel to rank 0.
#: Bound on a forked process's own connection to the control store, and on what it sends there.
FORK_CONNECT = 10.0
#: Bound on reaping a forked process after SIGKILL.
REAP_WAIT = 2.0
#: Bound on the other ranks' answers when rank 0 asks for their collective counts.
COUNT_WAIT = 10.0


def group_healthy(plugin: LaunchPlugin) -> bool:
    """Is the default group still the one this rank initialised?"""
    import torch.distributed as dist

    ctx = plugin.ctx
    return ctx is not None and dist.is_initialized() and dist.group.WORLD is ctx.pg


def ensure_group(plugin: LaunchPlugin, backend: str) -> None:
    """Initialise the default group for this backend and generation, unless it is up already."""
    import torch.distributed as dist

    key = (backend, plugin.gen)
    if plugin.group_key == key and group_healthy(plugin):
        return
    assert plugin.channel is not None and plugin.session is not None
    first = plugin.ctx is None
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    device_id = None
    local_rank = plugin.launch.local_rank
    if "nccl" in backend:
        import torch

        torch.cuda.set_device(local_rank)
        device_id = torch.device("cuda", local_rank)
    plugin.inits += 1
    plugin.group_key = None
    dist.init_process_group(
        backend,
        store=plugin.channel.pg_store(plugin.inits),
        rank=plugin.rank,
        world_size=plugin.world_size,
        device_id=device_id,
    )
    plugin.ctx = RankContext(
        plugin.rank,
        plugin.world_size,
        local_rank,
        backend,
        plugin.channel.user_store,
        dist.group.WORLD,
    )
    plugin.flight_mark = flight_mark()
    plugin.config.stash[RANK_CONTEXT] = plugin.ctx
    if not first:
        _reset_group_fixtures(plugin, plugin.session)
    plugin.config.hook.pytest_distrank_rank_setup(
        config=plugin.config, rank=plugin.rank, world_size=plugin.world_size
    )
    plugin.group_key = key


def _reset_group_fixtures(plugin: LaunchPlugin, session: pytest.Session) -> None:
    """The session-scoped ``pg``, ``backend`` and ``device`` hold the old group: finish them (and
    the user's fixtures that depend on them), so that the next test gets the new one."""
    for name in ("pg", "backend", "device"):
        for fixturedef in _compat.session_fixturedefs(session, name):
            if getattr(fixturedef.func, "__module__", None) != fixtures_module.__name__:
                continue
            try:
                _compat.finish_fixture(fixturedef, session)
            except BaseException:
                plugin.log(
                    f"distrank: {plugin.launch.label()}: error tearing down fixtures that "
                    f"depend on {name!r} after the process group was replaced:\n"
                    + traceback.format_exc()
                )


def serialize(config: pytest.Config, report: TestReport) -> dict[str, Any]:
    """pytest's own serialization (as pytest-xdist ships reports), huge sections cut."""
    report.sections = [(title, cap_section(content)) for title, content in report.sections]
    data: dict[str, Any] = config.hook.pytest_report_to_serializable(config=config, report=report)
    return data


def deserialize(config: pytest.Config, data: dict[str, Any]) -> TestReport:
    """The inverse of :func:`serialize`, after a trip through JSON (which makes tuples lists:
    a skip's ``longrepr`` must be a tuple again)."""
    for key in ("longrepr", "location"):
        if isinstance(data.get(key), list):
            data[key] = tuple(data[key])
    data["user_properties"] = [tuple(p) for p in data.get("user_properties", [])]
    report = config.hook.pytest_report_from_serializable(config=config, data=data)
    assert isinstance(report, TestReport)
    return report


# -- what a rank says about itself -------------------------------------------------------------


def identity(index: int, nodeid: str) -> dict[str, Any]:
    """Who sends a payload: the pid at send time (a process the test forked has another), and
    the test it belongs to. Rank 0 credits it to no other test and no other process."""
    return {"pid": os.getpid(), "index": index, "nodeid": nodeid}


def leave_if_fork(plugin: LaunchPlugin, index: int, nodeid: str) -> None:
    """In a process the test forked that came back into the rank's code: say so, and leave.

    It must not run the rank's next steps (its reports, the next test's collectives on the
    rank's group, the rank's control connection): it sends its identity over a connection of its
    own (``stray/<test>/<rank>``, which rank 0 reads after the test and fails it with), then
    ``os._exit(0)`` without the rank's cleanup. No-op in the rank process itself.
    """
    if os.getpid() == plugin.pid:
        return
    with contextlib.suppress(BaseException):
        assert plugin.channel is not None
        channel = plugin.channel.for_fork(FORK_CONNECT)
        channel.put(f"stray/{index}/{plugin.rank}", identity(index, nodeid))
        channel.add(f"stray/{index}", 1)
    os._exit(0)


def end_forks(plugin: LaunchPlugin) -> tuple[int, ...]:
    """Processes the test forked that still run the rank's own code: found, killed, reaped.

    Looked for only when the test forked (``os.register_at_fork``). Such a process would run the
    rest of the test again, and its collectives would go through the rank's own group.
    """
    if not plugin.forks:
        return ()
    plugin.forks = 0
    found = stray_forks(plugin.pid)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + REAP_WAIT
    for pid in found:
        while time.monotonic() < end:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.01)
    return found


def warning_records(caught: Iterable[warnings.WarningMessage]) -> list[WarningRecord]:
    """The test's warnings, as they travel to rank 0 (``merge.merge_warnings``' records)."""
    return [warning_record(w) for w in list(caught)]


# -- unmatched collectives: the second round (rank 0 asks only when sequence numbers differ) ---


def wait_answering(plugin: LaunchPlugin, keys: list[str]) -> str:
    """Ranks other than 0: the first of ``keys`` to exist (no deadline: rank 0's heartbeat
    bounds it), answering meanwhile rank 0's request for this rank's collective counts after
    its last test (:func:`check_collectives`)."""
    assert plugin.channel is not None
    while True:
        asked = [count_key(plugin.last_index)] if plugin.last_index >= 0 else []
        found = plugin.channel.wait_any([*keys, *asked], None, watch_rank0=True)
        assert found is not None
        if found not in asked:
            return found
        answer_count(plugin, plugin.last_index)
        plugin.last_index = -1


def count_key(index: int) -> str:
    """Rank 0's request for every rank's collective counts after test ``index``."""
    return f"count/{index}"


def _flight_recorder() -> list[dict[str, Any]] | None:
    """The flight recorder's entries (tens of ms); None when it is off or unavailable."""
    if os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip() == "0":
        return None
    try:
        raw = _compat.dump_flight_recorder()
        entries = pickle.loads(raw).get("entries", [])
    except Exception:
        return None
    return list(entries)


def flight_mark() -> int:
    """The flight recorder's last record id, taken when the rank creates its group."""
    entries = _flight_recorder() or []
    return max((int(e.get("record_id", -1)) for e in entries), default=-1)


def collective_counts(mark: int) -> dict[str, tuple[int, str]] | None:
    """Collectives issued per live group since the group was created (record id > ``mark``).

    :func:`worker.collective_counts` without the records of earlier groups: a group created
    anew here gets the old one's name (the default group is "0" again), and its records stay in
    the recorder.
    """
    entries = _flight_recorder()
    if entries is None:
        return None
    last: dict[str, tuple[int, str]] = {}
    for entry in entries:
        if entry.get("is_p2p") or int(entry.get("record_id", -1)) <= mark:
            continue
        name = str(entry.get("process_group", ("?",))[0])
        last[name] = (int(entry.get("collective_seq_id", 0)), str(entry.get("profiling_name")))
    return {group_words(pg): last.get(str(pg.group_name), (0, "")) for pg in live_groups()}


def answer_count(plugin: LaunchPlugin, index: int) -> None:
    """A rank other than 0: rank 0 asked for this rank's collective counts after ``index``."""
    assert plugin.channel is not None
    counts = collective_counts(plugin.flight_mark)
    plugin.channel.put(f"counts/{index}/{plugin.rank}", {"counts": counts})


def count_collectives(
    plugin: LaunchPlugin, index: int, wait: float
) -> dict[int, dict[str, tuple[int, str]]] | None:
    """Rank 0: every rank's collectives per group after test ``index``, from the flight recorder;
    None when a rank's recorder is off or a rank did not answer within ``wait`` seconds."""
    channel = plugin.channel
    assert channel is not None
    own = collective_counts(plugin.flight_mark)
    if own is None:
        return None
    counts: dict[int, dict[str, tuple[int, str]]] = {0: own}
    try:
        channel.put(count_key(index), 1)
        end = time.monotonic() + wait
        for rank in range(1, plugin.world_size):
            key = f"counts/{index}/{rank}"
            if channel.wait_any([key], end) is None:
                return None
            answer = channel.take(key)["counts"]
            if answer is None:
                return None
            counts[rank] = {str(g): (int(n), str(op)) for g, (n, op) in answer.items()}
    except ChannelError:
        return None
    return counts


def check_collectives(
    plugin: LaunchPlugin, cur: Current, per_rank: dict[int, list[TestReport]]
) -> bool:
    """Rank 0, after a test that every rank finished with its group intact: did the members of
    each group issue the same collectives? Returns False when the group must be created anew.

    As in pool mode (:mod:`fitness`): sequence numbers first (sent with every rank's last
    reports), the flight recorder only when they differ (a second round through the control
    store, :func:`count_collectives`); the rank with more collectives fails the test.
    """
    if sequences_in_step(cur.sequences, plugin.sequence_base):
        plugin.sequence_base = dict(cur.sequences)
        return True
    item = cur.item
    counts = count_collectives(plugin, cur.index, COUNT_WAIT)
    if counts is None:
        plugin.notes.append(
            f"process group created anew after {item.nodeid}: the sequence numbers of a group "
            "differ between ranks (point-to-point ops, or a collective only some ranks issued) "
            "and the flight recorder could not tell which (TORCH_FR_BUFFER_SIZE=0?)"
        )
        return False
    test = RunTest(cur.index, item.nodeid, None, "")
    found = unmatched_collectives(counts, plugin.world_size, test, item.location)
    for rank, report, _ in found:
        more = (
            "A collective that not every member of the group issues stays pending and would be "
            f"matched by the next test's collective. {FRESH_GROUP}"
        )
        per_rank.setdefault(rank, []).append(relabel(report, rank, plugin.world_size, more))
    if found:
        return False
    plugin.sequence_base = dict(cur.sequences)
    return True
